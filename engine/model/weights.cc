#include "engine/model/weights.h"

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"
#include "kernels/dtype.h"

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
// every file. Rows are `row_bytes` of any type (whole rows of blocks for quantized weights,
// one f32 for a bias).
std::vector<uint8_t> UnpermuteRows(const uint8_t* gguf, int64_t rows, size_t row_bytes,
                                   int32_t head_dim) {
  std::vector<uint8_t> hf(static_cast<size_t>(rows) * row_bytes);
  const int32_t half_dim = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = r / head_dim;
    const int64_t within = r % head_dim;
    const int64_t j = within / 2;
    const int64_t half = within % 2;
    const int64_t dst = head * head_dim + half * half_dim + j;
    std::memcpy(&hf[dst * row_bytes], gguf + r * row_bytes, row_bytes);
  }
  return hf;
}

class Loader {
 public:
  Loader(const TensorSource& source, TensorNaming naming, const ModelConfig& config,
         Backend& backend)
      : source_(source), naming_(naming), config_(config), backend_(backend) {}

  // The tensor with its shape checked against `shape` (outermost first).
  absl::StatusOr<const TensorInfo*> Find(Role role, int layer, const std::vector<int64_t>& shape) {
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
    return info;
  }

  bool Permuted(Role role) const {
    return PermutedQk() &&
           (role == Role::kQ || role == Role::kK || role == Role::kQBias || role == Role::kKBias);
  }

  // Reads 1-D tensors as f32 and uploads them concatenated.
  absl::StatusOr<DeviceBuffer> UploadVectors(
      int layer, std::initializer_list<std::pair<Role, int64_t>> parts) {
    std::vector<float> all;
    for (const auto& [role, size] : parts) {
      RS_ASSIGN_OR_RETURN(const TensorInfo* info, Find(role, layer, {size}));
      RS_ASSIGN_OR_RETURN(std::vector<float> part, source_.ReadF32(*info));
      if (Permuted(role)) {
        const std::vector<uint8_t> hf = UnpermuteRows(reinterpret_cast<const uint8_t*>(part.data()),
                                                      size, sizeof(float), config_.head_dim);
        std::memcpy(part.data(), hf.data(), hf.size());
      }
      all.insert(all.end(), part.begin(), part.end());
    }
    return Upload(all);
  }

  absl::StatusOr<DeviceBuffer> Upload(const std::vector<float>& host) {
    RS_ASSIGN_OR_RETURN(DeviceBuffer buffer, backend_.Alloc(sizeof(float) * host.size()));
    backend_.CopyToDevice(buffer.as<void>(), host.data(), sizeof(float) * host.size());
    return buffer;
  }

  // Packs 2-D tensors [rows_i, cols] stacked along rows as one weight, from their stored rows
  // (no conversion here: the backend decides what it keeps).
  absl::StatusOr<Weight> PackMatrix(
      int layer, std::initializer_list<std::pair<Role, std::vector<int64_t>>> parts) {
    std::vector<HostTensor> views;
    std::vector<std::vector<uint8_t>> unpermuted;  // Q/K rows in HF order, alive until packed
    unpermuted.reserve(parts.size());
    for (const auto& [role, shape] : parts) {
      RS_ASSIGN_OR_RETURN(const TensorInfo* info, Find(role, layer, shape));
      absl::StatusOr<size_t> row_bytes = StorageBytes(info->type, shape[1]);
      if (!row_bytes.ok() || info->data == nullptr ||
          *row_bytes * static_cast<size_t>(shape[0]) != info->num_bytes) {
        const absl::StatusOr<TypeTraits> traits = GetTypeTraits(info->type);
        return absl::InvalidArgumentError(absl::StrCat(
            source_.path(), ": tensors: ", info->name, " of type ",
            traits.ok() ? std::string(traits->name) : "?", " cannot hold rows of ", shape[1],
            row_bytes.ok() ? "" : absl::StrCat(": ", row_bytes.status().message())));
      }
      const uint8_t* data = info->data;
      if (Permuted(role)) {
        unpermuted.push_back(UnpermuteRows(data, shape[0], *row_bytes, config_.head_dim));
        data = unpermuted.back().data();
      }
      views.push_back(HostTensor{data, info->type, shape[0], shape[1], *row_bytes});
    }
    absl::StatusOr<Weight> weight = backend_.PackWeight(views);
    if (!weight.ok()) {
      return absl::Status(weight.status().code(),
                          absl::StrCat(source_.path(), ": tensors: ",
                                       TensorName(naming_, parts.begin()->first, layer), ": ",
                                       weight.status().message()));
    }
    return weight;
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
  RS_ASSIGN_OR_RETURN(w.token_embd, loader.PackMatrix(0, {{Role::kEmbedding, {vocab, h}}}));
  RS_ASSIGN_OR_RETURN(w.output_norm, loader.UploadVectors(0, {{Role::kOutputNorm, h}}));
  if (!config.tied_embeddings) {
    RS_ASSIGN_OR_RETURN(w.lm_head, loader.PackMatrix(0, {{Role::kLmHead, {vocab, h}}}));
  }
  RS_ASSIGN_OR_RETURN(w.rope_inv_freq, loader.Upload(config.rope_inv_freq));
  w.layers.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    RS_ASSIGN_OR_RETURN(lw.attn_norm, loader.UploadVectors(l, {{Role::kAttnNorm, h}}));
    RS_ASSIGN_OR_RETURN(
        lw.wqkv,
        loader.PackMatrix(l, {{Role::kQ, {q, h}}, {Role::kK, {kv, h}}, {Role::kV, {kv, h}}}));
    if (config.qkv_bias) {
      RS_ASSIGN_OR_RETURN(
          lw.bqkv,
          loader.UploadVectors(l, {{Role::kQBias, q}, {Role::kKBias, kv}, {Role::kVBias, kv}}));
    }
    if (config.qk_norm) {
      RS_ASSIGN_OR_RETURN(lw.q_norm, loader.UploadVectors(l, {{Role::kQNorm, hd}}));
      RS_ASSIGN_OR_RETURN(lw.k_norm, loader.UploadVectors(l, {{Role::kKNorm, hd}}));
    }
    RS_ASSIGN_OR_RETURN(lw.wo, loader.PackMatrix(l, {{Role::kO, {h, q}}}));
    RS_ASSIGN_OR_RETURN(lw.ffn_norm, loader.UploadVectors(l, {{Role::kFfnNorm, h}}));
    RS_ASSIGN_OR_RETURN(lw.w_gate_up,
                        loader.PackMatrix(l, {{Role::kGate, {ff, h}}, {Role::kUp, {ff, h}}}));
    RS_ASSIGN_OR_RETURN(lw.w_down, loader.PackMatrix(l, {{Role::kDown, {h, ff}}}));
  }
  return w;
}

size_t ModelWeights::resident_bytes() const {
  size_t total = token_embd.bytes() + output_norm.bytes() + lm_head.bytes() + rope_inv_freq.bytes();
  for (const LayerWeights& l : layers) {
    for (const DeviceBuffer* b : {&l.attn_norm, &l.bqkv, &l.q_norm, &l.k_norm, &l.ffn_norm}) {
      total += b->bytes();
    }
    for (const Weight* m : {&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down}) total += m->bytes();
  }
  return total;
}

}  // namespace ridgeserve
