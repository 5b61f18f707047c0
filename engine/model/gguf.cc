// GGUF layout (v2 and v3 are identical on little-endian files; v3 only added big-endian ones,
// which this reader refuses; v1 used u32 counts and is refused too):
//
//   header        u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
//   metadata      kv_count x { string key, u32 value_type, value }
//   tensor infos  tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
//   padding       to general.alignment (default 32)
//   data          tensor bytes at data_start + offset, each offset a multiple of the alignment
//
// string = u64 length + bytes (no terminator). array = u32 element type + u64 count + elements
// (arrays may nest). ne[0] is the innermost (contiguous) dimension.
//
// Parsing validates everything once; the metadata table keeps only where each value lies in
// the mapped file, so the getters decode from bytes already known to be in bounds.
#include "engine/model/gguf.h"

#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/model/mapped_file.h"
#include "kernels/dtype.h"

namespace ridgeserve {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;
// Nested arrays are legal but nothing real nests deeply; bounding the depth bounds the stack.
constexpr int kMaxArrayDepth = 8;
// Smallest encodings, used to bound counts by the bytes left before looping over them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset

enum class ValueType : uint32_t {
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
constexpr uint32_t kMaxValueType = 12;

absl::string_view ValueTypeName(ValueType type) {
  static constexpr absl::string_view kNames[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                                 "i32", "f32", "bool", "string", "array",
                                                 "u64", "i64", "f64"};
  return kNames[static_cast<uint32_t>(type)];
}

// Bytes of a fixed-size value; 0 for string and array.
uint64_t FixedSize(ValueType type) {
  switch (type) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

// Smallest encoding of one value: a string is at least its length, an array its header.
uint64_t MinSize(ValueType type) {
  if (type == ValueType::kString) return 8;
  if (type == ValueType::kArray) return 4 + 8;
  return FixedSize(type);
}

bool IsInteger(ValueType type) {
  switch (type) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

bool IsFloat(ValueType type) { return type == ValueType::kF32 || type == ValueType::kF64; }

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Where one metadata value lies in the file. For arrays, `offset` is the first element.
struct MetaEntry {
  ValueType type = ValueType::kU8;
  size_t offset = 0;
  ValueType element_type = ValueType::kU8;  // arrays only
  uint64_t count = 0;                       // arrays only
};

// Integer value of a validated integer field; nullopt for a u64 above INT64_MAX.
std::optional<int64_t> DecodeInt(ValueType type, const uint8_t* p) {
  switch (type) {
    case ValueType::kU8:
      return Load<uint8_t>(p);
    case ValueType::kI8:
      return Load<int8_t>(p);
    case ValueType::kU16:
      return Load<uint16_t>(p);
    case ValueType::kI16:
      return Load<int16_t>(p);
    case ValueType::kU32:
      return Load<uint32_t>(p);
    case ValueType::kI32:
      return Load<int32_t>(p);
    case ValueType::kI64:
      return Load<int64_t>(p);
    case ValueType::kU64: {
      const uint64_t v = Load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    default:
      return std::nullopt;
  }
}

// Float value of a validated numeric field (integers convert; u64 above 2^53 rounds).
double DecodeNumber(ValueType type, const uint8_t* p) {
  if (type == ValueType::kF32) return Load<float>(p);
  if (type == ValueType::kF64) return Load<double>(p);
  if (type == ValueType::kU64) return static_cast<double>(Load<uint64_t>(p));
  return static_cast<double>(*DecodeInt(type, p));
}

// "<path>: <phase>: <what>[ (<context>)]", the shape of every error this file returns.
std::string Message(absl::string_view path, absl::string_view phase, absl::string_view what,
                    absl::string_view context) {
  std::string message = absl::StrCat(path, ": ", phase, ": ", what);
  if (!context.empty()) absl::StrAppend(&message, " (", context, ")");
  return message;
}

// Reads the file front to back. `phase_` and `context_` name what is being read, so every
// failure says where it happened.
class Parser {
 public:
  explicit Parser(const MappedFile& file) : file_(file), bytes_(file.bytes()) {}

  size_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  void set_phase(absl::string_view phase) { phase_ = phase; }
  void set_context(std::string context) { context_ = std::move(context); }

  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(Message(file_.path(), phase_, what, context_));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(Message(file_.path(), phase_, what, context_));
  }

  // Fails unless `n` more bytes exist; never reads them.
  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= remaining()) return absl::OkStatus();
    return Invalid(absl::StrCat("file truncated: ", what, " needs ", n, " bytes at offset ", pos_,
                                " but the file has ", bytes_.size()));
  }

  absl::Status Skip(uint64_t n, absl::string_view what) {
    if (absl::Status s = Need(n, what); !s.ok()) return s;
    pos_ += n;
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    if (absl::Status s = Need(sizeof(T), what); !s.ok()) return s;
    const T v = Load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<absl::string_view> ReadString(absl::string_view what) {
    absl::StatusOr<uint64_t> length = Read<uint64_t>(what);
    if (!length.ok()) return length.status();
    if (*length > remaining()) {
      return Invalid(absl::StrCat(what, " length ", *length, " at offset ", pos_ - 8,
                                  " runs past end of file (", remaining(), " bytes left)"));
    }
    absl::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), *length);
    pos_ += *length;
    return s;
  }

  absl::StatusOr<ValueType> ReadValueType(absl::string_view what) {
    absl::StatusOr<uint32_t> type = Read<uint32_t>(what);
    if (!type.ok()) return type.status();
    if (*type > kMaxValueType) return Invalid(absl::StrCat("unknown ", what, " ", *type));
    return static_cast<ValueType>(*type);
  }

  // Validates one value of `type` and steps over it. For an array, records its element type,
  // count and first element in `entry` (when given).
  absl::Status SkipValue(ValueType type, int depth, MetaEntry* entry) {
    if (type == ValueType::kString) return ReadString("string").status();
    if (type == ValueType::kBool) {
      absl::StatusOr<uint8_t> b = Read<uint8_t>("bool");
      if (!b.ok()) return b.status();
      if (*b > 1) return Invalid(absl::StrCat("bool value ", *b, " is neither 0 nor 1"));
      return absl::OkStatus();
    }
    if (type != ValueType::kArray) return Skip(FixedSize(type), ValueTypeName(type));

    if (depth >= kMaxArrayDepth) {
      return Invalid(absl::StrCat("arrays nested deeper than ", kMaxArrayDepth));
    }
    absl::StatusOr<ValueType> element_type = ReadValueType("array element type");
    if (!element_type.ok()) return element_type.status();
    absl::StatusOr<uint64_t> count = Read<uint64_t>("array length");
    if (!count.ok()) return count.status();
    // Bound the count by the bytes left before looping or multiplying.
    if (*count > remaining() / MinSize(*element_type)) {
      return Invalid(absl::StrCat("array of ", *count, " ", ValueTypeName(*element_type),
                                  " runs past end of file (", remaining(), " bytes left)"));
    }
    if (entry != nullptr) {
      entry->element_type = *element_type;
      entry->count = *count;
      entry->offset = pos_;
    }
    if (*element_type == ValueType::kBool || !FixedSize(*element_type)) {
      for (uint64_t i = 0; i < *count; ++i) {
        if (absl::Status s = SkipValue(*element_type, depth + 1, nullptr); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    return Skip(*count * FixedSize(*element_type), "array");
  }

 private:
  const MappedFile& file_;
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  absl::string_view phase_ = "header";
  std::string context_;
};

}  // namespace

struct GgufFile::Impl {
  std::unique_ptr<MappedFile> file;
  uint32_t version = 0;
  std::map<std::string, MetaEntry, std::less<>> metadata;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;

  absl::Status KeyError(absl::StatusCode code, std::string_view key, absl::string_view what) const {
    return absl::Status(
        code, Message(file->path(), "metadata", what, absl::StrCat("key ", std::string(key))));
  }

  // The entry for `key`, or NotFound.
  absl::StatusOr<const MetaEntry*> Find(std::string_view key) const {
    auto it = metadata.find(key);
    if (it == metadata.end()) return KeyError(absl::StatusCode::kNotFound, key, "not found");
    return &it->second;
  }

  absl::Status WrongType(std::string_view key, const MetaEntry& entry,
                         absl::string_view wanted) const {
    std::string actual(ValueTypeName(entry.type));
    if (entry.type == ValueType::kArray) {
      actual = absl::StrCat("array of ", ValueTypeName(entry.element_type));
    }
    return KeyError(absl::StatusCode::kInvalidArgument, key,
                    absl::StrCat("is ", actual, ", not ", wanted));
  }

  // Decodes the validated string at `*offset` and advances past it.
  std::string StringAt(size_t* offset) const {
    const uint64_t length = Load<uint64_t>(file->data() + *offset);
    std::string s(reinterpret_cast<const char*>(file->data() + *offset + 8), length);
    *offset += 8 + length;
    return s;
  }
};

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  auto impl = std::make_unique<Impl>();
  impl->file = *std::move(mapped);
  const MappedFile& file = *impl->file;
  Parser p(file);

  // ---- header
  p.set_phase("header");
  absl::StatusOr<uint32_t> magic = p.Read<uint32_t>("magic");
  if (!magic.ok()) return magic.status();
  if (*magic != kMagic) return p.Invalid("bad magic: not a GGUF file");
  absl::StatusOr<uint32_t> version = p.Read<uint32_t>("version");
  if (!version.ok()) return version.status();
  if (*version != 2 && *version != 3) {
    // A big-endian file's version 3 reads as 0x03000000 here.
    return p.Unsupported(
        absl::StrCat("unsupported version ", *version, " (supported: 2 and 3, little-endian)"));
  }
  impl->version = *version;
  absl::StatusOr<uint64_t> tensor_count = p.Read<uint64_t>("tensor count");
  if (!tensor_count.ok()) return tensor_count.status();
  absl::StatusOr<uint64_t> kv_count = p.Read<uint64_t>("metadata count");
  if (!kv_count.ok()) return kv_count.status();
  if (*kv_count > p.remaining() / kMinKvBytes) {
    return p.Invalid(absl::StrCat("metadata count ", *kv_count, " cannot fit in the ",
                                  p.remaining(), " bytes left"));
  }
  if (*tensor_count > p.remaining() / kMinTensorInfoBytes) {
    return p.Invalid(absl::StrCat("tensor count ", *tensor_count, " cannot fit in the ",
                                  p.remaining(), " bytes left"));
  }

  // ---- metadata
  p.set_phase("metadata");
  for (uint64_t i = 0; i < *kv_count; ++i) {
    p.set_context(absl::StrCat("entry ", i));
    absl::StatusOr<absl::string_view> key = p.ReadString("key");
    if (!key.ok()) return key.status();
    p.set_context(absl::StrCat("key ", *key));
    if (impl->metadata.contains(*key)) return p.Invalid("duplicate key");
    absl::StatusOr<ValueType> type = p.ReadValueType("value type");
    if (!type.ok()) return type.status();
    MetaEntry entry;
    entry.type = *type;
    entry.offset = p.pos();
    if (absl::Status s = p.SkipValue(*type, 0, &entry); !s.ok()) return s;
    impl->metadata.emplace(std::string(*key), entry);
  }
  p.set_context("");

  // ---- tensor infos
  p.set_phase("tensor infos");
  if (*tensor_count > p.remaining() / kMinTensorInfoBytes) {
    return p.Invalid(absl::StrCat("tensor count ", *tensor_count, " cannot fit in the ",
                                  p.remaining(), " bytes left"));
  }
  std::vector<uint64_t> offsets;
  impl->tensors.reserve(*tensor_count);
  offsets.reserve(*tensor_count);
  for (uint64_t i = 0; i < *tensor_count; ++i) {
    p.set_context(absl::StrCat("tensor #", i));
    absl::StatusOr<absl::string_view> name = p.ReadString("name");
    if (!name.ok()) return name.status();
    p.set_context(absl::StrCat("tensor ", *name));
    if (impl->tensor_index.contains(*name)) return p.Invalid("duplicate tensor name");
    absl::StatusOr<uint32_t> n_dims = p.Read<uint32_t>("n_dims");
    if (!n_dims.ok()) return n_dims.status();
    if (*n_dims > kMaxDims) {
      return p.Invalid(absl::StrCat("n_dims ", *n_dims, " exceeds ", kMaxDims));
    }
    TensorInfo info;
    info.name = std::string(*name);
    info.shape.resize(*n_dims);
    int64_t num_elements = 1;
    for (uint32_t d = 0; d < *n_dims; ++d) {
      absl::StatusOr<uint64_t> ne = p.Read<uint64_t>("dimension");
      if (!ne.ok()) return ne.status();
      if (*ne == 0 || *ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return p.Invalid(absl::StrCat("dimension ", d, " is ", *ne, "; must be positive"));
      }
      const int64_t dim = static_cast<int64_t>(*ne);
      if (num_elements > std::numeric_limits<int64_t>::max() / dim) {
        return p.Invalid("element count overflows int64");
      }
      num_elements *= dim;
      info.shape[*n_dims - 1 - d] = dim;  // ne is innermost-first; shape is outermost-first
    }
    info.num_elements = num_elements;
    absl::StatusOr<uint32_t> type_id = p.Read<uint32_t>("type");
    if (!type_id.ok()) return type_id.status();
    info.type = static_cast<DType>(*type_id);
    absl::StatusOr<TypeTraits> traits = GetTypeTraits(info.type);
    if (!traits.ok()) {
      const std::string what(traits.status().message());
      return absl::IsUnimplemented(traits.status()) ? p.Unsupported(what) : p.Invalid(what);
    }
    // Blocks never straddle rows: ggml requires the innermost dimension to be whole blocks.
    const int64_t row = *n_dims == 0 ? 1 : info.shape.back();
    if (row % traits->block_elements != 0) {
      return p.Invalid(absl::StrCat("innermost dimension ", row, " is not a multiple of the ",
                                    std::string(traits->name), " block size ",
                                    traits->block_elements));
    }
    absl::StatusOr<size_t> num_bytes = StorageBytes(info.type, num_elements);
    if (!num_bytes.ok()) return p.Invalid(num_bytes.status().message());
    info.num_bytes = *num_bytes;
    absl::StatusOr<uint64_t> offset = p.Read<uint64_t>("data offset");
    if (!offset.ok()) return offset.status();
    offsets.push_back(*offset);
    impl->tensor_index.emplace(info.name, impl->tensors.size());
    impl->tensors.push_back(std::move(info));
  }
  p.set_context("");

  // ---- data
  p.set_phase("data");
  uint64_t alignment = kDefaultAlignment;
  if (auto it = impl->metadata.find("general.alignment"); it != impl->metadata.end()) {
    p.set_context("key general.alignment");
    const MetaEntry& entry = it->second;
    std::optional<int64_t> value;
    if (IsInteger(entry.type)) value = DecodeInt(entry.type, file.data() + entry.offset);
    // Powers of two only, as ggml requires; 1 GiB caps the padding arithmetic below.
    if (!value || *value <= 0 || *value > (int64_t{1} << 30) || (*value & (*value - 1)) != 0) {
      return p.Invalid("alignment must be an integer power of two no larger than 2^30");
    }
    alignment = static_cast<uint64_t>(*value);
    p.set_context("");
  }
  const uint64_t data_start = (p.pos() + alignment - 1) / alignment * alignment;
  const uint64_t file_size = file.size();
  if (!impl->tensors.empty() && data_start > file_size) {
    return p.Invalid(absl::StrCat("data section at offset ", data_start,
                                  " starts past end of file (", file_size, " bytes)"));
  }
  for (size_t i = 0; i < impl->tensors.size(); ++i) {
    TensorInfo& info = impl->tensors[i];
    p.set_context(absl::StrCat("tensor ", info.name));
    if (offsets[i] % alignment != 0) {
      return p.Invalid(absl::StrCat("data offset ", offsets[i],
                                    " is not a multiple of the alignment ", alignment));
    }
    const uint64_t available = file_size - data_start;
    if (offsets[i] > available || info.num_bytes > available - offsets[i]) {
      return p.Invalid(absl::StrCat("data [", offsets[i], ", +", info.num_bytes,
                                    ") runs past end of file (data section holds ", available,
                                    " bytes)"));
    }
    info.data = file.data() + data_start + offsets[i];
  }
  return std::unique_ptr<GgufFile>(new GgufFile(std::move(impl)));
}

uint32_t GgufFile::version() const { return impl_->version; }

bool GgufFile::Has(std::string_view key) const { return impl_->metadata.contains(key); }

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  if (!IsInteger((*entry)->type)) return impl_->WrongType(key, **entry, "an integer");
  std::optional<int64_t> value = DecodeInt((*entry)->type, impl_->file->data() + (*entry)->offset);
  if (!value) {
    return impl_->KeyError(absl::StatusCode::kOutOfRange, key, "u64 value does not fit in int64");
  }
  return *value;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  const ValueType type = (*entry)->type;
  if (!IsFloat(type) && !IsInteger(type)) return impl_->WrongType(key, **entry, "a number");
  return DecodeNumber(type, impl_->file->data() + (*entry)->offset);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  if ((*entry)->type != ValueType::kBool) return impl_->WrongType(key, **entry, "a bool");
  return impl_->file->data()[(*entry)->offset] != 0;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  if ((*entry)->type != ValueType::kString) return impl_->WrongType(key, **entry, "a string");
  size_t offset = (*entry)->offset;
  return impl_->StringAt(&offset);
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  const MetaEntry& e = **entry;
  if (e.type != ValueType::kArray || e.element_type != ValueType::kString) {
    return impl_->WrongType(key, e, "an array of string");
  }
  std::vector<std::string> values;
  values.reserve(e.count);
  size_t offset = e.offset;
  for (uint64_t i = 0; i < e.count; ++i) values.push_back(impl_->StringAt(&offset));
  return values;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  const MetaEntry& e = **entry;
  if (e.type != ValueType::kArray || !IsInteger(e.element_type)) {
    return impl_->WrongType(key, e, "an array of integers");
  }
  const size_t size = FixedSize(e.element_type);
  std::vector<int64_t> values(e.count);
  for (uint64_t i = 0; i < e.count; ++i) {
    std::optional<int64_t> value =
        DecodeInt(e.element_type, impl_->file->data() + e.offset + i * size);
    if (!value) {
      return impl_->KeyError(absl::StatusCode::kOutOfRange, key,
                             absl::StrCat("element ", i, " does not fit in int64"));
    }
    values[i] = *value;
  }
  return values;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  absl::StatusOr<const MetaEntry*> entry = impl_->Find(key);
  if (!entry.ok()) return entry.status();
  const MetaEntry& e = **entry;
  if (e.type != ValueType::kArray || (!IsFloat(e.element_type) && !IsInteger(e.element_type))) {
    return impl_->WrongType(key, e, "an array of numbers");
  }
  const size_t size = FixedSize(e.element_type);
  std::vector<double> values(e.count);
  for (uint64_t i = 0; i < e.count; ++i) {
    values[i] = DecodeNumber(e.element_type, impl_->file->data() + e.offset + i * size);
  }
  return values;
}

const std::string& GgufFile::path() const { return impl_->file->path(); }

const std::vector<TensorInfo>& GgufFile::tensors() const { return impl_->tensors; }

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

absl::StatusOr<std::vector<float>> GgufFile::ReadF32(const TensorInfo& tensor) const {
  // A TensorInfo from another source (or a hand-made one) must not make us read foreign memory.
  const uint8_t* begin = impl_->file->data();
  const uint8_t* end = begin + impl_->file->size();
  if (tensor.data == nullptr || tensor.data < begin || tensor.data > end ||
      tensor.num_bytes > static_cast<size_t>(end - tensor.data)) {
    return absl::InvalidArgumentError(
        Message(path(), "data", "tensor does not belong to this file", "tensor " + tensor.name));
  }
  absl::StatusOr<size_t> needed = StorageBytes(tensor.type, tensor.num_elements);
  if (!needed.ok() || *needed != tensor.num_bytes) {
    return absl::InvalidArgumentError(
        Message(path(), "data", "tensor size does not match its type", "tensor " + tensor.name));
  }
  std::vector<float> out(static_cast<size_t>(tensor.num_elements));
  absl::Status s = DequantizeRow(tensor.type, tensor.data, tensor.num_elements, out.data());
  if (!s.ok()) {
    return absl::Status(s.code(), Message(path(), "data", s.message(), "tensor " + tensor.name));
  }
  return out;
}

}  // namespace ridgeserve
