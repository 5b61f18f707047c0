#include "tests/model/formats_test_writers.h"

#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"

namespace ridgeserve::testing {

GgufWriter::GgufWriter(uint32_t version, uint32_t alignment)
    : version_(version), alignment_(alignment) {
  if (alignment != 32) AddU32("general.alignment", alignment);
}

void GgufWriter::AddRaw(const std::string& key, uint32_t type, const std::string& value) {
  kv_.Str(key);
  kv_.U32(type);
  kv_.Raw(value);
  ++kv_count_;
}

#define RS_SCALAR_ADDER(Name, Type, Value)                           \
  void GgufWriter::Add##Name(const std::string& key, Type v) {       \
    ByteWriter w;                                                    \
    w.Name(v);                                                       \
    AddRaw(key, static_cast<uint32_t>(GgufValue::Value), w.bytes()); \
  }
RS_SCALAR_ADDER(U8, uint8_t, kU8)
RS_SCALAR_ADDER(I8, int8_t, kI8)
RS_SCALAR_ADDER(U16, uint16_t, kU16)
RS_SCALAR_ADDER(I16, int16_t, kI16)
RS_SCALAR_ADDER(U32, uint32_t, kU32)
RS_SCALAR_ADDER(I32, int32_t, kI32)
RS_SCALAR_ADDER(U64, uint64_t, kU64)
RS_SCALAR_ADDER(I64, int64_t, kI64)
RS_SCALAR_ADDER(F32, float, kF32)
RS_SCALAR_ADDER(F64, double, kF64)
#undef RS_SCALAR_ADDER

void GgufWriter::AddBool(const std::string& key, bool v) {
  AddRaw(key, static_cast<uint32_t>(GgufValue::kBool), std::string(1, v ? '\1' : '\0'));
}

void GgufWriter::AddString(const std::string& key, const std::string& v) {
  ByteWriter w;
  w.Str(v);
  AddRaw(key, static_cast<uint32_t>(GgufValue::kString), w.bytes());
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(GgufValue::kString));
  w.U64(v.size());
  for (const std::string& s : v) w.Str(s);
  AddRaw(key, static_cast<uint32_t>(GgufValue::kArray), w.bytes());
}

void GgufWriter::AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(GgufValue::kI32));
  w.U64(v.size());
  for (int32_t x : v) w.I32(x);
  AddRaw(key, static_cast<uint32_t>(GgufValue::kArray), w.bytes());
}

void GgufWriter::AddF32Array(const std::string& key, const std::vector<float>& v) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(GgufValue::kF32));
  w.U64(v.size());
  for (float x : v) w.F32(x);
  AddRaw(key, static_cast<uint32_t>(GgufValue::kArray), w.bytes());
}

void GgufWriter::AddTensor(const std::string& name, DType type, const std::vector<uint64_t>& ne,
                           const std::string& data) {
  tensors_.push_back({name, type, ne, data});
}

void GgufWriter::AddF32Tensor(const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<float>& values) {
  std::vector<uint64_t> ne(shape.rbegin(), shape.rend());
  AddTensor(name, DType::kF32, ne, F32Bytes(values));
}

std::string GgufWriter::Build() const {
  ByteWriter w;
  w.U32(0x46554747);  // "GGUF"
  w.U32(version_);
  w.U64(tensors_.size());
  w.U64(kv_count_);
  w.Raw(kv_.bytes());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    w.Str(t.name);
    w.U32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) w.U64(d);
    w.U32(static_cast<uint32_t>(t.type));
    w.U64(offset);
    offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  if (!tensors_.empty()) w.PadTo(alignment_);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    w.Raw(tensors_[i].data);
    if (i + 1 < tensors_.size()) w.PadTo(alignment_);
  }
  return w.bytes();
}

void SafetensorsWriter::AddTensor(const std::string& name, const std::string& dtype,
                                  const std::vector<int64_t>& shape, const std::string& data) {
  tensors_.push_back({name, dtype, shape, data});
}

void SafetensorsWriter::AddF32Tensor(const std::string& name, const std::vector<int64_t>& shape,
                                     const std::vector<float>& values) {
  AddTensor(name, "F32", shape, F32Bytes(values));
}

void SafetensorsWriter::AddMetadata(const std::string& key, const std::string& value) {
  metadata_.emplace_back(key, value);
}

std::string SafetensorsWriter::Build() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  std::string data;
  for (const Tensor& t : tensors_) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
    data += t.data;
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');
  ByteWriter w;
  w.U64(json.size());
  w.Raw(json);
  w.Raw(data);
  return w.bytes();
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/ridgeserve_test_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

std::string F32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * 4, '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::string U16Bytes(const std::vector<uint16_t>& values) {
  std::string bytes(values.size() * 2, '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace ridgeserve::testing
