#include "engine/ridgefill/stats_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
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
  return testing_files::TempPath("ridgefill_stats_", name);
}

template <typename T>
T Peek(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

template <typename T>
std::vector<T> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> g;
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(g(rng));
  return v;
}

constexpr int32_t kLayers = 10;
constexpr int32_t kHidden = 8;
constexpr int32_t kKvDim = 6;  // 2 · KV heads · head dim of the kv targets

// One split's statistics with random values that obey the shape rules: `seen` rows, every
// `stride`-th held out (the hold-out set an accumulator would have).
SplitStats MakeSplit(int32_t s, int64_t target_dim, int64_t seen, int64_t stride,
                     std::mt19937& rng) {
  SplitStats split;
  split.split_layer = s;
  split.seen_rows = seen;
  split.holdout_stride = stride;
  CalibrationStats& st = split.stats;
  st.dim = kHidden;
  st.holdout_rows = stride == 0 ? 0 : seen / stride;
  st.rows = seen - st.holdout_rows;
  st.mean = Random<double>(kHidden, rng);
  st.gram = Random<double>(kHidden * kHidden, rng);
  for (int i = 0; i < kHidden; ++i) {
    for (int j = 0; j < i; ++j) st.gram[i * kHidden + j] = st.gram[j * kHidden + i];
  }
  for (int64_t h = 0; h < st.holdout_rows; ++h)
    st.holdout_row_index.push_back((h + 1) * stride - 1);
  st.holdout_x = Random<float>(st.holdout_rows * kHidden, rng);
  for (int32_t l = s + 2; l < kLayers; ++l) {
    CalibrationStats::Target t;
    t.dim = target_dim;
    t.mean = Random<double>(target_dim, rng);
    t.cross = Random<double>(target_dim * kHidden, rng);
    t.holdout_y = Random<float>(st.holdout_rows * target_dim, rng);
    st.targets.push_back(std::move(t));
  }
  return split;
}

// Three splits of a 10-layer model of hidden 8; the middle one holds no rows out.
StatsSet MakeSet(MapTarget kind = MapTarget::kKv) {
  std::mt19937 rng(11);
  StatsSet set;
  set.model = {0x0badc0ffee15f00dULL, "TinyModel-Stats", kLayers, kHidden};
  set.kind = kind;
  const int64_t dim = kind == MapTarget::kKv ? kKvDim : kHidden;
  set.splits.push_back(MakeSplit(1, dim, 45, 8, rng));
  set.splits.push_back(MakeSplit(4, dim, 30, 0, rng));
  set.splits.push_back(MakeSplit(7, dim, 1000, 320, rng));
  return set;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void ExpectSameBits(const StatsSet& a, const StatsSet& b) {
  EXPECT_EQ(a.model.hash, b.model.hash);
  EXPECT_EQ(a.model.model_name, b.model.model_name);
  EXPECT_EQ(a.model.num_layers, b.model.num_layers);
  EXPECT_EQ(a.model.hidden, b.model.hidden);
  EXPECT_EQ(a.kind, b.kind);
  ASSERT_EQ(a.splits.size(), b.splits.size());
  for (size_t i = 0; i < a.splits.size(); ++i) {
    const SplitStats& x = a.splits[i];
    const SplitStats& y = b.splits[i];
    EXPECT_EQ(x.split_layer, y.split_layer);
    EXPECT_EQ(x.seen_rows, y.seen_rows);
    EXPECT_EQ(x.holdout_stride, y.holdout_stride);
    EXPECT_EQ(x.stats.dim, y.stats.dim);
    EXPECT_EQ(x.stats.rows, y.stats.rows);
    EXPECT_EQ(x.stats.holdout_rows, y.stats.holdout_rows);
    EXPECT_TRUE(SameBits(x.stats.mean, y.stats.mean));
    EXPECT_TRUE(SameBits(x.stats.gram, y.stats.gram));
    EXPECT_TRUE(SameBits(x.stats.holdout_row_index, y.stats.holdout_row_index));
    EXPECT_TRUE(SameBits(x.stats.holdout_x, y.stats.holdout_x));
    ASSERT_EQ(x.stats.targets.size(), y.stats.targets.size());
    for (size_t t = 0; t < x.stats.targets.size(); ++t) {
      const CalibrationStats::Target& p = x.stats.targets[t];
      const CalibrationStats::Target& q = y.stats.targets[t];
      EXPECT_EQ(p.dim, q.dim);
      EXPECT_TRUE(SameBits(p.mean, q.mean));
      EXPECT_TRUE(SameBits(p.cross, q.cross));
      EXPECT_TRUE(SameBits(p.holdout_y, q.holdout_y));
    }
  }
}

// One line, starting with the path.
void ExpectNamesFile(const absl::Status& st, const std::string& path) {
  const std::string msg(st.message());
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// Byte positions of a file to cut at or corrupt: every one in the header, the metadata, the
// first array and the trailer; every third one in the rest of the data, where only the
// checksum can tell.
std::vector<size_t> Sample(const std::string& bytes) {
  const size_t data_offset = Peek<uint64_t>(bytes, 40);
  std::vector<size_t> positions;
  for (size_t i = 0; i < bytes.size();
       i += i < data_offset + 64 || i + 24 >= bytes.size() ? 1 : 3) {
    positions.push_back(i);
  }
  return positions;
}

TEST(StatsFileTest, RoundTripIsBitwise) {
  for (MapTarget kind : {MapTarget::kPreNorm, MapTarget::kKv}) {
    const StatsSet set = MakeSet(kind);
    const std::string path = TempPath(std::string(MapTargetName(kind)));
    ASSERT_TRUE(WriteStatsFile(path, set).ok());
    auto read = ReadStatsFile(path, &set.model);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectSameBits(set, *read);
    auto unchecked = ReadStatsFile(path, nullptr);
    ASSERT_TRUE(unchecked.ok()) << unchecked.status();
    // Writing what was read gives the same bytes.
    const std::string again = path + ".again";
    ASSERT_TRUE(WriteStatsFile(again, *read).ok());
    EXPECT_EQ(ReadBytes(again), ReadBytes(path));
    EXPECT_FALSE(std::ifstream(path + ".tmp").good());
    std::remove(again.c_str());
    std::remove(path.c_str());
  }
}

TEST(StatsFileTest, EveryTruncationIsReported) {
  const StatsSet set = MakeSet();
  const std::string path = TempPath("trunc_src");
  ASSERT_TRUE(WriteStatsFile(path, set).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_GT(bytes.size(), 5000u);
  const std::string cut = TempPath("trunc");
  for (size_t n : Sample(bytes)) {
    WriteBytes(cut, bytes.substr(0, n));
    auto read = ReadStatsFile(cut, &set.model);
    ASSERT_FALSE(read.ok()) << n;
    const std::string msg(read.status().message());
    ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << n << ": " << msg;
    ASSERT_NE(msg.find("truncated"), std::string::npos) << n << ": " << msg;
    ExpectNamesFile(read.status(), cut);
  }
  // Bytes appended are caught too.
  WriteBytes(cut, bytes + "x");
  EXPECT_EQ(ReadStatsFile(cut, &set.model).status().code(), absl::StatusCode::kDataLoss);
  std::remove(cut.c_str());
  std::remove(path.c_str());
}

TEST(StatsFileTest, EveryCorruptedByteIsReported) {
  const StatsSet set = MakeSet();
  const std::string path = TempPath("corrupt_src");
  ASSERT_TRUE(WriteStatsFile(path, set).ok());
  const std::string bytes = ReadBytes(path);
  const std::string bad = TempPath("corrupt");
  int checksum_errors = 0;
  const std::vector<size_t> positions = Sample(bytes);
  for (size_t i : positions) {
    std::string b = bytes;
    b[i] ^= 0x20;
    WriteBytes(bad, b);
    auto read = ReadStatsFile(bad, &set.model);
    ASSERT_FALSE(read.ok()) << "flipped byte " << i << " went unnoticed";
    ExpectNamesFile(read.status(), bad);
    checksum_errors += read.status().message().find("checksum mismatch") != std::string::npos;
  }
  // Apart from magic, version and the size field, the checksum is what catches it.
  EXPECT_GT(checksum_errors, static_cast<int>(positions.size()) - 40);
  std::remove(bad.c_str());
  std::remove(path.c_str());
}

TEST(StatsFileTest, WrongMagicVersionAndMissingFile) {
  const StatsSet set = MakeSet();
  const std::string path = TempPath("magic");
  ASSERT_TRUE(WriteStatsFile(path, set).ok());
  const std::string bytes = ReadBytes(path);

  std::string map = bytes;
  std::memcpy(map.data(), "RFMAP\0\0\0", 8);  // a map file is not a statistics file
  WriteBytes(path, map);
  absl::Status st = ReadStatsFile(path, nullptr).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("bad magic"), std::string::npos) << st;
  ExpectNamesFile(st, path);

  std::string v2 = bytes;
  Poke<uint32_t>(v2, 8, 2);
  Reseal(v2);
  WriteBytes(path, v2);
  st = ReadStatsFile(path, nullptr).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unsupported calibration stats file version 2"), std::string::npos)
      << st;
  ExpectNamesFile(st, path);

  std::remove(path.c_str());
  st = ReadStatsFile(path, nullptr).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find(path), std::string::npos) << st;
}

TEST(StatsFileTest, OtherModelIsRefusedNamingBoth) {
  const StatsSet set = MakeSet();
  const std::string path = TempPath("model");
  ASSERT_TRUE(WriteStatsFile(path, set).ok());
  ModelFingerprint other = set.model;
  other.hash ^= 1;
  other.model_name = "SomeOtherModel-7B";
  absl::Status st = ReadStatsFile(path, &other).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(st.message());
  EXPECT_NE(msg.find("TinyModel-Stats"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SomeOtherModel-7B"), std::string::npos) << msg;
  ExpectNamesFile(st, path);

  ModelFingerprint deeper = set.model;
  deeper.num_layers = 12;
  EXPECT_EQ(ReadStatsFile(path, &deeper).status().code(), absl::StatusCode::kFailedPrecondition);
  ModelFingerprint wider = set.model;
  wider.hidden = 16;
  EXPECT_EQ(ReadStatsFile(path, &wider).status().code(), absl::StatusCode::kFailedPrecondition);
  ModelFingerprint renamed = set.model;
  renamed.model_name = "the same weights, another name";
  EXPECT_TRUE(ReadStatsFile(path, &renamed).ok());
  std::remove(path.c_str());
}

// Files whose checksum is right but whose metadata lies: counts and offsets are checked
// against the file before anything is allocated or read (an absurd count that got through
// would throw std::bad_alloc or std::length_error and crash the test).
TEST(StatsFileTest, SealedButMalformedMetadata) {
  const StatsSet set = MakeSet();
  const std::string path = TempPath("malformed");
  ASSERT_TRUE(WriteStatsFile(path, set).ok());
  const std::string bytes = ReadBytes(path);
  // Metadata at 64: hash u64, num_layers u32, hidden u32, kind u32, name length u32, name.
  const size_t layers_at = 64 + 8;
  const size_t kind_at = layers_at + 8;
  const size_t name_len_at = kind_at + 4;
  const size_t num_splits_at = name_len_at + 4 + set.model.model_name.size();
  const size_t split_at = num_splits_at + 4;  // layer, target count, 4 × i64, 4 arrays
  const size_t seen_at = split_at + 8;
  const size_t stride_at = seen_at + 8;
  const size_t rows_at = stride_at + 8;
  const size_t held_at = rows_at + 8;
  const size_t mean_at = held_at + 8;  // array refs: offset u64, count u64
  const size_t gram_at = mean_at + 16;
  const size_t target_at = mean_at + 4 * 16;  // dim u32, 3 arrays
  ASSERT_EQ(Peek<uint32_t>(bytes, split_at), 1u);
  ASSERT_EQ(Peek<uint64_t>(bytes, mean_at + 8), static_cast<uint64_t>(kHidden));
  ASSERT_EQ(Peek<uint32_t>(bytes, target_at), static_cast<uint32_t>(kKvDim));
  const uint64_t mean_offset = Peek<uint64_t>(bytes, mean_at);

  struct Case {
    const char* what;
    size_t at;
    uint64_t value;
    int width;
    absl::StatusCode code;
  };
  constexpr auto kLoss = absl::StatusCode::kDataLoss;
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  const Case cases[] = {
      {"huge name", name_len_at, 0xFFFFFFFFu, 4, kLoss},
      {"huge split count", num_splits_at, 0xFFFFFFFFu, 4, kLoss},
      {"huge target count", split_at + 4, 0xFFFFFFFFu, 4, kLoss},
      {"huge array count", mean_at + 8, 0x4000000000000000ULL, 8, kLoss},
      {"huge Gram count", gram_at + 8, 0x1FFFFFFFFFFFFFFFULL, 8, kLoss},
      {"huge target dim", target_at, 0xFFFFFFFFu, 4, kInvalid},
      {"array past the end", mean_at, 1u << 30, 8, kLoss},
      {"unaligned array", mean_at, mean_offset + 4, 8, kLoss},
      {"array inside the header", mean_at, 0, 8, kLoss},
      {"Gram over the mean", gram_at, mean_offset, 8, kLoss},
      {"wrong array count", mean_at + 8, kHidden - 1, 8, kInvalid},
      {"huge hold-out rows", held_at, 0x4000000000000000ULL, 8, kInvalid},
      {"negative seen rows", seen_at, static_cast<uint64_t>(-5), 8, kInvalid},
      {"more rows than seen", rows_at, 1000, 8, kInvalid},
      {"stride 1", stride_at, 1, 8, kInvalid},
      {"split layer past the model", split_at, 8, 4, kInvalid},
      {"huge layer count", layers_at, 0xFFFFFFFFu, 4, kLoss},
      {"unknown kind", kind_at, 7, 4, kInvalid},
      {"metadata size past the end", 32, 1u << 20, 8, kLoss},
  };
  for (const Case& c : cases) {
    std::string b = bytes;
    if (c.width == 4) Poke<uint32_t>(b, c.at, static_cast<uint32_t>(c.value));
    if (c.width == 8) Poke<uint64_t>(b, c.at, c.value);
    Reseal(b);
    WriteBytes(path, b);
    absl::Status st = ReadStatsFile(path, &set.model).status();
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st;
    ExpectNamesFile(st, path);
  }
  // Every array of split 1 pointing at the same bytes: refused before any is copied twice.
  std::string same = bytes;
  for (size_t ref = mean_at; ref < target_at; ref += 16) Poke<uint64_t>(same, ref, mean_offset);
  Reseal(same);
  WriteBytes(path, same);
  absl::Status st = ReadStatsFile(path, &set.model).status();
  EXPECT_EQ(st.code(), kLoss) << st;
  EXPECT_NE(st.message().find("overlaps"), std::string::npos) << st;
  std::remove(path.c_str());
}

TEST(StatsFileTest, WriterRefusesInconsistentStats) {
  const std::string path = TempPath("refused");
  struct Case {
    const char* what;
    void (*mutate)(StatsSet&);
    const char* names;  // in the message
  };
  const Case cases[] = {
      {"split past the model", [](StatsSet& s) { s.splits[2].split_layer = 8; }, "split layer 8"},
      {"negative split", [](StatsSet& s) { s.splits[0].split_layer = -1; }, "split layer -1"},
      {"not ascending", [](StatsSet& s) { std::swap(s.splits[0], s.splits[1]); }, "split layer 1"},
      {"duplicate", [](StatsSet& s) { s.splits[1] = s.splits[0]; }, "split layer 1"},
      {"stats dim", [](StatsSet& s) { s.splits[1].stats.dim = 7; }, "split 4"},
      {"target count", [](StatsSet& s) { s.splits[1].stats.targets.pop_back(); }, "split 4"},
      {"kv dims differ",
       [](StatsSet& s) {
         CalibrationStats::Target& t = s.splits[1].stats.targets[1];
         t.dim = 4;
         t.mean.resize(4);
         t.cross.resize(4 * kHidden);
       },
       "split 4 target layer 7"},
      {"pre_norm dim",
       [](StatsSet& s) {
         s.kind = MapTarget::kPreNorm;  // targets of dim 6 ≠ hidden 8
       },
       "split 1 target layer 3"},
      {"mean size", [](StatsSet& s) { s.splits[0].stats.mean.pop_back(); }, "split 1: mean"},
      {"Gram not symmetric", [](StatsSet& s) { s.splits[0].stats.gram[1] += 1e-9; },
       "split 1: Gram is not symmetric"},
      {"cross size", [](StatsSet& s) { s.splits[1].stats.targets[2].cross.push_back(0); },
       "split 4: target layer 8 cross"},
      {"hold-out y size", [](StatsSet& s) { s.splits[0].stats.targets[0].holdout_y.pop_back(); },
       "split 1: target layer 3 hold-out y"},
      {"hold-out x size", [](StatsSet& s) { s.splits[2].stats.holdout_x.push_back(0); },
       "split 7: hold-out x"},
      {"index not ascending",
       [](StatsSet& s) {
         std::swap(s.splits[0].stats.holdout_row_index[0], s.splits[0].stats.holdout_row_index[1]);
       },
       "split 1: hold-out row index"},
      {"index past seen rows", [](StatsSet& s) { s.splits[2].stats.holdout_row_index[2] = 1000; },
       "split 7: hold-out row index 1000"},
      {"more rows than seen", [](StatsSet& s) { s.splits[1].seen_rows = 29; }, "split 4"},
      {"negative rows", [](StatsSet& s) { s.splits[1].stats.rows = -1; }, "split 4"},
      {"stride 1", [](StatsSet& s) { s.splits[0].holdout_stride = 1; }, "split 1: hold-out stride"},
      {"held rows without a stride", [](StatsSet& s) { s.splits[0].holdout_stride = 0; },
       "split 1"},
      {"NaN cross", [](StatsSet& s) { s.splits[2].stats.targets[0].cross[5] = std::nan(""); },
       "split 7: target layer 9 cross is not finite"},
      {"infinite hold-out x",
       [](StatsSet& s) { s.splits[0].stats.holdout_x[3] = std::numeric_limits<float>::infinity(); },
       "split 1: hold-out x is not finite"},
      {"too few layers", [](StatsSet& s) { s.model.num_layers = 2; }, "3 layers"},
  };
  for (const Case& c : cases) {
    StatsSet set = MakeSet();
    c.mutate(set);
    EXPECT_EQ(ValidateStatsSet(set).code(), absl::StatusCode::kInvalidArgument) << c.what;
    absl::Status st = WriteStatsFile(path, set);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.names), std::string::npos) << c.what << ": " << st;
    ExpectNamesFile(st, path);
    EXPECT_FALSE(std::ifstream(path).good()) << c.what;
    EXPECT_FALSE(std::ifstream(path + ".tmp").good()) << c.what;
  }
  EXPECT_TRUE(ValidateStatsSet(MakeSet()).ok());
  StatsSet none = MakeSet();
  none.splits.clear();  // no splits at all is a valid (empty) set
  ASSERT_TRUE(WriteStatsFile(path, none).ok());
  auto read = ReadStatsFile(path, &none.model);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->splits.empty());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ridgeserve
