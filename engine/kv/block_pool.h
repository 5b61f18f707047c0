// Fixed pool of KV-cache blocks with reference counts (a block shared by a prefix-cache hit
// has several owners). Pure bookkeeping: the memory lives in PagedKvCache.
// Threading: owned and used by the engine thread only.
#ifndef RIDGESERVE_ENGINE_KV_BLOCK_POOL_H_
#define RIDGESERVE_ENGINE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // Takes `count` free blocks (ref count 1), or ResourceExhausted leaving the pool unchanged.
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t count);
  void AddRef(int32_t block);
  // Drops one reference; the block returns to the pool at zero.
  void Release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_;  // stack; lowest ids handed out first
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_KV_BLOCK_POOL_H_
