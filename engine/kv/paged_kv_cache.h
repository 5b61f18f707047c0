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
};

class PagedKvCache {
 public:
  // Allocates every layer's K and V on `backend`; ResourceExhausted naming the bytes and the
  // token capacity when they do not fit.
  static absl::StatusOr<PagedKvCache> Create(Backend& backend, const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  KvLayerView layer(int32_t l) const;
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
    return blocks_[position / block_size] * block_size + position % block_size;
  }

 private:
  std::vector<int32_t> blocks_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_KV_PAGED_KV_CACHE_H_
