// Token counts drawn per request: `fixed:N`, `uniform:A:B` (inclusive) or `list:a,b,c`
// (each value equally likely). A bare number means `fixed:N`.
#ifndef RIDGESERVE_LOADTEST_LENGTH_DISTRIBUTION_H_
#define RIDGESERVE_LOADTEST_LENGTH_DISTRIBUTION_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve::loadtest {

class LengthDistribution {
 public:
  // InvalidArgument naming `flag` for a malformed spec or a value below `min_value`.
  static absl::StatusOr<LengthDistribution> Parse(const std::string& flag, const std::string& spec,
                                                  int32_t min_value);

  int32_t Sample(std::mt19937_64& rng) const;
  int32_t Max() const;
  // The spec in canonical form ("uniform:32:64").
  std::string ToString() const;

 private:
  enum class Kind { kFixed, kUniform, kList };
  LengthDistribution(Kind kind, std::vector<int32_t> values)
      : kind_(kind), values_(std::move(values)) {}

  Kind kind_;
  std::vector<int32_t> values_;  // fixed: {N}; uniform: {A, B}; list: the values
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_LENGTH_DISTRIBUTION_H_
