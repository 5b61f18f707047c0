#include "engine/kv/block_pool.h"

#include <cassert>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve {

BlockPool::BlockPool(int32_t num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int32_t count) {
  if (count > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: need ", count, " blocks, ", num_free(), " free"));
  }
  std::vector<int32_t> blocks(count);
  for (int32_t& b : blocks) {
    b = free_.back();
    free_.pop_back();
    ref_counts_[b] = 1;
  }
  return blocks;
}

void BlockPool::AddRef(int32_t block) {
  assert(ref_counts_[block] > 0);
  ++ref_counts_[block];
}

void BlockPool::Release(int32_t block) {
  assert(ref_counts_[block] > 0);
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

}  // namespace ridgeserve
