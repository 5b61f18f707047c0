// safetensors layout: u64 header_length (little-endian), header_length bytes of JSON, then the
// data section. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
// end]} with offsets relative to the data section; "__metadata__" (free-form strings) is
// ignored. A sharded checkpoint adds model.safetensors.index.json whose "weight_map" names the
// shard file of every tensor.
//
// nlohmann::json parses with exceptions off, and every value's type is checked before it is
// read (get<> on a wrong type would throw), so no exception can leave this module.
#include "engine/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/model/mapped_file.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// Real headers are a few hundred KB even for thousands of tensors.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr uint64_t kMaxIndexBytes = uint64_t{100} << 20;
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// "<file>: <what>[ (tensor NAME)]".
absl::Status Invalid(absl::string_view file, absl::string_view what,
                     absl::string_view tensor = "") {
  std::string message = absl::StrCat(file, ": ", what);
  if (!tensor.empty()) absl::StrAppend(&message, " (tensor ", tensor, ")");
  return absl::InvalidArgumentError(message);
}

// Parses `text` as JSON without throwing; nullopt-like discarded value on a syntax error.
Json ParseJson(absl::string_view text) {
  return Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
}

struct Dtype {
  DType type;
  uint64_t bytes;
};

// Each tensor entry of a shard's header, checked against the data section of `file`.
absl::Status ParseTensorEntry(const MappedFile& file, const std::string& name, const Json& entry,
                              const uint8_t* data_section, uint64_t data_bytes, TensorInfo* info) {
  const std::string& path = file.path();
  if (!entry.is_object()) return Invalid(path, "header: entry is not an object", name);
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Invalid(path, "header: missing or non-string \"dtype\"", name);
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Invalid(path, "header: missing or non-array \"shape\"", name);
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return Invalid(path, "header: \"data_offsets\" must be two non-negative integers", name);
  }

  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  static const std::map<std::string, Dtype, std::less<>> kDtypes = {
      {"F32", {DType::kF32, 4}}, {"F16", {DType::kF16, 2}}, {"BF16", {DType::kBF16, 2}}};
  auto dtype = kDtypes.find(dtype_name);
  if (dtype == kDtypes.end()) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": header: dtype \"", dtype_name,
                     "\" is not supported (F32, F16, BF16 are) (tensor ", name, ")"));
  }

  info->name = name;
  info->type = dtype->second.type;
  info->shape.clear();
  int64_t num_elements = 1;
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(path, "header: shape entries must be non-negative integers", name);
    }
    const int64_t d = static_cast<int64_t>(dim.get<uint64_t>());
    if (d != 0 && num_elements > std::numeric_limits<int64_t>::max() / d) {
      return Invalid(path, "header: element count overflows int64", name);
    }
    num_elements *= d;
    info->shape.push_back(d);
  }
  info->num_elements = num_elements;

  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end || end > data_bytes) {
    return Invalid(
        path,
        absl::StrCat("header: data_offsets [", begin, ", ", end,
                     ") are reversed or run past the data section (", data_bytes, " bytes)"),
        name);
  }
  const uint64_t element_bytes = dtype->second.bytes;
  if (static_cast<uint64_t>(num_elements) > std::numeric_limits<uint64_t>::max() / element_bytes ||
      end - begin != static_cast<uint64_t>(num_elements) * element_bytes) {
    return Invalid(path,
                   absl::StrCat("header: data_offsets span ", end - begin, " bytes but shape x ",
                                dtype_name, " needs ", num_elements, " x ", element_bytes),
                   name);
  }
  info->data = data_section + begin;
  info->num_bytes = end - begin;
  return absl::OkStatus();
}

// Every tensor in one safetensors file, in data order.
absl::Status ParseShard(const MappedFile& file, std::vector<TensorInfo>* tensors) {
  const std::string& path = file.path();
  if (file.size() < 8) {
    return Invalid(path, absl::StrCat("file truncated: ", file.size(),
                                      " bytes cannot hold the 8-byte header length"));
  }
  uint64_t header_bytes;
  std::memcpy(&header_bytes, file.data(), 8);
  if (header_bytes > file.size() - 8) {
    return Invalid(path, absl::StrCat("header length ", header_bytes, " runs past end of file (",
                                      file.size(), " bytes)"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return Invalid(path, absl::StrCat("header length ", header_bytes, " exceeds the ",
                                      kMaxHeaderBytes, "-byte limit"));
  }
  const Json header =
      ParseJson(absl::string_view(reinterpret_cast<const char*>(file.data() + 8), header_bytes));
  if (header.is_discarded()) return Invalid(path, "header: not valid JSON");
  if (!header.is_object()) return Invalid(path, "header: JSON is not an object");

  const uint8_t* data_section = file.data() + 8 + header_bytes;
  const uint64_t data_bytes = file.size() - 8 - header_bytes;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    TensorInfo info;
    if (absl::Status s = ParseTensorEntry(file, name, entry, data_section, data_bytes, &info);
        !s.ok()) {
      return s;
    }
    tensors->push_back(std::move(info));
  }
  std::stable_sort(tensors->begin(), tensors->end(),
                   [](const TensorInfo& a, const TensorInfo& b) { return a.data < b.data; });
  return absl::OkStatus();
}

// The weight map of an index file: tensor name -> shard file name (a bare name in `dir`).
absl::StatusOr<std::map<std::string, std::string>> ParseIndex(const std::string& index_path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> index = MappedFile::Open(index_path);
  if (!index.ok()) return index.status();
  if ((*index)->size() > kMaxIndexBytes) {
    return Invalid(index_path, absl::StrCat("larger than ", kMaxIndexBytes, " bytes"));
  }
  const Json json = ParseJson(
      absl::string_view(reinterpret_cast<const char*>((*index)->data()), (*index)->size()));
  if (json.is_discarded()) return Invalid(index_path, "not valid JSON");
  if (!json.is_object()) return Invalid(index_path, "JSON is not an object");
  auto map_it = json.find("weight_map");
  if (map_it == json.end() || !map_it->is_object()) {
    return Invalid(index_path, "missing or non-object \"weight_map\"");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) return Invalid(index_path, "shard name is not a string", name);
    const std::string& file = shard.get_ref<const std::string&>();
    // Shards live next to the index; a path could point anywhere on the machine.
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
      return Invalid(index_path, absl::StrCat("shard name \"", file, "\" is not a bare file name"),
                     name);
    }
    weight_map.emplace(name, file);
  }
  if (weight_map.empty()) return Invalid(index_path, "\"weight_map\" is empty");
  return weight_map;
}

bool IsRegularFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace

struct SafetensorsModel::Impl {
  std::string path;
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> index;

  // Maps `file` and appends its tensors (those `keep` accepts).
  template <typename Keep>
  absl::Status AddShard(const std::string& file_path, Keep keep) {
    absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(file_path);
    if (!file.ok()) return file.status();
    std::vector<TensorInfo> shard_tensors;
    if (absl::Status s = ParseShard(**file, &shard_tensors); !s.ok()) return s;
    files.push_back(*std::move(file));
    for (TensorInfo& info : shard_tensors) {
      if (!keep(info.name)) continue;
      if (index.contains(info.name)) return Invalid(file_path, "duplicate tensor", info.name);
      index.emplace(info.name, tensors.size());
      tensors.push_back(std::move(info));
    }
    return absl::OkStatus();
  }
};

SafetensorsModel::SafetensorsModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsModel::~SafetensorsModel() = default;

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->path = dir;
  auto keep_all = [](const std::string&) { return true; };

  // Like transformers: a single file wins over an index; a file path is taken as is.
  const std::string single = absl::StrCat(dir, "/", kSingleFile);
  const std::string index_path = absl::StrCat(dir, "/", kIndexFile);
  if (IsRegularFile(dir)) {
    if (absl::Status s = impl->AddShard(dir, keep_all); !s.ok()) return s;
  } else if (IsRegularFile(single)) {
    if (absl::Status s = impl->AddShard(single, keep_all); !s.ok()) return s;
  } else if (IsRegularFile(index_path)) {
    absl::StatusOr<std::map<std::string, std::string>> weight_map = ParseIndex(index_path);
    if (!weight_map.ok()) return weight_map.status();
    std::map<std::string, int> shards;  // file name -> tensors the index puts there
    for (const auto& [name, shard] : *weight_map) ++shards[shard];
    for (const auto& [shard, expected] : shards) {
      const std::string shard_path = absl::StrCat(dir, "/", shard);
      if (!IsRegularFile(shard_path)) {
        return absl::NotFoundError(
            absl::StrCat(shard_path, ": shard listed in ", index_path, " does not exist"));
      }
      // The index is authoritative: a tensor is taken from the shard it names.
      // Captured by a named reference: clang 14 (the fuzz build) cannot capture a structured
      // binding.
      const std::string& this_shard = shard;
      auto listed_here = [&](const std::string& name) {
        auto it = weight_map->find(name);
        return it != weight_map->end() && it->second == this_shard;
      };
      if (absl::Status s = impl->AddShard(shard_path, listed_here); !s.ok()) return s;
    }
    for (const auto& [name, shard] : *weight_map) {
      if (!impl->index.contains(name)) {
        return Invalid(index_path, absl::StrCat("tensor is missing from shard ", shard), name);
      }
    }
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither ", kSingleFile, " nor ", kIndexFile, " found"));
  }
  return std::unique_ptr<SafetensorsModel>(new SafetensorsModel(std::move(impl)));
}

const std::string& SafetensorsModel::path() const { return impl_->path; }

const std::vector<TensorInfo>& SafetensorsModel::tensors() const { return impl_->tensors; }

const TensorInfo* SafetensorsModel::FindTensor(std::string_view name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

absl::StatusOr<std::vector<float>> SafetensorsModel::ReadF32(const TensorInfo& tensor) const {
  // Only bytes inside one of our mappings may be read.
  bool inside = false;
  for (const auto& file : impl_->files) {
    const uint8_t* begin = file->data();
    const uint8_t* end = begin + file->size();
    if (tensor.data >= begin && tensor.data <= end &&
        tensor.num_bytes <= static_cast<size_t>(end - tensor.data)) {
      inside = true;
      break;
    }
  }
  absl::StatusOr<size_t> needed = StorageBytes(tensor.type, tensor.num_elements);
  if (!inside || tensor.data == nullptr || !needed.ok() || *needed != tensor.num_bytes) {
    return Invalid(impl_->path, "tensor does not belong to this model", tensor.name);
  }
  std::vector<float> out(static_cast<size_t>(tensor.num_elements));
  absl::Status s = DequantizeRow(tensor.type, tensor.data, tensor.num_elements, out.data());
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(impl_->path, ": ", s.message(), " (tensor ", tensor.name, ")"));
  }
  return out;
}

}  // namespace ridgeserve
