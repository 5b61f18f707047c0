// Model weights on a backend, in the layout the forward pass wants: f32, PyTorch Linear
// orientation [out, in], Q/K rows in the Hugging Face (half-split RoPE) order, and the
// projections that read the same input fused (QKV, gate+up) so each is one GEMM.
#ifndef RIDGESERVE_ENGINE_MODEL_WEIGHTS_H_
#define RIDGESERVE_ENGINE_MODEL_WEIGHTS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/tensor_source.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct LayerWeights {
  DeviceBuffer attn_norm;  // [hidden]
  DeviceBuffer wqkv;       // [q_dim + 2 * kv_dim, hidden]: rows of Q, then K, then V
  DeviceBuffer bqkv;       // [q_dim + 2 * kv_dim] or empty
  DeviceBuffer q_norm;     // [head_dim] or empty (Qwen3)
  DeviceBuffer k_norm;     // [head_dim] or empty
  DeviceBuffer wo;         // [hidden, q_dim]
  DeviceBuffer ffn_norm;   // [hidden]
  DeviceBuffer w_gate_up;  // [2 * ffn, hidden]: gate rows, then up rows
  DeviceBuffer w_down;     // [hidden, ffn]
};

struct ModelWeights {
  DeviceBuffer token_embd;     // [vocab, hidden]
  DeviceBuffer output_norm;    // [hidden]
  DeviceBuffer lm_head;        // [vocab, hidden]; empty when tied to token_embd
  DeviceBuffer rope_inv_freq;  // [head_dim / 2]
  std::vector<LayerWeights> layers;

  const float* lm_head_or_embedding() const {
    return lm_head.bytes() > 0 ? lm_head.as<float>() : token_embd.as<float>();
  }
};

enum class TensorNaming {
  kGguf,         // blk.N.attn_q.weight; llama-arch Q/K rows permuted for adjacent-pair RoPE
  kHuggingFace,  // model.layers.N.self_attn.q_proj.weight
};

// Reads, checks the shape of, converts and uploads every tensor the architecture needs.
// Errors name the source path and the tensor.
absl::StatusOr<ModelWeights> LoadWeights(const TensorSource& source, TensorNaming naming,
                                         const ModelConfig& config, Backend& backend);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_WEIGHTS_H_
