#include "engine/kv/paged_kv_cache.h"

#include "absl/strings/str_cat.h"

namespace ridgeserve {

absl::StatusOr<PagedKvCache> PagedKvCache::Create(Backend& backend, const KvCacheShape& shape) {
  PagedKvCache cache(shape);
  const size_t bytes = sizeof(float) * static_cast<size_t>(shape.num_blocks) * shape.block_size *
                       shape.num_kv_heads * shape.head_dim;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    for (std::vector<DeviceBuffer>* kv : {&cache.k_, &cache.v_}) {
      absl::StatusOr<DeviceBuffer> buffer = backend.Alloc(bytes);
      if (!buffer.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("KV cache for ", int64_t{shape.num_blocks} * shape.block_size, " tokens (",
                         bytes, " bytes for each of K and V in each of ", shape.num_layers,
                         " layers): ", buffer.status().message()));
      }
      kv->push_back(*std::move(buffer));
    }
  }
  return cache;
}

KvLayerView PagedKvCache::layer(int32_t l) const {
  return KvLayerView{k_[l].as<float>(), v_[l].as<float>(),   shape_.num_blocks,
                     shape_.block_size, shape_.num_kv_heads, shape_.head_dim};
}

absl::Status BlockTable::Reserve(BlockPool& pool, int32_t num_tokens, int32_t block_size) {
  const int32_t needed = (num_tokens + block_size - 1) / block_size;
  if (needed <= static_cast<int32_t>(blocks_.size())) return absl::OkStatus();
  auto fresh = pool.Allocate(needed - static_cast<int32_t>(blocks_.size()));
  if (!fresh.ok()) return fresh.status();
  blocks_.insert(blocks_.end(), fresh->begin(), fresh->end());
  return absl::OkStatus();
}

void BlockTable::Release(BlockPool& pool) {
  for (int32_t b : blocks_) pool.Release(b);
  blocks_.clear();
}

}  // namespace ridgeserve
