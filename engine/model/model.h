// Loading a model from disk: a GGUF file, or a Hugging Face directory with config.json,
// *.safetensors and tokenizer.json. Phases: open → hparams → tokenizer → weights.
#ifndef RIDGESERVE_ENGINE_MODEL_MODEL_H_
#define RIDGESERVE_ENGINE_MODEL_MODEL_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/parallel/communicator.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct Model {
  std::string path;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  // One LlamaModel per tensor-parallel rank (one at TP = 1); llama is ranks[0].
  std::vector<std::unique_ptr<LlamaModel>> ranks;
  LlamaModel* llama = nullptr;

  int32_t tensor_parallel() const { return static_cast<int32_t>(ranks.size()); }
  std::vector<LlamaModel*> rank_models() const;
};

// The whole model on one backend.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, Backend& backend);
// Sharded over backends.size() ranks (rank r on backends[r] with comms[r]): each rank reads
// only its slices of the file. InvalidArgument naming the numbers when the model cannot be
// split so (engine/model/shard.h).
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path,
                                                 std::span<Backend* const> backends,
                                                 std::span<Communicator* const> comms);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_MODEL_H_
