// What one tensor-parallel rank holds of a model (DESIGN.md, "Scale"; Megatron layout): its
// query heads, its KV heads (replicated when there are more ranks than KV heads, as vLLM
// does), its slice of the MLP's intermediate features and of the vocabulary. The parallel
// topology is kept apart from the architecture (ModelConfig) it is planned from.
#ifndef RIDGESERVE_ENGINE_MODEL_SHARD_H_
#define RIDGESERVE_ENGINE_MODEL_SHARD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace ridgeserve {

struct ShardLayout {
  int32_t rank = 0;
  int32_t size = 1;
  // Query heads [q_head_begin, q_head_begin + num_heads): Q rows and O columns.
  int32_t q_head_begin = 0;
  int32_t num_heads = 0;
  // KV heads [kv_head_begin, kv_head_begin + num_kv_heads): K/V rows and the rank's cache.
  int32_t kv_head_begin = 0;
  int32_t num_kv_heads = 0;
  // MLP features [ffn_begin, ffn_begin + ffn): gate and up rows, down columns.
  int32_t ffn_begin = 0;
  int32_t ffn = 0;
  // Vocabulary rows [vocab_begin, vocab_begin + vocab) of the embedding and the LM head;
  // every rank's slice starts at a multiple of vocab_stride (the last may be shorter).
  int32_t vocab_begin = 0;
  int32_t vocab = 0;
  int32_t vocab_stride = 0;

  int32_t q_dim(int32_t head_dim) const { return num_heads * head_dim; }
  int32_t kv_dim(int32_t head_dim) const { return num_kv_heads * head_dim; }
};

// Rank `rank` of `size` for `config`. InvalidArgument naming the numbers unless `size`
// divides the query heads and the MLP width, and either divides the KV heads or is a
// multiple of them. A weight whose column slice does not fall on whole quantization blocks
// is refused when it is loaded (naming the tensor).
absl::StatusOr<ShardLayout> PlanShard(const ModelConfig& config, int32_t rank, int32_t size);

// The largest step a rank runs, for Backend::ReserveOps: `rows` rows through its Linears (the
// layers' projections, its LM head slice, RidgeFill's maps) and its attention on a `kv_dtype`
// cache.
OpShapes StepOpShapes(const ModelConfig& config, const ShardLayout& shard, int32_t rows,
                      DType kv_dtype);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_SHARD_H_
