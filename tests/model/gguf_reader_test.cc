// GgufFile and MappedFile on files written by the spec-side writer in formats_test_writers:
// getters, shapes, and above all corrupted files (truncation at every byte of the structure,
// absurd counts and lengths, bad types and offsets), which must all end in a Status naming
// the file and the phase, never a crash, hang or huge allocation.
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/mapped_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "tests/model/formats_test_writers.h"

namespace ridgeserve {
namespace {

using testing::ByteWriter;
using testing::GgufValue;
using testing::GgufWriter;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::TempDir;
using testing::WriteFile;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Opens `bytes` written to a fresh file in `dir`.
absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const TempDir& dir, const std::string& bytes,
                                                    const std::string& name = "t.gguf") {
  const std::string path = dir.File(name);
  WriteFile(path, bytes);
  return GgufFile::Open(path);
}

void PatchU32(std::string* bytes, size_t offset, uint32_t v) {
  ASSERT_LE(offset + 4, bytes->size());
  std::memcpy(bytes->data() + offset, &v, 4);
}

void PatchU64(std::string* bytes, size_t offset, uint64_t v) {
  ASSERT_LE(offset + 8, bytes->size());
  std::memcpy(bytes->data() + offset, &v, 8);
}

// Q8_0 block: f16 d then 32 int8.
std::string Q8Block(uint16_t d_bits, int first) {
  ByteWriter w;
  w.U16(d_bits);
  for (int i = 0; i < 32; ++i) w.I8(static_cast<int8_t>(first + i));
  return w.bytes();
}

// A file with every metadata value type and three tensors of different types and ranks.
std::string RichFile(uint32_t version = 3) {
  GgufWriter w(version);
  w.AddString("general.architecture", "llama");
  w.AddU8("t.u8", 200);
  w.AddI8("t.i8", -100);
  w.AddU16("t.u16", 60000);
  w.AddI16("t.i16", -30000);
  w.AddU32("t.u32", 4000000000u);
  w.AddI32("t.i32", -2000000000);
  w.AddU64("t.u64", 1ull << 40);
  w.AddU64("t.u64_big", ~0ull);
  w.AddI64("t.i64", -(1ll << 50));
  w.AddF32("t.f32", 0.15625f);
  w.AddF64("t.f64", -1e300);
  w.AddBool("t.bool", true);
  w.AddString("t.string", "h\xC3\xA9llo, world");
  w.AddString("t.empty_string", "");
  w.AddStringArray("t.strings", {"<|im_start|>", "", "\xE2\x96\x81the"});
  w.AddI32Array("t.ints", {1, -2, 2147483647});
  w.AddF32Array("t.floats", {0.5f, -1.25f});
  w.AddI32Array("t.empty_ints", {});
  {
    // Array of two arrays of u8.
    ByteWriter v;
    v.U32(static_cast<uint32_t>(GgufValue::kArray));
    v.U64(2);
    for (int i = 0; i < 2; ++i) {
      v.U32(static_cast<uint32_t>(GgufValue::kU8));
      v.U64(3);
      v.U8(1);
      v.U8(2);
      v.U8(3);
    }
    w.AddRaw("t.nested", static_cast<uint32_t>(GgufValue::kArray), v.bytes());
  }
  w.AddF32Tensor("a.f32", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.AddTensor(
      "b.q8_0", DType::kQ8_0, {64, 2},
      Q8Block(0x3800, -128) + Q8Block(0x3C00, 0) + Q8Block(0x4000, 50) + Q8Block(0x0001, 95));
  // f16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), -0.
  w.AddTensor("c.f16", DType::kF16, {5},
              testing::U16Bytes({0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000}));
  return w.Build();
}

TEST(MappedFileTest, MapsContentAndEmptyFiles) {
  TempDir dir;
  WriteFile(dir.File("a"), "hello");
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.File("a"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*f)->data()), 5), "hello");
  EXPECT_EQ((*f)->path(), dir.File("a"));

  WriteFile(dir.File("empty"), "");
  f = MappedFile::Open(dir.File("empty"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->size(), 0u);
  EXPECT_TRUE((*f)->bytes().empty());
}

TEST(MappedFileTest, ErrorsNameTheFile) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.File("missing"));
  EXPECT_TRUE(absl::IsNotFound(f.status())) << f.status();
  EXPECT_THAT(Message(f.status()), StartsWith(dir.File("missing") + ": "));
  f = MappedFile::Open(dir.path());
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_THAT(Message(f.status()), HasSubstr("not a regular file"));
}

TEST(GgufTest, ReadsEveryValueTypeAndTensor) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<GgufFile>> opened = OpenBytes(dir, RichFile());
  ASSERT_TRUE(opened.ok()) << opened.status();
  const GgufFile& g = **opened;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.path(), dir.File("t.gguf"));

  EXPECT_EQ(*g.GetInt("t.u8"), 200);
  EXPECT_EQ(*g.GetInt("t.i8"), -100);
  EXPECT_EQ(*g.GetInt("t.u16"), 60000);
  EXPECT_EQ(*g.GetInt("t.i16"), -30000);
  EXPECT_EQ(*g.GetInt("t.u32"), 4000000000ll);
  EXPECT_EQ(*g.GetInt("t.i32"), -2000000000);
  EXPECT_EQ(*g.GetInt("t.u64"), 1ll << 40);
  EXPECT_EQ(*g.GetInt("t.i64"), -(1ll << 50));
  EXPECT_TRUE(absl::IsOutOfRange(g.GetInt("t.u64_big").status()));
  EXPECT_EQ(*g.GetFloat("t.u64_big"), 18446744073709551616.0);
  EXPECT_EQ(*g.GetFloat("t.f32"), 0.15625);
  EXPECT_EQ(*g.GetFloat("t.f64"), -1e300);
  EXPECT_EQ(*g.GetFloat("t.i32"), -2000000000.0);
  EXPECT_TRUE(*g.GetBool("t.bool"));
  EXPECT_EQ(*g.GetString("t.string"), "h\xC3\xA9llo, world");
  EXPECT_EQ(*g.GetString("t.empty_string"), "");
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_THAT(*g.GetStringArray("t.strings"),
              ::testing::ElementsAre("<|im_start|>", "", "\xE2\x96\x81the"));
  EXPECT_THAT(*g.GetIntArray("t.ints"), ::testing::ElementsAre(1, -2, 2147483647));
  EXPECT_THAT(*g.GetFloatArray("t.ints"), ::testing::ElementsAre(1.0, -2.0, 2147483647.0));
  EXPECT_THAT(*g.GetFloatArray("t.floats"), ::testing::ElementsAre(0.5, -1.25));
  EXPECT_TRUE(g.GetIntArray("t.empty_ints")->empty());

  // Type mismatches and missing keys name file and key.
  absl::Status s = g.GetString("t.u32").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(Message(s), dir.File("t.gguf") + ": metadata: is u32, not a string (key t.u32)");
  s = g.GetInt("no.such.key").status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(Message(s), dir.File("t.gguf") + ": metadata: not found (key no.such.key)");
  EXPECT_FALSE(g.Has("no.such.key"));
  EXPECT_TRUE(g.Has("t.nested"));
  EXPECT_TRUE(absl::IsInvalidArgument(g.GetInt("t.f32").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(g.GetBool("t.u8").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(g.GetFloat("t.string").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(g.GetIntArray("t.floats").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(g.GetStringArray("t.ints").status()));
  EXPECT_THAT(Message(g.GetIntArray("t.nested").status()), HasSubstr("array of array"));

  ASSERT_EQ(g.tensors().size(), 3u);
  const TensorInfo* a = g.FindTensor("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->num_elements, 6);
  EXPECT_EQ(a->num_bytes, 24u);
  EXPECT_THAT(*g.ReadF32(*a), ::testing::ElementsAre(1, 2, 3, 4, 5, 6));

  const TensorInfo* b = g.FindTensor("b.q8_0");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, DType::kQ8_0);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(b->num_bytes, 4u * 34u);
  std::vector<float> bv = *g.ReadF32(*b);
  ASSERT_EQ(bv.size(), 128u);
  // Scales 0.5, 1, 2 and 2^-24 (f16 subnormal); quants count up from -128, 0, 50, 95.
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(bv[i], 0.5f * static_cast<float>(-128 + i));
    EXPECT_EQ(bv[32 + i], static_cast<float>(i));
    EXPECT_EQ(bv[64 + i], 2.0f * static_cast<float>(50 + i));
    EXPECT_EQ(bv[96 + i], std::ldexp(static_cast<float>(95 + i), -24));
  }
  EXPECT_THAT(*g.ReadF32(*g.FindTensor("c.f16")),
              ::testing::ElementsAre(1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), -0.0f));
  EXPECT_TRUE(std::signbit(g.ReadF32(*g.FindTensor("c.f16"))->back()));
  EXPECT_EQ(g.FindTensor("missing"), nullptr);

  // A TensorInfo that does not point into this file is refused, not read.
  TensorInfo foreign = *a;
  std::vector<uint8_t> elsewhere(24);
  foreign.data = elsewhere.data();
  s = g.ReadF32(foreign).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST(GgufTest, VersionTwoHasTheSameLayout) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<GgufFile>> g = OpenBytes(dir, RichFile(2));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->version(), 2u);
  EXPECT_EQ(*(*g)->GetInt("t.u32"), 4000000000ll);
  EXPECT_EQ((*g)->tensors().size(), 3u);
}

TEST(GgufTest, BadMagicAndVersions) {
  TempDir dir;
  std::string bytes = RichFile();
  bytes[0] = 'X';
  absl::Status s = OpenBytes(dir, bytes).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(Message(s), dir.File("t.gguf") + ": header: bad magic: not a GGUF file");

  for (uint32_t version : {0u, 1u, 4u, 0x03000000u}) {
    bytes = RichFile();
    PatchU32(&bytes, 4, version);
    s = OpenBytes(dir, bytes).status();
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_THAT(Message(s), HasSubstr(": header: unsupported version"));
  }
}

// Every prefix of the structured region, and a stride of prefixes through the data, fails
// cleanly with the file's name; the full file opens.
TEST(GgufTest, TruncationAtEveryOffsetFails) {
  TempDir dir;
  const std::string bytes = RichFile();
  ASSERT_TRUE(OpenBytes(dir, bytes).ok());
  const std::string path = dir.File("trunc.gguf");
  int checked = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    WriteFile(path, bytes.substr(0, n));
    absl::StatusOr<std::unique_ptr<GgufFile>> g = GgufFile::Open(path);
    ASSERT_FALSE(g.ok()) << "prefix of " << n << " bytes opened";
    EXPECT_THAT(Message(g.status()), StartsWith(path + ": ")) << n;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(bytes.size()));
}

// A file with one tensor and a large data section: prefixes every byte through the structure,
// then every 61st byte through 64 KB of data.
TEST(GgufTest, TruncationThroughLargeDataFails) {
  TempDir dir;
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "c"});
  std::vector<float> values(16384, 0.25f);
  w.AddF32Tensor("big", {128, 128}, values);
  w.AddTensor("tail.q8_0", DType::kQ8_0, {32}, Q8Block(0x3C00, 1));
  const std::string bytes = w.Build();
  ASSERT_TRUE(OpenBytes(dir, bytes).ok());
  const std::string path = dir.File("trunc.gguf");
  for (size_t n = 0; n < bytes.size(); n += (n < 512 ? 1 : 61)) {
    WriteFile(path, bytes.substr(0, n));
    absl::Status s = GgufFile::Open(path).status();
    ASSERT_FALSE(s.ok()) << n;
    EXPECT_THAT(Message(s), StartsWith(path + ": ")) << n;
  }
  WriteFile(path, bytes.substr(0, bytes.size() - 1));
  absl::Status s = GgufFile::Open(path).status();
  EXPECT_EQ(Message(s), path +
                            ": data: data [65536, +34) runs past end of file (data section "
                            "holds 65569 bytes) (tensor tail.q8_0)");
}

// Offsets in a file with no metadata and one tensor named "w" (f32, ne {32}):
//   0 magic, 4 version, 8 tensor count, 16 kv count, 24 name length, 32 "w",
//   33 n_dims, 37 ne[0], 45 type, 49 offset, 57 end of infos; data at 64.
std::string OneTensorFile() {
  GgufWriter w;
  w.AddF32Tensor("w", {32}, std::vector<float>(32, 1.0f));
  return w.Build();
}

TEST(GgufTest, AbsurdCountsFailFastInTheRightPhase) {
  TempDir dir;
  const std::string base = OneTensorFile();
  ASSERT_TRUE(OpenBytes(dir, base).ok());
  struct Case {
    const char* what;
    size_t offset;
    uint64_t value;
    bool u32;
    const char* expected;
  };
  const Case cases[] = {
      {"kv count 2^62", 16, 1ull << 62, false, ": header: metadata count 4611686018427387904"},
      {"tensor count 2^62", 8, 1ull << 62, false, ": header: tensor count 4611686018427387904"},
      {"tensor count 2", 8, 2, false, ": tensor infos: "},
      {"name length 2^62", 24, 1ull << 62, false,
       ": tensor infos: name length 4611686018427387904 at offset 24 runs past end of file"},
      {"n_dims 100", 33, 100, true, ": tensor infos: n_dims 100 exceeds 4 (tensor w)"},
      {"dim 2^40", 37, 1ull << 40, false, ": data: data [0, +4398046511104) runs past end of file"},
      {"dim 0", 37, 0, false, ": tensor infos: dimension 0 is 0; must be positive (tensor w)"},
      {"dim 2^63", 37, 1ull << 63, false, "must be positive (tensor w)"},
      {"type 99", 45, 99, true, ": tensor infos: unknown ggml type id 99 (tensor w)"},
      {"type Q8_1", 45, 9, true, "Q8_1 (id 9) is not supported by this build (tensor w)"},
      {"type IQ2_XXS", 45, 16, true, "IQ2_XXS (id 16) is not supported by this build (tensor w)"},
      {"type Q4_K on 32", 45, 12, true,
       ": tensor infos: innermost dimension 32 is not a multiple of the Q4_K block size 256"},
      {"offset past end", 49, 1ull << 20, false, ": data: data [1048576, +128) runs past end"},
      {"offset 2^64-32", 49, ~0ull - 31, false, "runs past end of file"},
      {"misaligned offset", 49, 4, false,
       ": data: data offset 4 is not a multiple of the alignment 32 (tensor w)"},
  };
  for (const Case& c : cases) {
    std::string bytes = base;
    if (c.u32) {
      PatchU32(&bytes, c.offset, static_cast<uint32_t>(c.value));
    } else {
      PatchU64(&bytes, c.offset, c.value);
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = OpenBytes(dir, bytes).status();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_THAT(Message(s), StartsWith(dir.File("t.gguf") + ": ")) << c.what;
    EXPECT_THAT(Message(s), HasSubstr(c.expected)) << c.what;
    EXPECT_LT(seconds, 1.0) << c.what;
  }
}

TEST(GgufTest, DimensionProductOverflowIsRejected) {
  TempDir dir;
  GgufWriter w;
  w.AddTensor("w", DType::kF32, {1ull << 40, 1ull << 40}, std::string(64, '\0'));
  absl::Status s = OpenBytes(dir, w.Build()).status();
  EXPECT_THAT(Message(s), HasSubstr(": tensor infos: element count overflows int64 (tensor w)"));
  // 2^61 f32 elements fit int64 but not the byte count.
  GgufWriter w2;
  w2.AddTensor("w", DType::kF32, {1ull << 31, 1ull << 30}, std::string(64, '\0'));
  s = OpenBytes(dir, w2.Build()).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s), HasSubstr("(tensor w)"));
}

TEST(GgufTest, BadMetadataFails) {
  TempDir dir;
  const std::string file = dir.File("t.gguf");
  auto expect_error = [&](GgufWriter& w, const std::string& expected) {
    absl::Status s = OpenBytes(dir, w.Build()).status();
    EXPECT_FALSE(s.ok()) << expected;
    EXPECT_THAT(Message(s), HasSubstr(expected)) << s;
    EXPECT_THAT(Message(s), StartsWith(file + ": "));
  };
  {
    // Key length 2^62 (written as the first 8 bytes of the entry).
    GgufWriter w;
    ByteWriter entry;
    entry.U64(1ull << 62);
    std::string bytes = w.Build();
    PatchU64(&bytes, 16, 1);  // one kv
    bytes += entry.bytes() + std::string(16, 'x');
    absl::Status s = OpenBytes(dir, bytes).status();
    EXPECT_THAT(Message(s),
                HasSubstr(": metadata: key length 4611686018427387904 at offset 24 runs past end "
                          "of file (16 bytes left) (entry 0)"));
  }
  {
    ByteWriter v;
    v.U64(1ull << 62);  // string value length
    GgufWriter w;
    w.AddRaw("k", static_cast<uint32_t>(GgufValue::kString), v.bytes() + "abc");
    expect_error(w, ": metadata: string length 4611686018427387904");
  }
  for (GgufValue element :
       {GgufValue::kU8, GgufValue::kString, GgufValue::kArray, GgufValue::kF64}) {
    ByteWriter v;
    v.U32(static_cast<uint32_t>(element));
    v.U64(1ull << 62);  // array length
    GgufWriter w;
    w.AddRaw("k", static_cast<uint32_t>(GgufValue::kArray), v.bytes() + "abcdefgh");
    expect_error(w, "runs past end of file (8 bytes left) (key k)");
  }
  {
    GgufWriter w;
    w.AddRaw("k", 13, "x");
    expect_error(w, ": metadata: unknown value type 13 (key k)");
  }
  {
    ByteWriter v;
    v.U32(77);
    v.U64(1);
    GgufWriter w;
    w.AddRaw("k", static_cast<uint32_t>(GgufValue::kArray), v.bytes() + "x");
    expect_error(w, ": metadata: unknown array element type 77 (key k)");
  }
  {
    GgufWriter w;
    w.AddRaw("k", static_cast<uint32_t>(GgufValue::kBool), "\x02");
    expect_error(w, ": metadata: bool value 2 is neither 0 nor 1 (key k)");
  }
  {
    GgufWriter w;
    w.AddU32("k", 1);
    w.AddU32("k", 2);
    expect_error(w, ": metadata: duplicate key (key k)");
  }
  {
    // Nine nested arrays: deeper than the reader allows.
    std::string value;
    for (int depth = 0; depth < 9; ++depth) {
      ByteWriter v;
      v.U32(static_cast<uint32_t>(GgufValue::kArray));
      v.U64(1);
      value = v.bytes() + value;
    }
    ByteWriter innermost;
    innermost.U32(static_cast<uint32_t>(GgufValue::kU8));
    innermost.U64(0);
    GgufWriter w;
    w.AddRaw("k", static_cast<uint32_t>(GgufValue::kArray), value + innermost.bytes());
    expect_error(w, "arrays nested deeper than 8 (key k)");
  }
}

TEST(GgufTest, BadTensorTablesFail) {
  TempDir dir;
  auto error_of = [&](const GgufWriter& w) { return Message(OpenBytes(dir, w.Build()).status()); };
  {
    GgufWriter w;
    w.AddF32Tensor("w", {32}, std::vector<float>(32));
    w.AddF32Tensor("w", {32}, std::vector<float>(32));
    EXPECT_THAT(error_of(w), HasSubstr(": tensor infos: duplicate tensor name (tensor w)"));
  }
  {
    GgufWriter w;
    w.AddTensor("q", DType::kQ8_0, {48, 2}, std::string(34 * 3, '\0'));
    EXPECT_THAT(error_of(w), HasSubstr("innermost dimension 48 is not a multiple of the Q8_0 "
                                       "block size 32 (tensor q)"));
  }
  for (uint32_t alignment : {0u, 3u, 48u}) {
    GgufWriter w(3, 32);
    w.AddU32("general.alignment", alignment);
    w.AddF32Tensor("w", {32}, std::vector<float>(32));
    EXPECT_THAT(error_of(w), HasSubstr(": data: alignment must be an integer power of two"))
        << alignment;
  }
  {
    GgufWriter w;
    w.AddString("general.alignment", "32");
    w.AddF32Tensor("w", {32}, std::vector<float>(32));
    EXPECT_THAT(error_of(w), HasSubstr("(key general.alignment)"));
  }
}

TEST(GgufTest, CustomAlignmentIsHonoured) {
  TempDir dir;
  // Header 24 + general.alignment entry 33 + info for "a" 33 = 90 bytes: the data starts at
  // 128 with alignment 64 but would start at 96 (zero padding) with the default 32.
  GgufWriter w(3, 64);
  w.AddF32Tensor("a", {3}, {1, 2, 3});
  absl::StatusOr<std::unique_ptr<GgufFile>> g = OpenBytes(dir, w.Build());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(*(*g)->ReadF32(*(*g)->FindTensor("a")), ::testing::ElementsAre(1, 2, 3));

  // A second tensor at offset 32 is aligned for 32 but not for 64. Its info ends the tensor
  // table at 123, so its offset field is bytes 115..122.
  GgufWriter w2(3, 64);
  w2.AddF32Tensor("a", {3}, {1, 2, 3});
  w2.AddF32Tensor("b", {2}, {4, 5});
  std::string bytes = w2.Build();
  uint64_t offset_b;
  std::memcpy(&offset_b, bytes.data() + 115, 8);
  ASSERT_EQ(offset_b, 64u);
  PatchU64(&bytes, 115, 32);
  EXPECT_THAT(Message(OpenBytes(dir, bytes).status()),
              HasSubstr(": data: data offset 32 is not a multiple of the alignment 64 (tensor b)"));
}

TEST(GgufTest, EmptyAndMetadataOnlyFiles) {
  TempDir dir;
  absl::Status s = OpenBytes(dir, "").status();
  EXPECT_EQ(Message(s), dir.File("t.gguf") +
                            ": header: file truncated: magic needs 4 bytes at offset 0 but the "
                            "file has 0");
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  absl::StatusOr<std::unique_ptr<GgufFile>> g = OpenBytes(dir, w.Build());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)->tensors().empty());
  s = GgufFile::Open(dir.File("missing.gguf")).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
}

TEST(DequantTraitsTest, TraitsAndSizes) {
  EXPECT_EQ(GetTypeTraits(DType::kQ4_1)->block_bytes, 20);
  EXPECT_EQ(GetTypeTraits(DType::kQ6_K)->block_elements, 256);
  EXPECT_EQ(*StorageBytes(DType::kQ4_K, 512), 288u);
  EXPECT_EQ(*StorageBytes(DType::kBF16, 3), 6u);
  EXPECT_TRUE(absl::IsInvalidArgument(StorageBytes(DType::kQ4_0, 33).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(StorageBytes(DType::kF32, -1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(StorageBytes(DType::kF32, int64_t{1} << 62).status()));
  EXPECT_TRUE(absl::IsUnimplemented(GetTypeTraits(DType::kQ8_1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(GetTypeTraits(static_cast<DType>(1000)).status()));
  float out[32];
  EXPECT_TRUE(absl::IsInvalidArgument(DequantizeRow(DType::kQ8_0, nullptr, 31, out)));
}

// The real default model (fetched by `make model`): the facts MODEL_NOTES.md lists, read
// through the reader, and every tensor dequantized (the values themselves are checked against
// gguf's dequantize in gguf_default_model_test.py).
TEST(GgufDefaultModelTest, OpensTheDefaultModel) {
  const std::string path = RIDGESERVE_DEFAULT_MODEL;
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path << " is missing: run `make model`";
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<GgufFile>> g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->tensors().size(), 272u);
  EXPECT_EQ(*(*g)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*g)->GetInt("llama.block_count"), 30);
  EXPECT_EQ(*(*g)->GetInt("llama.embedding_length"), 576);
  EXPECT_EQ((*g)->GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
  const TensorInfo* embd = (*g)->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, DType::kQ8_0);
  EXPECT_EQ(embd->shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ((*g)->FindTensor("output.weight"), nullptr);  // tied embeddings
  const TensorInfo* q = (*g)->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, DType::kQ4_1);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{576, 576}));
  double checksum = 0;
  for (const TensorInfo& t : (*g)->tensors()) {
    absl::StatusOr<std::vector<float>> values = (*g)->ReadF32(t);
    ASSERT_TRUE(values.ok()) << values.status();
    ASSERT_EQ(values->size(), static_cast<size_t>(t.num_elements));
    for (float v : *values) ASSERT_TRUE(std::isfinite(v)) << t.name;
    checksum += (*values)[0];
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("opened and dequantized all 272 tensors in %.2f s (checksum %g)\n", seconds,
              checksum);
  RecordProperty("load_seconds", std::to_string(seconds));
}

}  // namespace
}  // namespace ridgeserve
