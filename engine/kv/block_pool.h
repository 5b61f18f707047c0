// Fixed pool of KV-cache blocks with reference counts (a block shared by a prefix-cache hit
// has several owners). Pure bookkeeping: the memory lives in PagedKvCache.
//
// Prefix caching: a fully written block can be published under a hash of its contents (the
// hash of the prefix before it and its own token ids, see HashBlockTokens). When its last
// owner releases it, a published block keeps its contents and its hash and stays findable;
// it counts as free and is evicted (least recently released first) only when Allocate runs
// out of never-published free blocks. So:
//   num_free() == free never-published blocks + evictable (published, unowned) blocks.
//
// Threading: owned and used by the engine thread only.
#ifndef RIDGESERVE_ENGINE_KV_BLOCK_POOL_H_
#define RIDGESERVE_ENGINE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace ridgeserve {

// Hash of one full block: mixes the hash of everything before it (`parent_hash`; for the
// first block a per-cache-namespace seed, see kRootBlockHash) with the block's token ids.
// Deterministic across runs (no per-process seed), so tests and logs are reproducible.
uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int32_t> tokens);
// Parent hash of a sequence's first block. `salt` separates K/V that differ for the same
// tokens (e.g. approximate prefill modes): requests with different salts never share blocks.
uint64_t RootBlockHash(uint64_t salt);

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  // Blocks Allocate can hand out now, including evictable cached ones.
  int32_t num_free() const { return static_cast<int32_t>(free_.size()) + num_evictable_; }
  // Published blocks nobody holds: free, but still reusable by a prefix-cache hit.
  int32_t num_evictable() const { return num_evictable_; }
  // Published blocks, held or not.
  int32_t num_cached() const { return static_cast<int32_t>(cached_.size()); }

  // Takes `count` free blocks (ref count 1, unpublished), or ResourceExhausted leaving the
  // pool unchanged. Never-published blocks go first (lowest ids first), then evictable ones
  // in LRU order, which forgets their hash.
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t count);
  // Adds an owner to a held block.
  void AddRef(int32_t block);
  // Drops one reference. At zero an unpublished block returns to the free list and a
  // published one becomes evictable (most recently used end).
  void Release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

  // Prefix cache.
  // The published block with `hash` whose recorded parent hash and tokens also match (a
  // 64-bit hash match alone is not trusted: a wrong hit would be silent garbage), or -1.
  int32_t FindCached(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const;
  // Adds an owner to a block returned by FindCached; an evictable one is taken off the LRU.
  void AcquireCached(int32_t block);
  // Publishes a held, completely written block. False (block stays private) when another
  // block already holds `hash`: two requests computed the same prefix at the same time.
  bool Publish(int32_t block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);
  bool is_cached(int32_t block) const { return published_[block]; }
  uint64_t block_hash(int32_t block) const { return hashes_[block]; }

 private:
  void LruUnlink(int32_t block);
  void LruPushBack(int32_t block);
  void Unpublish(int32_t block);

  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_;  // never-published free blocks; stack, lowest ids handed out first

  // Per block: published flag, hash, parent hash and token ids of published blocks.
  std::vector<bool> published_;
  std::vector<uint64_t> hashes_;
  std::vector<uint64_t> parent_hashes_;
  std::vector<std::vector<int32_t>> tokens_;
  absl::flat_hash_map<uint64_t, int32_t> cached_;  // hash -> published block

  // Evictable blocks as an intrusive doubly linked list (index num_blocks is the sentinel):
  // next of the sentinel is the least recently released block.
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t num_evictable_ = 0;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_KV_BLOCK_POOL_H_
