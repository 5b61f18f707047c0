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

// Elements [begin, begin + count) of a dimension; count < 0 selects all of it.
struct Range {
  int64_t begin = 0;
  int64_t count = -1;
};
struct VectorPart {
  Role role;
  int64_t size;  // the tensor's length
  Range range;
};
struct MatrixPart {
  Role role;
  std::vector<int64_t> shape;  // the tensor's [rows, cols]
  Range rows;
  Range cols;
};

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

  // Reads 1-D tensors as f32 and uploads the selected elements of each, concatenated.
  absl::StatusOr<DeviceBuffer> UploadVectors(int layer, std::initializer_list<VectorPart> parts) {
    std::vector<float> all;
    for (const VectorPart& p : parts) {
      RS_ASSIGN_OR_RETURN(const TensorInfo* info, Find(p.role, layer, {p.size}));
      RS_ASSIGN_OR_RETURN(std::vector<float> part, source_.ReadF32(*info));
      if (Permuted(p.role)) {
        const std::vector<uint8_t> hf = UnpermuteRows(reinterpret_cast<const uint8_t*>(part.data()),
                                                      p.size, sizeof(float), config_.head_dim);
        std::memcpy(part.data(), hf.data(), hf.size());
      }
      const Range r = p.range.count < 0 ? Range{0, p.size} : p.range;
      all.insert(all.end(), part.begin() + r.begin, part.begin() + r.begin + r.count);
    }
    return Upload(all);
  }

  absl::StatusOr<DeviceBuffer> Upload(const std::vector<float>& host) {
    RS_ASSIGN_OR_RETURN(DeviceBuffer buffer, backend_.Alloc(sizeof(float) * host.size()));
    backend_.CopyToDevice(buffer.as<void>(), host.data(), sizeof(float) * host.size());
    return buffer;
  }

  // Packs the selected rows and columns of 2-D tensors [rows_i, cols] stacked along rows as
  // one weight, from their stored rows (no conversion here: the backend decides what it
  // keeps). Only the selected part of an mmapped file is read.
  absl::StatusOr<Weight> PackMatrix(int layer, std::initializer_list<MatrixPart> parts) {
    std::vector<HostTensor> views;
    std::vector<std::vector<uint8_t>> unpermuted;  // Q/K rows in HF order, alive until packed
    unpermuted.reserve(parts.size());
    for (const MatrixPart& p : parts) {
      RS_ASSIGN_OR_RETURN(const TensorInfo* info, Find(p.role, layer, p.shape));
      absl::StatusOr<size_t> row_bytes = StorageBytes(info->type, p.shape[1]);
      if (!row_bytes.ok() || info->data == nullptr ||
          *row_bytes * static_cast<size_t>(p.shape[0]) != info->num_bytes) {
        const absl::StatusOr<TypeTraits> traits = GetTypeTraits(info->type);
        return absl::InvalidArgumentError(absl::StrCat(
            source_.path(), ": tensors: ", info->name, " of type ",
            traits.ok() ? std::string(traits->name) : "?", " cannot hold rows of ", p.shape[1],
            row_bytes.ok() ? "" : absl::StrCat(": ", row_bytes.status().message())));
      }
      HostTensor view{info->data, info->type, p.shape[0], p.shape[1], *row_bytes};
      if (p.rows.count >= 0) view = view.Rows(p.rows.begin, p.rows.count);
      if (Permuted(p.role)) {
        // The permutation stays within a head, and row slices are whole heads.
        unpermuted.push_back(UnpermuteRows(view.data, view.rows, view.row_bytes, config_.head_dim));
        view.data = unpermuted.back().data();
      }
      if (p.cols.count >= 0) {
        absl::StatusOr<HostTensor> cols = view.Cols(p.cols.begin, p.cols.count);
        if (!cols.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(source_.path(), ": tensors: ", info->name,
                           ": tensor-parallel slice: ", cols.status().message()));
        }
        view = *cols;
      }
      views.push_back(view);
    }
    absl::StatusOr<Weight> weight = backend_.PackWeight(views);
    if (!weight.ok()) {
      return absl::Status(weight.status().code(),
                          absl::StrCat(source_.path(), ": tensors: ",
                                       TensorName(naming_, parts.begin()->role, layer), ": ",
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
                                         const ModelConfig& config, const ShardLayout& shard,
                                         Backend& backend) {
  Loader loader(source, naming, config, backend);
  const int64_t h = config.hidden, q = config.q_dim(), kv = config.kv_dim(), ff = config.ffn,
                vocab = config.vocab_size, hd = config.head_dim;
  // The rank's slices (everything at TP=1): heads, MLP features, vocabulary rows.
  const Range q_rows{shard.q_head_begin * hd, shard.num_heads * hd};
  const Range kv_rows{shard.kv_head_begin * hd, shard.num_kv_heads * hd};
  const Range ff_rows{shard.ffn_begin, shard.ffn};
  const Range vocab_rows{shard.vocab_begin, shard.vocab};
  const Range all;
  ModelWeights w;
  RS_ASSIGN_OR_RETURN(w.token_embd,
                      loader.PackMatrix(0, {{Role::kEmbedding, {vocab, h}, vocab_rows, all}}));
  RS_ASSIGN_OR_RETURN(w.output_norm, loader.UploadVectors(0, {{Role::kOutputNorm, h, all}}));
  if (!config.tied_embeddings) {
    RS_ASSIGN_OR_RETURN(w.lm_head,
                        loader.PackMatrix(0, {{Role::kLmHead, {vocab, h}, vocab_rows, all}}));
  }
  RS_ASSIGN_OR_RETURN(w.rope_inv_freq, loader.Upload(config.rope_inv_freq));
  w.layers.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    RS_ASSIGN_OR_RETURN(lw.attn_norm, loader.UploadVectors(l, {{Role::kAttnNorm, h, all}}));
    RS_ASSIGN_OR_RETURN(lw.wqkv, loader.PackMatrix(l, {{Role::kQ, {q, h}, q_rows, all},
                                                       {Role::kK, {kv, h}, kv_rows, all},
                                                       {Role::kV, {kv, h}, kv_rows, all}}));
    if (config.qkv_bias) {
      RS_ASSIGN_OR_RETURN(lw.bqkv, loader.UploadVectors(l, {{Role::kQBias, q, q_rows},
                                                            {Role::kKBias, kv, kv_rows},
                                                            {Role::kVBias, kv, kv_rows}}));
    }
    if (config.qk_norm) {
      RS_ASSIGN_OR_RETURN(lw.q_norm, loader.UploadVectors(l, {{Role::kQNorm, hd, all}}));
      RS_ASSIGN_OR_RETURN(lw.k_norm, loader.UploadVectors(l, {{Role::kKNorm, hd, all}}));
    }
    RS_ASSIGN_OR_RETURN(lw.wo, loader.PackMatrix(l, {{Role::kO, {h, q}, all, q_rows}}));
    RS_ASSIGN_OR_RETURN(lw.ffn_norm, loader.UploadVectors(l, {{Role::kFfnNorm, h, all}}));
    RS_ASSIGN_OR_RETURN(lw.w_gate_up, loader.PackMatrix(l, {{Role::kGate, {ff, h}, ff_rows, all},
                                                            {Role::kUp, {ff, h}, ff_rows, all}}));
    RS_ASSIGN_OR_RETURN(lw.w_down, loader.PackMatrix(l, {{Role::kDown, {h, ff}, all, ff_rows}}));
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
