// Greedy decode of several sequences together, one forward pass per step (as the engine batches
// decode rows), without the serving engine: the decode benchmarks of ridgeserve-eval
// (bench-decode) and cuda_bench.
#ifndef RIDGESERVE_ENGINE_TOOLS_BATCHED_DECODE_H_
#define RIDGESERVE_ENGINE_TOOLS_BATCHED_DECODE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/llama.h"

namespace ridgeserve {

// Each of `streams` sequences prefills `prompt_tokens` random tokens (ids from 256 on, from
// `seed`) in its own untimed forward pass; then `steps` steps of all of them together are
// timed, each row's next token the argmax of its logits. Returns those steps' seconds.
absl::StatusOr<double> TimeBatchedDecode(LlamaModel& model, int32_t streams, int32_t prompt_tokens,
                                         int32_t steps, uint32_t seed);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_BATCHED_DECODE_H_
