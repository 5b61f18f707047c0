#include "engine/model/model.h"

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf.h"
#include "engine/model/safetensors.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

std::vector<LlamaModel*> Model::rank_models() const {
  std::vector<LlamaModel*> out;
  for (const std::unique_ptr<LlamaModel>& r : ranks) out.push_back(r.get());
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, Backend& backend) {
  Backend* const one[] = {&backend};
  return LoadModel(path, one, {});
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path,
                                                 std::span<Backend* const> backends,
                                                 std::span<Communicator* const> comms) {
  const int32_t size = static_cast<int32_t>(backends.size());
  if (size > 1 && comms.size() != backends.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel ", size, " needs ", size,
                                                   " communicators, got ", comms.size()));
  }
  auto model = std::make_unique<Model>();
  model->path = path;
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path, ec);
  std::unique_ptr<TensorSource> source;
  TensorNaming naming;
  if (is_dir) {
    spdlog::info("loading Hugging Face model from {}", path);
    RS_ASSIGN_OR_RETURN(model->config, ConfigFromHfJson(path + "/config.json"));
    RS_ASSIGN_OR_RETURN(model->tokenizer, Tokenizer::FromHfDir(path));
    RS_ASSIGN_OR_RETURN(source, SafetensorsModel::Open(path));
    naming = TensorNaming::kHuggingFace;
  } else {
    spdlog::info("loading GGUF model from {}", path);
    RS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    std::vector<float> rope_factors;
    if (const TensorInfo* t = gguf->FindTensor("rope_freqs.weight"); t != nullptr) {
      RS_ASSIGN_OR_RETURN(rope_factors, gguf->ReadF32(*t));
    }
    RS_ASSIGN_OR_RETURN(model->config, ConfigFromGguf(*gguf, rope_factors));
    RS_ASSIGN_OR_RETURN(model->tokenizer, Tokenizer::FromGguf(*gguf));
    source = std::move(gguf);
    naming = TensorNaming::kGguf;
  }
  const ModelConfig& c = model->config;
  if (model->tokenizer->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tokenizer has ", model->tokenizer->vocab_size(),
                     " tokens but the embedding only ", c.vocab_size, " rows"));
  }
  spdlog::info("{} ({}): {} layers, hidden {}, heads {}/{}, head_dim {}, ffn {}, vocab {}, ctx {}",
               c.name, c.arch_name, c.num_layers, c.hidden, c.num_heads, c.num_kv_heads, c.head_dim,
               c.ffn, c.vocab_size, c.context_length);
  for (int32_t r = 0; r < size; ++r) {
    absl::StatusOr<ShardLayout> shard = PlanShard(c, r, size);
    if (!shard.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", shard.status().message()));
    }
    Backend& backend = *backends[r];
    RS_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(*source, naming, c, *shard, backend));
    spdlog::info("weights: {:.1f} MB resident on the {} backend{}", weights.resident_bytes() / 1e6,
                 backend.name(), size > 1 ? absl::StrCat(" (rank ", r, " of ", size, ")") : "");
    model->ranks.push_back(std::make_unique<LlamaModel>(c, std::move(weights), backend, *shard,
                                                        size > 1 ? comms[r] : nullptr));
  }
  model->llama = model->ranks.front().get();
  return model;
}

}  // namespace ridgeserve
