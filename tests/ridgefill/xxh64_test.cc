#include "engine/ridgefill/xxh64.h"

#include <gtest/gtest.h>

#include <string>

namespace ridgeserve {
namespace {

// Published reference values (xxHash's test vectors / python-xxhash documentation).
TEST(Xxh64Test, KnownVectors) {
  EXPECT_EQ(Xxh64Hash("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Xxh64Hash("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(Xxh64Hash("abc", 3), 0x44BC2CF5AD770999ULL);
  const std::string spam = "Nobody inspects the spammish repetition";  // 39 bytes: one stripe
  EXPECT_EQ(Xxh64Hash(spam.data(), spam.size()), 0xFBCEA83C8A378BF1ULL);
}

TEST(Xxh64Test, StreamingEqualsOneShotForEverySplit) {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>(i * 131 + 7));
  for (uint64_t seed : {0ULL, 12345ULL}) {
    const uint64_t whole = Xxh64Hash(data.data(), data.size(), seed);
    for (size_t a = 0; a <= data.size(); a += 7) {
      for (size_t b = a; b <= data.size(); b += 29) {
        Xxh64 h(seed);
        h.Update(data.data(), a);
        h.Update(data.data() + a, b - a);
        h.Update(data.data() + b, data.size() - b);
        ASSERT_EQ(h.Digest(), whole) << "split at " << a << ", " << b;
      }
    }
  }
}

}  // namespace
}  // namespace ridgeserve
