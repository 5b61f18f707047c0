#include "engine/ridgefill/map_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/ridgefill/file_bytes.h"

namespace ridgeserve {
namespace {

using testing_files::Poke;
using testing_files::ReadBytes;
using testing_files::Reseal;
using testing_files::WriteBytes;

std::string TempPath(const std::string& name) {
  return testing_files::TempPath("ridgefill_map_", name);
}

// Owns the arrays a MapSet views.
struct Fixture {
  std::vector<std::vector<float>> storage;
  MapSet maps;

  std::span<const float> Random(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> g;
    std::vector<float> v(n);
    for (float& f : v) f = g(rng);
    storage.push_back(std::move(v));
    return storage.back();
  }
};

// hidden 8, 7 layers, 2 KV heads of dim 2; splits at 1 (targets 3..6) and 3 (targets 5, 6).
Fixture MakeMaps(MapTarget kind = MapTarget::kKv) {
  Fixture f;
  f.storage.reserve(64);
  std::mt19937 rng(7);
  f.maps.model = {0x1234abcd5678ef00ULL, "TinyModel-Test", 7, 8};
  f.maps.num_kv_heads = 2;
  f.maps.head_dim = 2;
  f.maps.kind = kind;
  const int32_t out = 8;  // hidden, and 2 · kv_dim for kv maps
  for (int32_t s : {1, 3}) {
    SplitMaps split;
    split.split_layer = s;
    if (s == 1) {
      split.leverage_lambda = 0.25f;
      split.leverage_inverse = f.Random(64, rng);
      split.leverage_mean = f.Random(8, rng);
    }
    for (int32_t l = s + 2; l < 7; ++l) {
      TargetMap t;
      t.layer = l;
      t.lambda = 0.5f * l;
      t.out_dim = out;
      t.weight = f.Random(out * 8, rng);
      t.bias = f.Random(out, rng);
      if (l % 2 == 0) t.key_scale = f.Random(2, rng);
      t.diagnostics.r2 = 0.9f + 0.01f * l;
      t.diagnostics.k_cos = 0.95f;
      // v_cos, key_norm_ratio, attn_cos stay NaN: not measured.
      split.targets.push_back(t);
    }
    f.maps.splits.push_back(split);
  }
  return f;
}

MapFileExpectations Expect(const MapSet& maps) {
  return {maps.model, maps.num_kv_heads, maps.head_dim};
}

bool SameFloats(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

TEST(MapFileTest, RoundTripIsBitwise) {
  for (MapTarget kind : {MapTarget::kPreNorm, MapTarget::kPostNorm, MapTarget::kKv}) {
    Fixture f = MakeMaps(kind);
    const std::string path = TempPath(std::string(MapTargetName(kind)));
    ASSERT_TRUE(WriteMapFile(path, f.maps).ok());
    auto file = MapFile::Open(path, Expect(f.maps));
    ASSERT_TRUE(file.ok()) << file.status();
    const MapSet& got = (*file)->maps();
    EXPECT_EQ(got.model.hash, f.maps.model.hash);
    EXPECT_EQ(got.model.model_name, f.maps.model.model_name);
    EXPECT_EQ(got.model.num_layers, 7);
    EXPECT_EQ(got.model.hidden, 8);
    EXPECT_EQ(got.num_kv_heads, 2);
    EXPECT_EQ(got.head_dim, 2);
    EXPECT_EQ(got.kind, kind);
    ASSERT_EQ(got.splits.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      const SplitMaps& a = f.maps.splits[s];
      const SplitMaps& b = got.splits[s];
      EXPECT_EQ(b.split_layer, a.split_layer);
      EXPECT_EQ(std::bit_cast<uint32_t>(b.leverage_lambda),
                std::bit_cast<uint32_t>(a.leverage_lambda));
      EXPECT_TRUE(SameFloats(a.leverage_inverse, b.leverage_inverse));
      EXPECT_TRUE(SameFloats(a.leverage_mean, b.leverage_mean));
      ASSERT_EQ(b.targets.size(), a.targets.size());
      for (size_t t = 0; t < a.targets.size(); ++t) {
        const TargetMap& x = a.targets[t];
        const TargetMap& y = b.targets[t];
        EXPECT_EQ(y.layer, x.layer);
        EXPECT_EQ(y.out_dim, x.out_dim);
        EXPECT_EQ(std::bit_cast<uint32_t>(y.lambda), std::bit_cast<uint32_t>(x.lambda));
        EXPECT_TRUE(SameFloats(x.weight, y.weight));
        EXPECT_TRUE(SameFloats(x.bias, y.bias));
        EXPECT_TRUE(SameFloats(x.key_scale, y.key_scale));
        const MapDiagnostics& g = x.diagnostics;
        const MapDiagnostics& h = y.diagnostics;
        EXPECT_EQ(std::memcmp(&g, &h, sizeof(MapDiagnostics)), 0);  // NaNs included
        EXPECT_TRUE(std::isnan(h.attn_cos));
#if !defined(__SANITIZE_ADDRESS__)
        // Mapped in place: every array 64-byte aligned.
        EXPECT_EQ(reinterpret_cast<uintptr_t>(y.weight.data()) % 64, 0u);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(y.bias.data()) % 64, 0u);
#endif
      }
    }
    EXPECT_EQ((*file)->FindSplit(3), &got.splits[1]);
    EXPECT_EQ((*file)->FindSplit(2), nullptr);
    // Writing what was read gives the same bytes.
    const std::string again = path + ".again";
    ASSERT_TRUE(WriteMapFile(again, got).ok());
    EXPECT_EQ(ReadBytes(again), ReadBytes(path));
    std::remove(again.c_str());
    std::remove(path.c_str());
  }
}

TEST(MapFileTest, EveryTruncationIsReported) {
  Fixture f = MakeMaps();
  const std::string path = TempPath("trunc_src");
  ASSERT_TRUE(WriteMapFile(path, f.maps).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_GT(bytes.size(), 1000u);
  const std::string cut = TempPath("trunc");
  // Every length through header and metadata, then a stride, then the whole trailer.
  std::vector<size_t> lengths;
  for (size_t n = 0; n < bytes.size(); n += n < 400 ? 1 : 7) lengths.push_back(n);
  for (size_t n = bytes.size() - 24; n < bytes.size(); ++n) lengths.push_back(n);
  for (size_t n : lengths) {
    WriteBytes(cut, bytes.substr(0, n));
    auto file = MapFile::Open(cut, Expect(f.maps));
    ASSERT_FALSE(file.ok()) << n;
    const std::string msg(file.status().message());
    ASSERT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << n << ": " << msg;
    ASSERT_NE(msg.find("truncated"), std::string::npos) << n << ": " << msg;
    ASSERT_NE(msg.find(cut), std::string::npos) << msg;
    ASSERT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // Bytes appended are caught too.
  WriteBytes(cut, bytes + "x");
  EXPECT_EQ(MapFile::Open(cut, Expect(f.maps)).status().code(), absl::StatusCode::kDataLoss);
  std::remove(cut.c_str());
  std::remove(path.c_str());
}

TEST(MapFileTest, EveryCorruptedByteIsReported) {
  Fixture f = MakeMaps();
  const std::string path = TempPath("corrupt_src");
  ASSERT_TRUE(WriteMapFile(path, f.maps).ok());
  const std::string bytes = ReadBytes(path);
  const std::string bad = TempPath("corrupt");
  int checksum_errors = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] ^= 0x20;
    WriteBytes(bad, b);
    auto file = MapFile::Open(bad, Expect(f.maps));
    ASSERT_FALSE(file.ok()) << "flipped byte " << i << " went unnoticed";
    checksum_errors += file.status().message().find("checksum mismatch") != std::string::npos;
  }
  // Apart from magic, version and the size field, the checksum is what catches it.
  EXPECT_GT(checksum_errors, static_cast<int>(bytes.size()) - 40);
  std::remove(bad.c_str());
  std::remove(path.c_str());
}

TEST(MapFileTest, WrongMagicAndVersion) {
  Fixture f = MakeMaps();
  const std::string path = TempPath("magic");
  ASSERT_TRUE(WriteMapFile(path, f.maps).ok());
  std::string bytes = ReadBytes(path);

  std::string gguf = bytes;
  std::memcpy(gguf.data(), "GGUF", 4);
  WriteBytes(path, gguf);
  auto st = MapFile::Open(path, Expect(f.maps)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("bad magic"), std::string::npos) << st;

  std::string v2 = bytes;
  Poke<uint32_t>(v2, 8, 2);
  Reseal(v2);
  WriteBytes(path, v2);
  st = MapFile::Open(path, Expect(f.maps)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unsupported map file version 2"), std::string::npos) << st;

  WriteBytes(path, "");
  EXPECT_EQ(MapFile::Open(path, Expect(f.maps)).status().code(), absl::StatusCode::kDataLoss);
  std::remove(path.c_str());
  st = MapFile::Open(path, Expect(f.maps)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
}

TEST(MapFileTest, OtherModelIsRefusedNamingBoth) {
  Fixture f = MakeMaps();
  const std::string path = TempPath("model");
  ASSERT_TRUE(WriteMapFile(path, f.maps).ok());
  MapFileExpectations other = Expect(f.maps);
  other.model.hash ^= 1;
  other.model.model_name = "SomeOtherModel-7B";
  auto st = MapFile::Open(path, other).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(st.message());
  EXPECT_NE(msg.find("TinyModel-Test"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SomeOtherModel-7B"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;

  MapFileExpectations wider = Expect(f.maps);
  wider.model.hidden = 16;
  EXPECT_EQ(MapFile::Open(path, wider).status().code(), absl::StatusCode::kFailedPrecondition);
  MapFileExpectations heads = Expect(f.maps);
  heads.num_kv_heads = 4;
  EXPECT_EQ(MapFile::Open(path, heads).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MapFile::OpenUnchecked(path).ok());
  std::remove(path.c_str());
}

// Files whose checksum is right but whose metadata lies: counts and offsets are checked
// against the file before anything is allocated or read.
TEST(MapFileTest, SealedButMalformedMetadata) {
  Fixture f = MakeMaps();
  const std::string path = TempPath("malformed");
  ASSERT_TRUE(WriteMapFile(path, f.maps).ok());
  const std::string bytes = ReadBytes(path);
  // Metadata starts at 64: hash u64, 6 × u32, name length u32 at 64 + 32.
  const size_t name_len_at = 64 + 8 + 6 * 4;
  const size_t name_len = f.maps.model.model_name.size();
  const size_t num_splits_at = name_len_at + 4 + name_len;
  const size_t first_split_at = num_splits_at + 4;
  const size_t first_array_at = first_split_at + 16;  // leverage inverse: offset, count

  struct Case {
    const char* what;
    size_t at;
    uint64_t value;
    int width;
  };
  const Case cases[] = {
      {"huge name", name_len_at, 0xFFFFFFFFu, 4},
      {"huge split count", num_splits_at, 0xFFFFFFFFu, 4},
      {"huge target count", first_split_at + 4, 0xFFFFFFFFu, 4},
      {"array past the end", first_array_at, 1u << 30, 8},
      {"unaligned array", first_array_at, 64 * 3 + 4, 8},
      {"array inside the header", first_array_at, 0, 8},
      {"huge array count", first_array_at + 8, 0x4000000000000000ULL, 8},
      {"wrong array count", first_array_at + 8, 63, 8},
      {"split layer past the model", first_split_at, 99, 4},
      {"unknown kind", 64 + 8 + 4 * 4, 7, 4},
      {"f16 dtype", 64 + 8 + 5 * 4, 1, 4},
      {"metadata size past the end", 32, 1u << 20, 8},
  };
  for (const Case& c : cases) {
    std::string b = bytes;
    if (c.width == 4) Poke<uint32_t>(b, c.at, static_cast<uint32_t>(c.value));
    if (c.width == 8) Poke<uint64_t>(b, c.at, c.value);
    Reseal(b);
    WriteBytes(path, b);
    auto file = MapFile::Open(path, Expect(f.maps));
    EXPECT_FALSE(file.ok()) << c.what;
    if (!file.ok()) {
      EXPECT_EQ(file.status().message().find('\n'), std::string::npos);
      EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status();
    }
  }
  std::remove(path.c_str());
}

TEST(MapFileTest, WriterRefusesInconsistentMaps) {
  const std::string path = TempPath("refused");
  auto refused = [&](const MapSet& m) {
    absl::Status st = WriteMapFile(path, m);
    const bool missing = !std::ifstream(path).good() && !std::ifstream(path + ".tmp").good();
    return st.code() == absl::StatusCode::kInvalidArgument && missing;
  };
  {
    Fixture f = MakeMaps();
    f.maps.splits[0].targets[0].weight = f.maps.splits[0].targets[0].weight.subspan(1);
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps();
    std::swap(f.maps.splits[0].targets[0], f.maps.splits[0].targets[1]);
    EXPECT_TRUE(refused(f.maps));  // not ascending
  }
  {
    Fixture f = MakeMaps();
    f.maps.splits[1].split_layer = 1;  // duplicate
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps();
    f.maps.splits[0].targets[0].layer = 2;  // s + 1 runs exactly, never mapped
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps();
    f.maps.splits[0].targets[1].key_scale = f.maps.splits[0].targets[0].bias;  // 8 ≠ 2 heads
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps();
    f.maps.splits[0].leverage_mean = {};
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps();
    f.maps.splits[0].targets[0].lambda = NAN;
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps(MapTarget::kKv);
    f.maps.head_dim = 4;  // 2 · kv_dim = 16 ≠ out_dim 8
    EXPECT_TRUE(refused(f.maps));
  }
  {
    Fixture f = MakeMaps();
    f.maps.splits[1].split_layer = 5;  // no layer ≥ s + 2 left in a 7-layer model
    EXPECT_TRUE(refused(f.maps));
  }
}

TEST(MapFileTest, ParseMapTargetNames) {
  for (MapTarget k : {MapTarget::kPreNorm, MapTarget::kPostNorm, MapTarget::kKv}) {
    auto parsed = ParseMapTarget(MapTargetName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_FALSE(ParseMapTarget("prenorm").ok());
}

}  // namespace
}  // namespace ridgeserve
