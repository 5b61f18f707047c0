#include "engine/model/weights.h"

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"

namespace ridgeserve {
namespace {

enum class Role {
  kEmbedding,
  kOutputNorm,
  kLmHead,
  kAttnNorm,
  kQ,
  kK,
  kV,
  kQBias,
  kKBias,
  kVBias,
  kQNorm,
  kKNorm,
  kO,
  kFfnNorm,
  kGate,
  kUp,
  kDown,
};

std::string TensorName(TensorNaming naming, Role role, int layer) {
  const bool gguf = naming == TensorNaming::kGguf;
  const std::string blk =
      gguf ? absl::StrCat("blk.", layer, ".") : absl::StrCat("model.layers.", layer, ".");
  switch (role) {
    case Role::kEmbedding:
      return gguf ? "token_embd.weight" : "model.embed_tokens.weight";
    case Role::kOutputNorm:
      return gguf ? "output_norm.weight" : "model.norm.weight";
    case Role::kLmHead:
      return gguf ? "output.weight" : "lm_head.weight";
    case Role::kAttnNorm:
      return blk + (gguf ? "attn_norm.weight" : "input_layernorm.weight");
    case Role::kQ:
      return blk + (gguf ? "attn_q.weight" : "self_attn.q_proj.weight");
    case Role::kK:
      return blk + (gguf ? "attn_k.weight" : "self_attn.k_proj.weight");
    case Role::kV:
      return blk + (gguf ? "attn_v.weight" : "self_attn.v_proj.weight");
    case Role::kQBias:
      return blk + (gguf ? "attn_q.bias" : "self_attn.q_proj.bias");
    case Role::kKBias:
      return blk + (gguf ? "attn_k.bias" : "self_attn.k_proj.bias");
    case Role::kVBias:
      return blk + (gguf ? "attn_v.bias" : "self_attn.v_proj.bias");
    case Role::kQNorm:
      return blk + (gguf ? "attn_q_norm.weight" : "self_attn.q_norm.weight");
    case Role::kKNorm:
      return blk + (gguf ? "attn_k_norm.weight" : "self_attn.k_norm.weight");
    case Role::kO:
      return blk + (gguf ? "attn_output.weight" : "self_attn.o_proj.weight");
    case Role::kFfnNorm:
      return blk + (gguf ? "ffn_norm.weight" : "post_attention_layernorm.weight");
    case Role::kGate:
      return blk + (gguf ? "ffn_gate.weight" : "mlp.gate_proj.weight");
    case Role::kUp:
      return blk + (gguf ? "ffn_up.weight" : "mlp.up_proj.weight");
    case Role::kDown:
      return blk + (gguf ? "ffn_down.weight" : "mlp.down_proj.weight");
  }
  return "";
}

// llama.cpp's converter reorders each head's Q/K rows from half-split to interleaved pairs:
// GGUF row 2j + half holds HF row half * head_dim / 2 + j. Undo it so one RoPE layout serves
// every file. Works for weights ([rows, cols]) and biases (cols = 1).
std::vector<float> UnpermuteRows(const std::vector<float>& gguf, int32_t head_dim, int64_t cols) {
  std::vector<float> hf(gguf.size());
  const int64_t rows = static_cast<int64_t>(gguf.size()) / cols;
  const int32_t half_dim = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = r / head_dim;
    const int64_t within = r % head_dim;
    const int64_t j = within / 2;
    const int64_t half = within % 2;
    const int64_t dst = head * head_dim + half * half_dim + j;
    std::memcpy(&hf[dst * cols], &gguf[r * cols], sizeof(float) * cols);
  }
  return hf;
}

class Loader {
 public:
  Loader(const TensorSource& source, TensorNaming naming, const ModelConfig& config,
         Backend& backend)
      : source_(source), naming_(naming), config_(config), backend_(backend) {}

  // The tensor as f32 with its shape checked against `shape` (outermost first).
  absl::StatusOr<std::vector<float>> Read(Role role, int layer, std::vector<int64_t> shape) {
    const std::string name = TensorName(naming_, role, layer);
    const TensorInfo* info = source_.FindTensor(name);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat(source_.path(), ": tensors: missing ", name));
    }
    if (info->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_.path(), ": tensors: ", name, " has shape [", absl::StrJoin(info->shape, ", "),
          "], expected [", absl::StrJoin(shape, ", "), "]"));
    }
    auto data = source_.ReadF32(*info);
    if (!data.ok()) return data.status();
    if (PermutedQk() &&
        (role == Role::kQ || role == Role::kK || role == Role::kQBias || role == Role::kKBias)) {
      return UnpermuteRows(*data, config_.head_dim, shape.size() == 2 ? shape[1] : 1);
    }
    return data;
  }

  DeviceBuffer Upload(const std::vector<float>& host) {
    DeviceBuffer buffer = backend_.Alloc(sizeof(float) * host.size());
    backend_.CopyToDevice(buffer.as<void>(), host.data(), sizeof(float) * host.size());
    return buffer;
  }

  // Reads tensors and uploads them concatenated along rows.
  absl::StatusOr<DeviceBuffer> UploadConcat(
      int layer, std::initializer_list<std::pair<Role, std::vector<int64_t>>> parts) {
    std::vector<float> all;
    for (const auto& [role, shape] : parts) {
      auto part = Read(role, layer, shape);
      if (!part.ok()) return part.status();
      all.insert(all.end(), part->begin(), part->end());
    }
    return Upload(all);
  }

 private:
  bool PermutedQk() const {
    return naming_ == TensorNaming::kGguf &&
           (config_.arch == Architecture::kLlama || config_.arch == Architecture::kMistral);
  }

  const TensorSource& source_;
  TensorNaming naming_;
  const ModelConfig& config_;
  Backend& backend_;
};

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(const TensorSource& source, TensorNaming naming,
                                         const ModelConfig& config, Backend& backend) {
  Loader loader(source, naming, config, backend);
  const int64_t h = config.hidden, q = config.q_dim(), kv = config.kv_dim(), ff = config.ffn,
                vocab = config.vocab_size, hd = config.head_dim;
  ModelWeights w;
  auto single = [&](Role role, int layer, std::vector<int64_t> shape,
                    DeviceBuffer& out) -> absl::Status {
    RS_ASSIGN_OR_RETURN(out, loader.UploadConcat(layer, {{role, std::move(shape)}}));
    return absl::OkStatus();
  };
  RS_RETURN_IF_ERROR(single(Role::kEmbedding, 0, {vocab, h}, w.token_embd));
  RS_RETURN_IF_ERROR(single(Role::kOutputNorm, 0, {h}, w.output_norm));
  if (!config.tied_embeddings) RS_RETURN_IF_ERROR(single(Role::kLmHead, 0, {vocab, h}, w.lm_head));
  w.rope_inv_freq = loader.Upload(config.rope_inv_freq);
  w.layers.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    RS_RETURN_IF_ERROR(single(Role::kAttnNorm, l, {h}, lw.attn_norm));
    RS_ASSIGN_OR_RETURN(
        lw.wqkv,
        loader.UploadConcat(l, {{Role::kQ, {q, h}}, {Role::kK, {kv, h}}, {Role::kV, {kv, h}}}));
    if (config.qkv_bias) {
      RS_ASSIGN_OR_RETURN(
          lw.bqkv, loader.UploadConcat(
                       l, {{Role::kQBias, {q}}, {Role::kKBias, {kv}}, {Role::kVBias, {kv}}}));
    }
    if (config.qk_norm) {
      RS_RETURN_IF_ERROR(single(Role::kQNorm, l, {hd}, lw.q_norm));
      RS_RETURN_IF_ERROR(single(Role::kKNorm, l, {hd}, lw.k_norm));
    }
    RS_RETURN_IF_ERROR(single(Role::kO, l, {h, q}, lw.wo));
    RS_RETURN_IF_ERROR(single(Role::kFfnNorm, l, {h}, lw.ffn_norm));
    RS_ASSIGN_OR_RETURN(lw.w_gate_up,
                        loader.UploadConcat(l, {{Role::kGate, {ff, h}}, {Role::kUp, {ff, h}}}));
    RS_RETURN_IF_ERROR(single(Role::kDown, l, {h, ff}, lw.w_down));
  }
  return w;
}

}  // namespace ridgeserve
