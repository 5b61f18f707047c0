#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/tensor_source.h"
#include "engine/ridgefill/map_file.h"

namespace ridgeserve {
namespace {

// An in-memory tensor table: the fingerprint reads only names, types, shapes and bytes.
class TableSource : public TensorSource {
 public:
  void Add(std::string name, DType type, std::vector<int64_t> shape, size_t bytes, uint8_t fill) {
    storage_.push_back(std::vector<uint8_t>(bytes));
    for (size_t i = 0; i < bytes; ++i) storage_.back()[i] = static_cast<uint8_t>(fill + i * 7);
    TensorInfo t;
    t.name = std::move(name);
    t.type = type;
    t.shape = std::move(shape);
    t.num_elements = 1;
    for (int64_t d : t.shape) t.num_elements *= d;
    t.num_bytes = bytes;
    tensors_.push_back(std::move(t));
    Relink();
  }
  std::vector<uint8_t>& bytes(size_t i) { return storage_[i]; }
  std::vector<TensorInfo>& mutable_tensors() { return tensors_; }
  void Reverse() {
    std::reverse(tensors_.begin(), tensors_.end());
    std::reverse(storage_.begin(), storage_.end());
    Relink();
  }

  const std::string& path() const override { return path_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  absl::StatusOr<std::vector<float>> ReadF32(const TensorInfo&) const override {
    return absl::UnimplementedError("not needed");
  }

 private:
  void Relink() {
    for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].data = storage_[i].data();
  }
  std::string path_ = "<memory>";
  std::vector<std::vector<uint8_t>> storage_;
  std::vector<TensorInfo> tensors_;
};

TableSource MakeTable() {
  TableSource s;
  s.Add("blk.0.attn_q.weight", DType::kQ4_1, {64, 64}, 20000, 1);
  s.Add("token_embd.weight", DType::kF16, {100, 64}, 12800, 2);
  s.Add("output_norm.weight", DType::kF32, {64}, 256, 3);
  return s;
}

TEST(FingerprintTest, SensitiveToWhatIdentifiesAModel) {
  const uint64_t base = TensorTableHash(MakeTable());
  {
    TableSource s = MakeTable();
    s.Reverse();  // file order does not matter
    EXPECT_EQ(TensorTableHash(s), base);
  }
  {
    TableSource s = MakeTable();
    s.bytes(0)[100] ^= 1;  // first 4 KiB
    EXPECT_NE(TensorTableHash(s), base);
  }
  {
    TableSource s = MakeTable();
    s.bytes(0)[19999] ^= 1;  // last 4 KiB
    EXPECT_NE(TensorTableHash(s), base);
  }
  {
    TableSource s = MakeTable();
    s.bytes(0)[10000] ^= 1;  // the unsampled middle: documented blind spot
    EXPECT_EQ(TensorTableHash(s), base);
  }
  {
    TableSource s = MakeTable();
    s.mutable_tensors()[1].shape = {64, 100};
    EXPECT_NE(TensorTableHash(s), base);
  }
  {
    TableSource s = MakeTable();
    s.mutable_tensors()[1].type = DType::kBF16;
    EXPECT_NE(TensorTableHash(s), base);
  }
  {
    TableSource s = MakeTable();
    s.mutable_tensors()[2].name = "output_norm.bias";
    EXPECT_NE(TensorTableHash(s), base);
  }
  const ModelFingerprint fp = ComputeModelFingerprint(MakeTable(), "m", 30, 576);
  EXPECT_EQ(fp.hash, base);
  EXPECT_EQ(fp.model_name, "m");
  EXPECT_EQ(fp.num_layers, 30);
  EXPECT_EQ(fp.hidden, 576);
}

TEST(FingerprintTest, DefaultModelIsStable) {
  const std::string path = RIDGESERVE_DEFAULT_MODEL;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no default model at " << path;
  auto a = GgufFile::Open(path);
  auto b = GgufFile::Open(path);
  ASSERT_TRUE(a.ok() && b.ok());
  const uint64_t ha = TensorTableHash(**a);
  EXPECT_EQ(ha, TensorTableHash(**b));
  EXPECT_NE(ha, 0u);
  EXPECT_NE(ha, TensorTableHash(MakeTable()));
}

}  // namespace
}  // namespace ridgeserve
