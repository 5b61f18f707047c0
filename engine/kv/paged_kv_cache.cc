#include "engine/kv/paged_kv_cache.h"

#include <cassert>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ridgeserve {

absl::StatusOr<PagedKvCache> PagedKvCache::Create(Backend& backend, const KvCacheShape& shape) {
  if (!IsKvCacheDType(shape.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype ", static_cast<int>(shape.dtype), ": want F32, F16 or BF16"));
  }
  PagedKvCache cache(shape);
  const size_t bytes = ElementBytes(shape.dtype) * static_cast<size_t>(shape.num_blocks) *
                       shape.block_size * shape.num_kv_heads * shape.head_dim;
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
  return KvLayerView{k_[l].as<uint8_t>(), v_[l].as<uint8_t>(), shape_.dtype,   shape_.num_blocks,
                     shape_.block_size,   shape_.num_kv_heads, shape_.head_dim};
}

void PagedKvCache::CopyToHost(Backend& backend, int32_t l, int32_t slot, int32_t count, float* k,
                              float* v) const {
  const int64_t elements = int64_t{count} * shape_.num_kv_heads * shape_.head_dim;
  const size_t offset = ElementBytes(shape_.dtype) * slot * shape_.num_kv_heads * shape_.head_dim;
  std::vector<uint8_t> stored(ElementBytes(shape_.dtype) * elements);
  for (auto [device, host] :
       {std::pair{k_[l].as<uint8_t>(), k}, std::pair{v_[l].as<uint8_t>(), v}}) {
    backend.CopyToHost(stored.data(), device + offset, stored.size());
    const absl::Status status = DequantizeRow(shape_.dtype, stored.data(), elements, host);
    assert(status.ok());  // F32, F16 or BF16, checked at Create
    (void)status;
  }
}

void PagedKvCache::CopyFromHost(Backend& backend, int32_t l, int32_t slot, int32_t count,
                                const float* k, const float* v) {
  const int64_t elements = int64_t{count} * shape_.num_kv_heads * shape_.head_dim;
  const size_t offset = ElementBytes(shape_.dtype) * slot * shape_.num_kv_heads * shape_.head_dim;
  std::vector<uint8_t> stored(ElementBytes(shape_.dtype) * elements);
  for (auto [device, host] :
       {std::pair{k_[l].as<uint8_t>(), k}, std::pair{v_[l].as<uint8_t>(), v}}) {
    ConvertFromFloat(host, elements, shape_.dtype, stored.data());
    backend.CopyToDevice(device + offset, stored.data(), stored.size());
  }
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
