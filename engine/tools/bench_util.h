// What the speed tools (ridgeserve-eval's bench-* and ttft, cuda_bench) share: random prompts,
// a prefill's model FLOPs, and greedy decode of several sequences together without the serving
// engine.
#ifndef RIDGESERVE_ENGINE_TOOLS_BENCH_UTIL_H_
#define RIDGESERVE_ENGINE_TOOLS_BENCH_UTIL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama.h"

namespace ridgeserve {

// `n` token ids drawn uniformly from [256, vocab) by mt19937(seed): content does not change the
// cost, and a fixed seed keeps runs comparable.
std::vector<int32_t> RandomTokenIds(int32_t n, int32_t vocab, uint32_t seed);

// Model FLOPs (multiply-adds x 2) of a prefill of `n` rows: the layers' projections, causal
// attention (QKᵀ and PV over the n(n+1)/2 pairs) and the last row's LM head.
double PrefillFlops(const ModelConfig& c, double n);

// Greedy decode of several sequences together, one forward pass per step (as the engine batches
// decode rows). Each of `streams` sequences prefills `prompt_tokens` random tokens
// (RandomTokenIds from `seed` + its index) in its own untimed forward pass; then, after one
// untimed step of all of them together (a model on decode graphs records then), `steps` such
// steps are timed, each row's next token its logits' argmax drawn on the backend
// (LlamaModel::SampleLogits, as the engine draws). Returns those steps' seconds.
absl::StatusOr<double> TimeBatchedDecode(LlamaModel& model, int32_t streams, int32_t prompt_tokens,
                                         int32_t steps, uint32_t seed);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_BENCH_UTIL_H_
