// The draft model of SpecPC / SpecKV (DESIGN.md, "SpecPC and SpecKV"): a small model that
// shares the target's tokenizer. `--draft_model PATH` loads one from its own files;
// `--draft_model self:K` is the target's first K layers with its final norm and LM head,
// sharing the target's weights (no extra weight memory).
#ifndef RIDGESERVE_ENGINE_DRAFT_DRAFT_MODEL_H_
#define RIDGESERVE_ENGINE_DRAFT_DRAFT_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/llama.h"
#include "engine/model/model.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct DraftModel {
  std::string name;              // "self:K" or the draft's path
  LlamaModel* llama = nullptr;   // runs the draft (the target's own model for self:K)
  int32_t num_layers = 0;        // layers the draft runs (ForwardBatch::num_layers)
  std::unique_ptr<Model> owned;  // a draft loaded from its own files; null for self:K

  const ModelConfig& config() const { return llama->config(); }
};

// `spec` is "self:K" (1 <= K < the target's layers) or a model path (GGUF file or Hugging
// Face directory), loaded on `backend`. InvalidArgument naming the spec, or the draft's path
// and the first difference, when K is out of range or the draft's vocabulary (every token's
// bytes) or special tokens (BOS, EOS, end-of-generation ids, which ids are special) differ from
// the target's; a load error names the file as LoadModel does.
absl::StatusOr<std::unique_ptr<DraftModel>> LoadDraftModel(const std::string& spec,
                                                           const Model& target, Backend& backend);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_DRAFT_DRAFT_MODEL_H_
