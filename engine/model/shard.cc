#include "engine/model/shard.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve {

absl::StatusOr<ShardLayout> PlanShard(const ModelConfig& c, int32_t rank, int32_t size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel: rank ", rank, " of ", size, " ranks"));
  }
  if (c.num_heads % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel ", size, " does not divide ",
                                                   c.name, "'s ", c.num_heads, " attention heads"));
  }
  if (c.num_kv_heads % size != 0 && size % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel ", size,
                                                   " neither divides nor is a multiple of ", c.name,
                                                   "'s ", c.num_kv_heads, " KV heads"));
  }
  if (c.ffn % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel ", size, " does not divide ",
                                                   c.name, "'s MLP width ", c.ffn));
  }
  ShardLayout s;
  s.rank = rank;
  s.size = size;
  s.num_heads = c.num_heads / size;
  s.q_head_begin = rank * s.num_heads;
  if (size <= c.num_kv_heads) {
    s.num_kv_heads = c.num_kv_heads / size;
    s.kv_head_begin = rank * s.num_kv_heads;
  } else {
    // size / num_kv_heads ranks share each KV head; rank r's query heads all map to it.
    s.num_kv_heads = 1;
    s.kv_head_begin = rank / (size / c.num_kv_heads);
  }
  s.ffn = c.ffn / size;
  s.ffn_begin = rank * s.ffn;
  s.vocab_stride = (c.vocab_size + size - 1) / size;
  s.vocab_begin = std::min(rank * s.vocab_stride, c.vocab_size);
  s.vocab = std::min(s.vocab_stride, c.vocab_size - s.vocab_begin);
  return s;
}

OpShapes StepOpShapes(const ModelConfig& c, const ShardLayout& s, int32_t rows, DType kv_dtype) {
  const int64_t q = s.q_dim(c.head_dim), kv = s.kv_dim(c.head_dim);
  return OpShapes{
      .rows = rows,
      .linear_ks = {c.hidden, q, s.ffn},
      // The activation ops' outputs reach the projections in ActivationDType; only RidgeFill's
      // maps and leverage test multiply f32 rows (the residual stream).
      .f32_linear_k = c.hidden,
      // QKV, the O projection and down (hidden), gate-up, the LM head; RidgeFill's maps output
      // hidden or K/V (2 kv).
      .linear_widths = {q + 2 * kv, c.hidden, 2 * int64_t{s.ffn}, s.vocab, 2 * kv},
      .num_heads = s.num_heads,
      .num_kv_heads = s.num_kv_heads,
      .head_dim = c.head_dim,
      .kv_dtype = kv_dtype,
  };
}

}  // namespace ridgeserve
