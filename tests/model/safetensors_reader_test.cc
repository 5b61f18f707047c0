// SafetensorsModel on files from the spec-side writer in formats_test_writers and on hand-made
// broken headers: values of F32/F16/BF16, sharded checkpoints, and every way a header, an
// offset or an index can be wrong (each a Status naming the file and tensor, never a crash).
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/formats_test_writers.h"

namespace ridgeserve {
namespace {

using testing::ByteWriter;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SafetensorsWriter;
using ::testing::StartsWith;
using testing::TempDir;
using testing::WriteFile;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// u64 length + `json` + `data`, with no padding or checking: for broken headers.
std::string RawFile(const std::string& json, const std::string& data = "") {
  ByteWriter w;
  w.U64(json.size());
  w.Raw(json);
  w.Raw(data);
  return w.bytes();
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> OpenSingle(const TempDir& dir,
                                                             const std::string& bytes) {
  WriteFile(dir.File("model.safetensors"), bytes);
  return SafetensorsModel::Open(dir.path());
}

std::string GoodFile() {
  SafetensorsWriter w;
  w.AddMetadata("format", "pt");
  // Data order differs from name order: "model.c" comes first in the file.
  // bf16: 1, -3, 2^-126 (smallest normal), 0x7F61 (about 3.0e38).
  w.AddTensor("model.c", "BF16", {2, 2}, testing::U16Bytes({0x3F80, 0xC040, 0x0080, 0x7F61}));
  w.AddF32Tensor("model.a", {2, 3}, {1, 2, 3, 4, 5, 6});
  // f16: 1, -2, 65504, 2^-24 (smallest subnormal).
  w.AddTensor("model.b", "F16", {4}, testing::U16Bytes({0x3C00, 0xC000, 0x7BFF, 0x0001}));
  w.AddTensor("model.empty", "F32", {0, 3}, "");
  w.AddTensor("model.scalar", "F32", {}, testing::F32Bytes({7.5f}));
  return w.Build();
}

TEST(SafetensorsTest, ReadsF32F16BF16) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m = OpenSingle(dir, GoodFile());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->path(), dir.path());
  ASSERT_EQ((*m)->tensors().size(), 5u);
  // In data order, not in JSON key order.
  EXPECT_EQ((*m)->tensors()[0].name, "model.c");
  EXPECT_EQ((*m)->tensors()[1].name, "model.a");

  const TensorInfo* a = (*m)->FindTensor("model.a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_THAT(*(*m)->ReadF32(*a), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(*(*m)->ReadF32(*(*m)->FindTensor("model.b")),
              ElementsAre(1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24)));
  uint32_t big_bits = 0x7F610000u;
  float big;
  std::memcpy(&big, &big_bits, 4);
  EXPECT_THAT(*(*m)->ReadF32(*(*m)->FindTensor("model.c")),
              ElementsAre(1.0f, -3.0f, std::ldexp(1.0f, -126), big));
  const TensorInfo* empty = (*m)->FindTensor("model.empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->num_elements, 0);
  EXPECT_TRUE((*m)->ReadF32(*empty)->empty());
  const TensorInfo* scalar = (*m)->FindTensor("model.scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_THAT(*(*m)->ReadF32(*scalar), ElementsAre(7.5f));
  EXPECT_EQ((*m)->FindTensor("__metadata__"), nullptr);
  EXPECT_EQ((*m)->FindTensor("missing"), nullptr);

  // A file path works as well as its directory.
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> by_file =
      SafetensorsModel::Open(dir.File("model.safetensors"));
  ASSERT_TRUE(by_file.ok()) << by_file.status();
  EXPECT_EQ((*by_file)->tensors().size(), 5u);
}

TEST(SafetensorsTest, TruncationAtEveryOffsetFails) {
  TempDir dir;
  const std::string bytes = GoodFile();
  const std::string path = dir.File("model.safetensors");
  for (size_t n = 0; n < bytes.size(); ++n) {
    WriteFile(path, bytes.substr(0, n));
    absl::Status s = SafetensorsModel::Open(dir.path()).status();
    ASSERT_FALSE(s.ok()) << "prefix of " << n << " bytes opened";
    EXPECT_THAT(Message(s), StartsWith(path + ": ")) << n;
  }
}

TEST(SafetensorsTest, AbsurdHeaderLengths) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  std::string bytes = GoodFile();
  const uint64_t huge = 1ull << 62;
  std::memcpy(bytes.data(), &huge, 8);
  EXPECT_THAT(Message(OpenSingle(dir, bytes).status()),
              HasSubstr(": header length 4611686018427387904 runs past end of file"));
  const uint64_t one_past = bytes.size() - 8 + 1;
  std::memcpy(bytes.data(), &one_past, 8);
  EXPECT_THAT(Message(OpenSingle(dir, bytes).status()), HasSubstr("runs past end of file"));

  // A (sparse) 101 MiB file whose header claims 100 MiB + 1: refused before parsing.
  const uint64_t over_limit = (100ull << 20) + 1;
  ByteWriter w;
  w.U64(over_limit);
  WriteFile(path, w.bytes());
  ASSERT_EQ(::truncate(path.c_str(), 101ll << 20), 0);
  absl::Status s = SafetensorsModel::Open(dir.path()).status();
  EXPECT_THAT(Message(s), HasSubstr("header length 104857601 exceeds the 104857600-byte limit"));
}

TEST(SafetensorsTest, BadHeadersFail) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  const std::string data(24, '\0');
  struct Case {
    std::string json;
    std::string expected;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  const Case cases[] = {
      {R"({"a": {"dtype": "F32", "shape": [2], )", ": header: not valid JSON"},
      {R"([1, 2])", ": header: JSON is not an object"},
      {R"({"a": 5})", ": header: entry is not an object (tensor a)"},
      {R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", "missing or non-string \"dtype\""},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 8]}})", "missing or non-array \"shape\""},
      {R"({"a": {"dtype": "F32", "shape": [2]}})", "\"data_offsets\" must be two"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}})",
       "\"data_offsets\" must be two"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})",
       "\"data_offsets\" must be two"},
      {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
       "shape entries must be non-negative integers (tensor a)"},
      {R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
       "shape entries must be non-negative integers"},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
       "element count overflows int64 (tensor a)"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})",
       "data_offsets [8, 0) are reversed or run past the data section (24 bytes) (tensor a)"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]}})",
       "data_offsets [24, 32) are reversed or run past the data section (24 bytes)"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551615]}})",
       "run past the data section"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       "data_offsets span 8 bytes but shape x F32 needs 3 x 4 (tensor a)"},
      {R"({"a": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 8]}})",
       "data_offsets span 8 bytes"},
      {R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
       ": header: dtype \"I64\" is not supported (F32, F16, BF16 are) (tensor a)",
       absl::StatusCode::kUnimplemented},
      {R"({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 8]}})", "dtype \"Q9\"",
       absl::StatusCode::kUnimplemented},
      {R"({"a": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})",
       "missing or non-string \"dtype\""},
  };
  for (const Case& c : cases) {
    absl::Status s = OpenSingle(dir, RawFile(c.json, data)).status();
    EXPECT_EQ(s.code(), c.code) << c.json << "\n" << s;
    EXPECT_THAT(Message(s), StartsWith(path + ": ")) << c.json;
    EXPECT_THAT(Message(s), HasSubstr(c.expected)) << c.json;
  }
  // Header length 0 and a header of only spaces are not JSON objects either.
  EXPECT_FALSE(OpenSingle(dir, RawFile("", data)).ok());
  EXPECT_FALSE(OpenSingle(dir, RawFile("        ", data)).ok());
  EXPECT_FALSE(OpenSingle(dir, "").ok());
}

// Two shards and an index, as Hugging Face writes them.
void WriteSharded(const TempDir& dir, const std::string& index_json) {
  SafetensorsWriter s1, s2;
  s1.AddF32Tensor("layer.0.w", {2}, {1, 2});
  s1.AddF32Tensor("layer.0.b", {1}, {3});
  s2.AddF32Tensor("layer.1.w", {2}, {4, 5});
  WriteFile(dir.File("model-00001-of-00002.safetensors"), s1.Build());
  WriteFile(dir.File("model-00002-of-00002.safetensors"), s2.Build());
  WriteFile(dir.File("model.safetensors.index.json"), index_json);
}

constexpr char kIndex[] = R"({"metadata": {"total_size": 20}, "weight_map": {
  "layer.0.w": "model-00001-of-00002.safetensors",
  "layer.0.b": "model-00001-of-00002.safetensors",
  "layer.1.w": "model-00002-of-00002.safetensors"}})";

TEST(SafetensorsTest, ReadsShardedCheckpoints) {
  TempDir dir;
  WriteSharded(dir, kIndex);
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->tensors().size(), 3u);
  EXPECT_THAT(*(*m)->ReadF32(*(*m)->FindTensor("layer.0.b")), ElementsAre(3));
  EXPECT_THAT(*(*m)->ReadF32(*(*m)->FindTensor("layer.1.w")), ElementsAre(4, 5));

  // A TensorInfo from another model is refused.
  TempDir other;
  WriteSharded(other, kIndex);
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m2 = SafetensorsModel::Open(other.path());
  ASSERT_TRUE(m2.ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*m)->ReadF32((*m2)->tensors()[0]).status()));
}

TEST(SafetensorsTest, BadIndexesFail) {
  TempDir dir;
  const std::string index = dir.File("model.safetensors.index.json");
  {
    WriteSharded(dir, R"({"weight_map": {"x": "model-00003-of-00002.safetensors"}})");
    absl::Status s = SafetensorsModel::Open(dir.path()).status();
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_EQ(Message(s), dir.File("model-00003-of-00002.safetensors") + ": shard listed in " +
                              index + " does not exist");
  }
  {
    WriteSharded(dir, R"({"weight_map": {"layer.9.w": "model-00001-of-00002.safetensors"}})");
    EXPECT_EQ(Message(SafetensorsModel::Open(dir.path()).status()),
              index +
                  ": tensor is missing from shard model-00001-of-00002.safetensors (tensor "
                  "layer.9.w)");
  }
  {
    WriteSharded(dir, R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
    EXPECT_THAT(Message(SafetensorsModel::Open(dir.path()).status()),
                HasSubstr("is not a bare file name (tensor a)"));
  }
  for (const char* bad : {R"({"weight_map": )", R"({"metadata": {}})", R"({"weight_map": [1]})",
                          R"({"weight_map": {}})", R"({"weight_map": {"a": 1}})", "[]"}) {
    WriteSharded(dir, bad);
    absl::Status s = SafetensorsModel::Open(dir.path()).status();
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_THAT(Message(s), StartsWith(index + ": ")) << bad;
  }
  {
    // A broken shard is reported under the shard's own name.
    WriteSharded(dir, kIndex);
    WriteFile(dir.File("model-00002-of-00002.safetensors"), "short");
    EXPECT_THAT(Message(SafetensorsModel::Open(dir.path()).status()),
                StartsWith(dir.File("model-00002-of-00002.safetensors") + ": file truncated"));
  }
  TempDir empty;
  absl::Status s = SafetensorsModel::Open(empty.path()).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(Message(s), HasSubstr("neither model.safetensors nor"));
}

}  // namespace
}  // namespace ridgeserve
