// Backend::Sample's plain-data row description and result (kernels/sample.h defines the draw),
// in a header of its own so device code (C++17) includes it too.
#ifndef RIDGESERVE_KERNELS_SAMPLE_SPEC_H_
#define RIDGESERVE_KERNELS_SAMPLE_SPEC_H_

#include <cstdint>

namespace ridgeserve {

// One row to draw from. Plain data: it is uploaded to a device as is.
struct SampleSpec {
  int32_t row = 0;  // the logits row
  float temperature = 1.0f;
  int32_t top_k = 0;  // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  // Ids [penalty_begin, penalty_end) of the call's penalty list (duplicates and ids outside the
  // vocabulary allowed; unused when repetition_penalty is 1).
  int32_t penalty_begin = 0;
  int32_t penalty_end = 0;
  uint64_t seed = 0;
  uint64_t draw = 0;    // this row's index in its request's sequence of draws
  int32_t logprob = 0;  // nonzero: compute SampledToken::logprob
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;  // 0 unless asked for
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_SAMPLE_SPEC_H_
