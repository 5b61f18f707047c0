// XXH64 (Yann Collet's xxHash, 64-bit variant), written out from the published algorithm so
// the map file and the model fingerprint need no extra library. Streaming and one-shot forms
// give the same digest for the same bytes however they are split.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_XXH64_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_XXH64_H_

#include <cstddef>
#include <cstdint>

namespace ridgeserve {

// Incremental hasher. Not thread-safe; cheap to copy.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void Update(const void* data, size_t size);
  // Digest of everything passed to Update so far; the hasher can keep going afterwards.
  uint64_t Digest() const;

 private:
  uint64_t acc_[4];
  uint64_t seed_;
  uint64_t total_size_ = 0;
  uint8_t buffer_[32];  // the tail of the input that does not fill a 32-byte stripe yet
  size_t buffered_ = 0;
};

uint64_t Xxh64Hash(const void* data, size_t size, uint64_t seed = 0);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_XXH64_H_
