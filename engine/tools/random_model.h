// A Llama-family model with random weights, from the architecture alone: speed measurements
// (cuda_bench) of shapes whose weights are not on the machine, e.g. Llama-3.1-8B on a GPU.
#ifndef RIDGESERVE_ENGINE_TOOLS_RANDOM_MODEL_H_
#define RIDGESERVE_ENGINE_TOOLS_RANDOM_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "kernels/backend.h"

namespace ridgeserve {

// The architecture of `config_path` (a Hugging Face config.json or directory, or a GGUF file:
// ReadModelConfig) on `backend` with bf16 weights drawn uniformly in ±sqrt(3 / in) (so each
// projection keeps its input's scale) and norms of 1: every matrix of one shape shares one
// buffer, so the host holds one layer's worth and the embedding. No tokenizer.
absl::StatusOr<std::unique_ptr<Model>> RandomModel(const std::string& config_path, Backend& backend,
                                                   uint64_t seed);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_RANDOM_MODEL_H_
