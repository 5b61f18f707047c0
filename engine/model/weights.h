// Model weights on a backend. Matrices are Weights packed by the backend from the stored rows
// (still quantized on the CPU), PyTorch Linear orientation [out, in], Q/K rows in the Hugging
// Face (half-split RoPE) order, and the projections that read the same input fused (QKV,
// gate+up) so each is one Linear. Vectors (norms, biases) are f32 buffers.
#ifndef RIDGESERVE_ENGINE_MODEL_WEIGHTS_H_
#define RIDGESERVE_ENGINE_MODEL_WEIGHTS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/shard.h"
#include "engine/model/tensor_source.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct LayerWeights {
  DeviceBuffer attn_norm;  // [hidden]
  Weight wqkv;             // [q_dim + 2 * kv_dim, hidden]: rows of Q, then K, then V
  DeviceBuffer bqkv;       // [q_dim + 2 * kv_dim] or empty
  DeviceBuffer q_norm;     // [head_dim] or empty (Qwen3)
  DeviceBuffer k_norm;     // [head_dim] or empty
  Weight wo;               // [hidden, q_dim]
  DeviceBuffer ffn_norm;   // [hidden]
  Weight w_gate_up;        // [2 * ffn, hidden]: gate rows, then up rows
  Weight w_down;           // [hidden, ffn]
};

struct ModelWeights {
  Weight token_embd;           // [vocab, hidden]
  DeviceBuffer output_norm;    // [hidden]
  Weight lm_head;              // [vocab, hidden]; empty when tied to token_embd
  DeviceBuffer rope_inv_freq;  // [head_dim / 2]
  std::vector<LayerWeights> layers;

  const Weight& lm_head_or_embedding() const { return lm_head.empty() ? token_embd : lm_head; }
  // Bytes the weights occupy on the backend.
  size_t resident_bytes() const;
};

enum class TensorNaming {
  kGguf,         // blk.N.attn_q.weight; llama-arch Q/K rows permuted for adjacent-pair RoPE
  kHuggingFace,  // model.layers.N.self_attn.q_proj.weight
};

// Reads, checks the shape of, converts and uploads every tensor the architecture needs: the
// slices `shard` holds (shapes above are then the rank's: its heads, MLP features and
// vocabulary rows). Errors name the source path and the tensor.
absl::StatusOr<ModelWeights> LoadWeights(const TensorSource& source, TensorNaming naming,
                                         const ModelConfig& config, const ShardLayout& shard,
                                         Backend& backend);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_WEIGHTS_H_
