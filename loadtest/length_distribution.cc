#include "loadtest/length_distribution.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ridgeserve::loadtest {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseInts(const std::string& flag, absl::string_view text,
                                               char separator, int32_t min_value) {
  std::vector<int32_t> values;
  for (absl::string_view item : absl::StrSplit(text, separator)) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", item, "\" is not an integer"));
    }
    if (v < min_value) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": ", v, " is below the minimum ", min_value));
    }
    values.push_back(v);
  }
  return values;
}

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(const std::string& flag,
                                                             const std::string& spec,
                                                             int32_t min_value) {
  absl::string_view rest = spec;
  const auto usage = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": \"", spec, "\" is not fixed:N, uniform:A:B, list:a,b,c or a number"));
  };
  if (absl::ConsumePrefix(&rest, "uniform:")) {
    absl::StatusOr<std::vector<int32_t>> v = ParseInts(flag, rest, ':', min_value);
    if (!v.ok()) return v.status();
    if (v->size() != 2) return usage();
    if ((*v)[0] > (*v)[1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": uniform:A:B needs A <= B, got \"", spec, "\""));
    }
    return LengthDistribution(Kind::kUniform, *std::move(v));
  }
  Kind kind = Kind::kFixed;
  char separator = ':';
  if (absl::ConsumePrefix(&rest, "list:")) {
    kind = Kind::kList;
    separator = ',';
  } else {
    absl::ConsumePrefix(&rest, "fixed:");
  }
  if (rest.empty()) return usage();
  absl::StatusOr<std::vector<int32_t>> v = ParseInts(flag, rest, separator, min_value);
  if (!v.ok()) return v.status();
  if (kind == Kind::kFixed && v->size() != 1) return usage();
  return LengthDistribution(kind, *std::move(v));
}

int32_t LengthDistribution::Sample(std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kFixed:
      return values_[0];
    case Kind::kUniform:
      return std::uniform_int_distribution<int32_t>(values_[0], values_[1])(rng);
    case Kind::kList:
      return values_[std::uniform_int_distribution<size_t>(0, values_.size() - 1)(rng)];
  }
  return values_[0];
}

int32_t LengthDistribution::Max() const {
  return *std::max_element(values_.begin(), values_.end());
}

std::string LengthDistribution::ToString() const {
  switch (kind_) {
    case Kind::kFixed:
      return absl::StrCat("fixed:", values_[0]);
    case Kind::kUniform:
      return absl::StrCat("uniform:", values_[0], ":", values_[1]);
    case Kind::kList:
      return absl::StrCat("list:", absl::StrJoin(values_, ","));
  }
  return "";
}

}  // namespace ridgeserve::loadtest
