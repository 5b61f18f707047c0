// The paged KV cache: per layer, K and V storage of `num_blocks` blocks of `block_size`
// tokens on the backend, plus the pool that hands blocks to sequences. Kernels see one layer
// as a plain KvLayerView.
#ifndef RIDGESERVE_ENGINE_KV_PAGED_KV_CACHE_H_
#define RIDGESERVE_ENGINE_KV_PAGED_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv/block_pool.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct KvCacheShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  DType dtype = DType::kF32;  // F32, F16 or BF16

  // Bytes of K plus V for one token over all layers.
  size_t BytesPerToken() const {
    return 2 * ElementBytes(dtype) * static_cast<size_t>(num_layers) * num_kv_heads * head_dim;
  }
};

class PagedKvCache {
 public:
  // Allocates every layer's K and V on `backend`; ResourceExhausted naming the bytes and the
  // token capacity when they do not fit.
  static absl::StatusOr<PagedKvCache> Create(Backend& backend, const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  KvLayerView layer(int32_t l) const;

  // Host copies of layer l's K and V at `count` consecutive slots from `slot`, widened to f32
  // (k and v hold count * num_kv_heads * head_dim floats each) — offline tools read the cache
  // this way. CopyFromHost writes them back, rounded as StoreKv rounds.
  void CopyToHost(Backend& backend, int32_t l, int32_t slot, int32_t count, float* k,
                  float* v) const;
  void CopyFromHost(Backend& backend, int32_t l, int32_t slot, int32_t count, const float* k,
                    const float* v);
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }

 private:
  explicit PagedKvCache(const KvCacheShape& shape) : shape_(shape), pool_(shape.num_blocks) {}

  KvCacheShape shape_;
  std::vector<DeviceBuffer> k_;  // per layer [num_blocks, block_size, kv_heads, head_dim]
  std::vector<DeviceBuffer> v_;
  BlockPool pool_;
};

// The blocks of one sequence, in position order.
class BlockTable {
 public:
  // Grows the table so positions [0, num_tokens) have blocks; ResourceExhausted (table
  // unchanged) when the pool runs dry.
  absl::Status Reserve(BlockPool& pool, int32_t num_tokens, int32_t block_size);
  // Returns every block to the pool.
  void Release(BlockPool& pool);

  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Cache slot of the token at `position` (which must be reserved).
  int32_t Slot(int32_t position, int32_t block_size) const {
    return static_cast<int32_t>(PagedSlot(blocks_, block_size, position));
  }

 private:
  std::vector<int32_t> blocks_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_KV_PAGED_KV_CACHE_H_
