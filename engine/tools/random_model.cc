#include "engine/tools/random_model.h"

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/shard.h"
#include "engine/model/tensor_source.h"
#include "engine/model/weights.h"

namespace ridgeserve {
namespace {

// The tensors LoadWeights reads under Hugging Face names, with random contents.
class RandomSource final : public TensorSource {
 public:
  RandomSource(std::string path, const ModelConfig& c, uint64_t seed)
      : path_(std::move(path)), seed_(seed) {
    const int64_t h = c.hidden, q = c.num_heads * int64_t{c.head_dim},
                  kv = c.num_kv_heads * int64_t{c.head_dim};
    Matrix("model.embed_tokens.weight", c.vocab_size, h);
    if (!c.tied_embeddings) Matrix("lm_head.weight", c.vocab_size, h);
    Vector("model.norm.weight", h);
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const std::string blk = absl::StrCat("model.layers.", l, ".");
      Vector(blk + "input_layernorm.weight", h);
      Matrix(blk + "self_attn.q_proj.weight", q, h);
      Matrix(blk + "self_attn.k_proj.weight", kv, h);
      Matrix(blk + "self_attn.v_proj.weight", kv, h);
      if (c.qkv_bias) {
        Vector(blk + "self_attn.q_proj.bias", q, 0.0f);
        Vector(blk + "self_attn.k_proj.bias", kv, 0.0f);
        Vector(blk + "self_attn.v_proj.bias", kv, 0.0f);
      }
      if (c.qk_norm) {
        Vector(blk + "self_attn.q_norm.weight", c.head_dim);
        Vector(blk + "self_attn.k_norm.weight", c.head_dim);
      }
      Matrix(blk + "self_attn.o_proj.weight", h, q);
      Vector(blk + "post_attention_layernorm.weight", h);
      Matrix(blk + "mlp.gate_proj.weight", c.ffn, h);
      Matrix(blk + "mlp.up_proj.weight", c.ffn, h);
      Matrix(blk + "mlp.down_proj.weight", h, c.ffn);
    }
  }

  const std::string& path() const override { return path_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  absl::StatusOr<std::vector<float>> ReadF32(const TensorInfo& t) const override {
    std::vector<float> out(static_cast<size_t>(t.num_elements));
    RS_RETURN_IF_ERROR(DequantizeRow(t.type, t.data, t.num_elements, out.data()));
    return out;
  }

 private:
  // One shared buffer per (rows, cols).
  void Matrix(std::string name, int64_t rows, int64_t cols) {
    std::vector<uint8_t>& data = matrices_[{rows, cols}];
    if (data.empty()) {
      const int64_t n = rows * cols;
      const float scale = std::sqrt(3.0f / static_cast<float>(cols));
      std::vector<float> values(static_cast<size_t>(n));
      uint64_t state = seed_ ^ (static_cast<uint64_t>(rows) << 32 | static_cast<uint64_t>(cols));
      for (float& v : values) {
        // splitmix64, its top 24 bits as a uniform in [-1, 1)
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        v = scale * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
      }
      data.resize(static_cast<size_t>(n) * 2);
      ConvertFromFloat(values.data(), n, DType::kBF16, data.data());
    }
    Add(std::move(name), DType::kBF16, {rows, cols}, data);
  }
  // One shared buffer per (length, value).
  void Vector(std::string name, int64_t n, float value = 1.0f) {
    std::vector<uint8_t>& data = vectors_[{n, value}];
    if (data.empty()) {
      const std::vector<float> values(static_cast<size_t>(n), value);
      data.resize(values.size() * sizeof(float));
      ConvertFromFloat(values.data(), n, DType::kF32, data.data());
    }
    Add(std::move(name), DType::kF32, {n}, data);
  }
  void Add(std::string name, DType type, std::vector<int64_t> shape,
           const std::vector<uint8_t>& data) {
    TensorInfo t;
    t.name = std::move(name);
    t.type = type;
    t.num_elements = 1;
    for (int64_t d : shape) t.num_elements *= d;
    t.shape = std::move(shape);
    t.data = data.data();
    t.num_bytes = data.size();
    tensors_.push_back(std::move(t));
  }

  const std::string path_;
  const uint64_t seed_;
  // Map nodes never move, so the tensors' data pointers stay valid.
  std::map<std::pair<int64_t, int64_t>, std::vector<uint8_t>> matrices_;
  std::map<std::pair<int64_t, float>, std::vector<uint8_t>> vectors_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> RandomModel(const std::string& config_path, Backend& backend,
                                                   uint64_t seed) {
  auto model = std::make_unique<Model>();
  model->path = absl::StrCat("random:", config_path);
  RS_ASSIGN_OR_RETURN(model->config, ReadModelConfig(config_path));
  const ModelConfig& c = model->config;
  RS_ASSIGN_OR_RETURN(const ShardLayout shard, PlanShard(c, 0, 1));
  const RandomSource source(model->path, c, seed);
  RS_ASSIGN_OR_RETURN(ModelWeights weights,
                      LoadWeights(source, TensorNaming::kHuggingFace, c, shard, backend));
  model->ranks.push_back(std::make_unique<LlamaModel>(c, std::move(weights), backend, shard,
                                                      /*comm=*/nullptr));
  model->llama = model->ranks.front().get();
  return model;
}

}  // namespace ridgeserve
