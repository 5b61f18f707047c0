#include "engine/ridgefill/xxh64.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace ridgeserve {
namespace {

static_assert(std::endian::native == std::endian::little, "XXH64 reads little-endian words");

constexpr uint64_t kP1 = 11400714785074694791ULL;
constexpr uint64_t kP2 = 14029467366897019727ULL;
constexpr uint64_t kP3 = 1609587929392839161ULL;
constexpr uint64_t kP4 = 9650029242287828579ULL;
constexpr uint64_t kP5 = 2870177450012600261ULL;

uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = std::rotl(acc, 31);
  return acc * kP1;
}

uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kP1 + kP4;
}

// Consumes whole 32-byte stripes of `p` and returns how many bytes it used.
size_t ConsumeStripes(uint64_t acc[4], const uint8_t* p, size_t size) {
  size_t used = 0;
  for (; used + 32 <= size; used += 32) {
    acc[0] = Round(acc[0], Read64(p + used));
    acc[1] = Round(acc[1], Read64(p + used + 8));
    acc[2] = Round(acc[2], Read64(p + used + 16));
    acc[3] = Round(acc[3], Read64(p + used + 24));
  }
  return used;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed)
    : acc_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed), buffer_{} {}

void Xxh64::Update(const void* data, size_t size) {
  if (size == 0) return;  // `data` may be null then
  const auto* p = static_cast<const uint8_t*>(data);
  total_size_ += size;
  if (buffered_ > 0) {
    const size_t take = std::min(size, 32 - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < 32) return;
    ConsumeStripes(acc_, buffer_, 32);
    buffered_ = 0;
  }
  const size_t used = ConsumeStripes(acc_, p, size);
  std::memcpy(buffer_, p + used, size - used);
  buffered_ = size - used;
}

uint64_t Xxh64::Digest() const {
  uint64_t h;
  if (total_size_ >= 32) {
    h = std::rotl(acc_[0], 1) + std::rotl(acc_[1], 7) + std::rotl(acc_[2], 12) +
        std::rotl(acc_[3], 18);
    for (uint64_t v : acc_) h = MergeRound(h, v);
  } else {
    h = seed_ + kP5;
  }
  h += total_size_;
  const uint8_t* p = buffer_;
  const uint8_t* end = buffer_ + buffered_;
  for (; p + 8 <= end; p += 8) {
    h ^= Round(0, Read64(p));
    h = std::rotl(h, 27) * kP1 + kP4;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(Read32(p)) * kP1;
    h = std::rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) {
    h ^= *p * kP5;
    h = std::rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t Xxh64Hash(const void* data, size_t size, uint64_t seed) {
  Xxh64 hasher(seed);
  hasher.Update(data, size);
  return hasher.Digest();
}

}  // namespace ridgeserve
