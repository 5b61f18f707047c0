// Loading a model from disk: a GGUF file, or a Hugging Face directory with config.json,
// *.safetensors and tokenizer.json. Phases: open → hparams → tokenizer → weights.
#ifndef RIDGESERVE_ENGINE_MODEL_MODEL_H_
#define RIDGESERVE_ENGINE_MODEL_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct Model {
  std::string path;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LlamaModel> llama;
};

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, Backend& backend);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_MODEL_H_
