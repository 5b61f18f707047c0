// Test-only writers for GGUF and safetensors files, written straight from the format specs
// (not from the readers), so tests can build tiny models in-process and corrupt them at will.
// Link target: rs_formats_test_writers.
#ifndef RIDGESERVE_TESTS_MODEL_FORMATS_TEST_WRITERS_H_
#define RIDGESERVE_TESTS_MODEL_FORMATS_TEST_WRITERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/tensor_source.h"

namespace ridgeserve::testing {

// Little-endian bytes, appended.
class ByteWriter {
 public:
  void U8(uint8_t v) { Put(&v, 1); }
  void U16(uint16_t v) { Put(&v, 2); }
  void U32(uint32_t v) { Put(&v, 4); }
  void U64(uint64_t v) { Put(&v, 8); }
  void I8(int8_t v) { Put(&v, 1); }
  void I16(int16_t v) { Put(&v, 2); }
  void I32(int32_t v) { Put(&v, 4); }
  void I64(int64_t v) { Put(&v, 8); }
  void F32(float v) { Put(&v, 4); }
  void F64(double v) { Put(&v, 8); }
  // GGUF string: u64 length + bytes.
  void Str(const std::string& s) {
    U64(s.size());
    Raw(s);
  }
  void Raw(const std::string& bytes) { bytes_ += bytes; }
  // Zero bytes up to the next multiple of `alignment`.
  void PadTo(uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back('\0');
  }
  size_t size() const { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }

 private:
  void Put(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  std::string bytes_;
};

// GGUF value type ids (spec).
enum class GgufValue : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Builds a GGUF file: header, metadata in insertion order, tensor infos, data. Tensor offsets
// are assigned in insertion order, each padded to the alignment; the last tensor ends the file
// (no trailing padding), so every truncation of the result is an error.
class GgufWriter {
 public:
  // `alignment` != 32 also writes general.alignment (u32) first.
  explicit GgufWriter(uint32_t version = 3, uint32_t alignment = 32);

  void AddU8(const std::string& key, uint8_t v);
  void AddI8(const std::string& key, int8_t v);
  void AddU16(const std::string& key, uint16_t v);
  void AddI16(const std::string& key, int16_t v);
  void AddU32(const std::string& key, uint32_t v);
  void AddI32(const std::string& key, int32_t v);
  void AddU64(const std::string& key, uint64_t v);
  void AddI64(const std::string& key, int64_t v);
  void AddF32(const std::string& key, float v);
  void AddF64(const std::string& key, double v);
  void AddBool(const std::string& key, bool v);
  void AddString(const std::string& key, const std::string& v);
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v);
  void AddF32Array(const std::string& key, const std::vector<float>& v);
  // Any value: `value` is its encoding after the u32 type id.
  void AddRaw(const std::string& key, uint32_t type, const std::string& value);

  // `ne` is innermost-first (ggml order); `data` is the stored bytes.
  void AddTensor(const std::string& name, DType type, const std::vector<uint64_t>& ne,
                 const std::string& data);
  // An F32 tensor of outermost-first `shape` (PyTorch order), row-major `values`.
  void AddF32Tensor(const std::string& name, const std::vector<int64_t>& shape,
                    const std::vector<float>& values);

  std::string Build() const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<uint64_t> ne;
    std::string data;
  };
  uint32_t version_;
  uint32_t alignment_;
  uint64_t kv_count_ = 0;
  ByteWriter kv_;
  std::vector<Tensor> tensors_;
};

// Builds a safetensors file: u64 header length, JSON header (padded with spaces to 8 bytes),
// data. Tensors are laid out in insertion order.
class SafetensorsWriter {
 public:
  // `dtype` as safetensors spells it ("F32", "BF16", ...); `data` is the stored bytes.
  void AddTensor(const std::string& name, const std::string& dtype,
                 const std::vector<int64_t>& shape, const std::string& data);
  void AddF32Tensor(const std::string& name, const std::vector<int64_t>& shape,
                    const std::vector<float>& values);
  void AddMetadata(const std::string& key, const std::string& value);
  std::string Build() const;

 private:
  struct Tensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string data;
  };
  std::vector<Tensor> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

// A fresh empty directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }
  // path()/name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes `bytes` to `path` (replacing it); aborts the test binary on I/O failure.
void WriteFile(const std::string& path, const std::string& bytes);

// Bytes of `values` as stored.
std::string F32Bytes(const std::vector<float>& values);
std::string U16Bytes(const std::vector<uint16_t>& values);

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_MODEL_FORMATS_TEST_WRITERS_H_
