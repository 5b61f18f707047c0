#include "engine/kv/block_pool.h"

#include <algorithm>
#include <cassert>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve {
namespace {

// splitmix64's finalizer: a bijection on 64 bits with full avalanche.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;  // odd, so t -> h + t * kGolden is injective

}  // namespace

uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = Mix64(parent_hash ^ 0x2545f4914f6cdd1dULL);
  for (int32_t t : tokens)
    h = Mix64(h + (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 1) * kGolden);
  return Mix64(h ^ tokens.size());
}

uint64_t RootBlockHash(uint64_t salt) { return Mix64(salt + kGolden); }

BlockPool::BlockPool(int32_t num_blocks)
    : ref_counts_(num_blocks, 0),
      published_(num_blocks, false),
      hashes_(num_blocks, 0),
      parent_hashes_(num_blocks, 0),
      tokens_(num_blocks),
      lru_prev_(num_blocks + 1, num_blocks),
      lru_next_(num_blocks + 1, num_blocks) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int32_t count) {
  if (count > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: need ", count, " blocks, ", num_free(), " free"));
  }
  const int32_t sentinel = num_blocks();
  std::vector<int32_t> blocks(count);
  for (int32_t& b : blocks) {
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_next_[sentinel];  // least recently released cached block
      LruUnlink(b);
      Unpublish(b);
    }
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
  if (--ref_counts_[block] > 0) return;
  if (published_[block]) {
    LruPushBack(block);
  } else {
    free_.push_back(block);
  }
}

int32_t BlockPool::FindCached(uint64_t hash, uint64_t parent_hash,
                              std::span<const int32_t> tokens) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  const int32_t b = it->second;
  if (parent_hashes_[b] != parent_hash || !std::ranges::equal(tokens_[b], tokens)) return -1;
  return b;
}

void BlockPool::AcquireCached(int32_t block) {
  assert(published_[block]);
  if (ref_counts_[block]++ == 0) LruUnlink(block);
}

bool BlockPool::Publish(int32_t block, uint64_t hash, uint64_t parent_hash,
                        std::span<const int32_t> tokens) {
  assert(ref_counts_[block] > 0 && !published_[block]);
  if (!cached_.try_emplace(hash, block).second) return false;
  published_[block] = true;
  hashes_[block] = hash;
  parent_hashes_[block] = parent_hash;
  tokens_[block].assign(tokens.begin(), tokens.end());
  return true;
}

void BlockPool::Unpublish(int32_t block) {
  cached_.erase(hashes_[block]);
  published_[block] = false;
  hashes_[block] = 0;
  parent_hashes_[block] = 0;
  tokens_[block].clear();
}

void BlockPool::LruUnlink(int32_t block) {
  lru_next_[lru_prev_[block]] = lru_next_[block];
  lru_prev_[lru_next_[block]] = lru_prev_[block];
  --num_evictable_;
}

void BlockPool::LruPushBack(int32_t block) {
  const int32_t sentinel = num_blocks();
  const int32_t last = lru_prev_[sentinel];
  lru_prev_[block] = last;
  lru_next_[block] = sentinel;
  lru_next_[last] = block;
  lru_prev_[sentinel] = block;
  ++num_evictable_;
}

}  // namespace ridgeserve
