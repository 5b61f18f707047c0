#include "engine/ridgefill/map_file.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/model/mapped_file.h"
#include "engine/ridgefill/xxh64.h"

namespace ridgeserve {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the map file is little-endian and read in place");

constexpr char kMagic[8] = {'R', 'F', 'M', 'A', 'P', 0, 0, 0};
constexpr char kTrailerMagic[8] = {'R', 'F', 'M', 'A', 'P', 'E', 'N', 'D'};
constexpr uint64_t kHeaderSize = 64;
constexpr uint64_t kTrailerSize = 16;
constexpr uint64_t kAlign = 64;
constexpr uint32_t kDtypeF32 = 0;
// Fixed metadata sizes, for bounding counts read from a file before allocating.
constexpr uint64_t kArrayRefSize = 16;
constexpr uint64_t kSplitRecordSize = 16 + 2 * kArrayRefSize;
constexpr uint64_t kTargetRecordSize = 32 + 3 * kArrayRefSize;

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string Describe(const ModelFingerprint& m) {
  return absl::StrCat("'", m.model_name, "' (fingerprint ", Hex(m.hash), ", ", m.num_layers,
                      " layers, hidden ", m.hidden, ")");
}

// ---- Writing -------------------------------------------------------------------------------

// Little-endian encoder into a byte string (the metadata block).
class Encoder {
 public:
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void Raw(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Writes to a FILE*, hashing and counting every byte; the first failure sticks.
class HashingWriter {
 public:
  explicit HashingWriter(std::FILE* f) : f_(f) {}
  void Write(const void* p, size_t n) {
    if (!ok_ || n == 0) return;
    hash_.Update(p, n);
    pos_ += n;
    ok_ = std::fwrite(p, 1, n, f_) == n;
  }
  void PadTo(uint64_t offset) {
    static constexpr char kZeros[kAlign] = {};
    while (pos_ < offset) Write(kZeros, std::min<uint64_t>(kAlign, offset - pos_));
  }
  bool ok() const { return ok_; }
  uint64_t pos() const { return pos_; }
  uint64_t digest() const { return hash_.Digest(); }

 private:
  std::FILE* f_;
  Xxh64 hash_;
  uint64_t pos_ = 0;
  bool ok_ = true;
};

struct PlacedArray {
  std::span<const float> data;
  uint64_t offset;
};

// ---- Reading -------------------------------------------------------------------------------

// Bounds-checked little-endian reads over the metadata block.
class Decoder {
 public:
  Decoder(const uint8_t* p, uint64_t size) : p_(p), size_(size) {}
  uint64_t remaining() const { return size_ - pos_; }
  bool U32(uint32_t& v) { return Raw(&v, 4); }
  bool U64(uint64_t& v) { return Raw(&v, 8); }
  bool F32(float& v) { return Raw(&v, 4); }
  bool Raw(void* out, uint64_t n) {
    if (n > remaining()) return false;
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
    return true;
  }
  bool String(uint64_t n, std::string& out) {
    if (n > remaining()) return false;
    out.assign(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

struct FileView {
  const std::string& path;
  const uint8_t* base;
  uint64_t data_offset;
  uint64_t payload_end;  // first byte of the trailer

  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("map file ", path, ": ", what));
  }

  // Resolves an array reference to a view into the file, checking it lies inside the data.
  absl::StatusOr<std::span<const float>> Array(Decoder& dec, const std::string& what) const {
    uint64_t offset = 0, count = 0;
    if (!dec.U64(offset) || !dec.U64(count)) return Error("metadata ends early");
    if (count == 0) {
      if (offset != 0) return Error(absl::StrCat(what, ": empty array with offset ", offset));
      return std::span<const float>();
    }
    if (offset % kAlign != 0 || offset < data_offset || offset > payload_end ||
        count > (payload_end - offset) / sizeof(float)) {
      return Error(absl::StrCat(what, ": array of ", count, " floats at offset ", offset,
                                " lies outside the data section [", data_offset, ", ", payload_end,
                                ")"));
    }
    return std::span<const float>(reinterpret_cast<const float*>(base + offset), count);
  }
};

absl::StatusOr<MapSet> ParseMetadata(const FileView& view, Decoder& dec) {
  const auto early = [&] { return view.Error("metadata ends early"); };
  MapSet maps;
  uint32_t num_layers, hidden, kv_heads, head_dim, kind, dtype, name_len, num_splits;
  if (!dec.U64(maps.model.hash) || !dec.U32(num_layers) || !dec.U32(hidden) || !dec.U32(kv_heads) ||
      !dec.U32(head_dim) || !dec.U32(kind) || !dec.U32(dtype) || !dec.U32(name_len)) {
    return early();
  }
  constexpr uint32_t kMaxI32 = std::numeric_limits<int32_t>::max();
  if (num_layers > kMaxI32 || hidden > kMaxI32 || kv_heads > kMaxI32 || head_dim > kMaxI32) {
    return view.Error("model dimensions out of range");
  }
  maps.model.num_layers = static_cast<int32_t>(num_layers);
  maps.model.hidden = static_cast<int32_t>(hidden);
  maps.num_kv_heads = static_cast<int32_t>(kv_heads);
  maps.head_dim = static_cast<int32_t>(head_dim);
  if (kind > static_cast<uint32_t>(MapTarget::kKv)) {
    return absl::InvalidArgumentError(
        absl::StrCat("map file ", view.path, ": unknown map target kind ", kind));
  }
  maps.kind = static_cast<MapTarget>(kind);
  if (dtype != kDtypeF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("map file ", view.path, ": unsupported dtype ", dtype, " (only f32)"));
  }
  if (!dec.String(name_len, maps.model.model_name) || !dec.U32(num_splits)) return early();
  if (num_splits > dec.remaining() / kSplitRecordSize) return early();
  maps.splits.resize(num_splits);
  for (uint32_t s = 0; s < num_splits; ++s) {
    SplitMaps& split = maps.splits[s];
    uint32_t layer, num_targets, zero;
    if (!dec.U32(layer) || !dec.U32(num_targets) || !dec.F32(split.leverage_lambda) ||
        !dec.U32(zero)) {
      return early();
    }
    split.split_layer = static_cast<int32_t>(std::min(layer, kMaxI32));
    const std::string where = absl::StrCat("split ", layer);
    RS_ASSIGN_OR_RETURN(split.leverage_inverse,
                        view.Array(dec, absl::StrCat(where, " leverage inverse")));
    RS_ASSIGN_OR_RETURN(split.leverage_mean,
                        view.Array(dec, absl::StrCat(where, " leverage mean")));
    if (num_targets > dec.remaining() / kTargetRecordSize) return early();
    split.targets.resize(num_targets);
    for (TargetMap& t : split.targets) {
      uint32_t tl, out_dim;
      MapDiagnostics& g = t.diagnostics;
      if (!dec.U32(tl) || !dec.U32(out_dim) || !dec.F32(t.lambda) || !dec.F32(g.r2) ||
          !dec.F32(g.k_cos) || !dec.F32(g.v_cos) || !dec.F32(g.key_norm_ratio) ||
          !dec.F32(g.attn_cos)) {
        return early();
      }
      t.layer = static_cast<int32_t>(std::min(tl, kMaxI32));
      t.out_dim = static_cast<int32_t>(std::min(out_dim, kMaxI32));
      const std::string twhere = absl::StrCat(where, " layer ", tl);
      RS_ASSIGN_OR_RETURN(t.weight, view.Array(dec, absl::StrCat(twhere, " W")));
      RS_ASSIGN_OR_RETURN(t.bias, view.Array(dec, absl::StrCat(twhere, " b")));
      RS_ASSIGN_OR_RETURN(t.key_scale, view.Array(dec, absl::StrCat(twhere, " key scale")));
    }
  }
  if (dec.remaining() != 0) {
    return view.Error(absl::StrCat(dec.remaining(), " unread bytes after the metadata"));
  }
  return maps;
}

}  // namespace

std::string_view MapTargetName(MapTarget kind) {
  switch (kind) {
    case MapTarget::kPreNorm:
      return "pre_norm";
    case MapTarget::kPostNorm:
      return "post_norm";
    case MapTarget::kKv:
      return "kv";
  }
  return "unknown";
}

absl::StatusOr<MapTarget> ParseMapTarget(std::string_view name) {
  for (MapTarget k : {MapTarget::kPreNorm, MapTarget::kPostNorm, MapTarget::kKv}) {
    if (name == MapTargetName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown map target '", std::string(name), "' (pre_norm, post_norm or kv)"));
}

uint64_t TensorTableHash(const TensorSource& source) {
  constexpr size_t kSample = 4096;
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : source.tensors()) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->name < b->name; });
  Xxh64 h;
  static constexpr char kDomain[] = "ridgeserve model fingerprint v1";
  h.Update(kDomain, sizeof(kDomain));
  const uint64_t count = order.size();
  h.Update(&count, 8);
  for (const TensorInfo* t : order) {
    const uint64_t name_len = t->name.size();
    h.Update(&name_len, 8);
    h.Update(t->name.data(), t->name.size());
    const uint32_t type = static_cast<uint32_t>(t->type);
    h.Update(&type, 4);
    const uint64_t rank = t->shape.size();
    h.Update(&rank, 8);
    h.Update(t->shape.data(), t->shape.size() * sizeof(int64_t));
    const uint64_t bytes = t->num_bytes;
    h.Update(&bytes, 8);
    if (t->data == nullptr) continue;
    const size_t head = std::min(kSample, t->num_bytes);
    h.Update(t->data, head);
    // The last 4 KiB, without re-reading bytes the head already covered.
    const size_t tail_start = std::max(head, t->num_bytes - std::min(kSample, t->num_bytes));
    h.Update(t->data + tail_start, t->num_bytes - tail_start);
  }
  return h.Digest();
}

ModelFingerprint ComputeModelFingerprint(const TensorSource& source, std::string model_name,
                                         int32_t num_layers, int32_t hidden) {
  return ModelFingerprint{TensorTableHash(source), std::move(model_name), num_layers, hidden};
}

absl::Status ValidateMapSet(const MapSet& maps) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent maps: ", parts...));
  };
  const int64_t layers = maps.model.num_layers;
  const int64_t hidden = maps.model.hidden;
  if (layers < 3 || hidden <= 0) {
    return bad("a model needs >= 3 layers and hidden > 0 for RidgeFill, got ", layers,
               " layers and hidden ", hidden);
  }
  if (maps.num_kv_heads < 0 || maps.head_dim < 0) {
    return bad("negative num_kv_heads or head_dim");
  }
  const int64_t kv_dim = int64_t{maps.num_kv_heads} * maps.head_dim;
  if (maps.kind == MapTarget::kKv && kv_dim == 0) {
    return bad("kv maps need num_kv_heads and head_dim");
  }
  const int64_t expected_out = maps.kind == MapTarget::kKv ? 2 * kv_dim : hidden;
  std::set<int32_t> seen;
  for (const SplitMaps& split : maps.splits) {
    const int32_t s = split.split_layer;
    if (s < 0 || s > layers - 3) {
      return bad("split layer ", s, " outside [0, ", layers - 3, "] for a ", layers,
                 "-layer model");
    }
    if (!seen.insert(s).second) return bad("split layer ", s, " appears twice");
    if (split.targets.empty()) return bad("split ", s, " has no target layers");
    const bool has_inverse = !split.leverage_inverse.empty();
    const bool has_mean = !split.leverage_mean.empty();
    if (has_inverse != has_mean ||
        (has_inverse && (split.leverage_inverse.size() != static_cast<size_t>(hidden * hidden) ||
                         split.leverage_mean.size() != static_cast<size_t>(hidden)))) {
      return bad("split ", s, ": leverage inverse has ", split.leverage_inverse.size(),
                 " floats and mean ", split.leverage_mean.size(), ", expected ", hidden * hidden,
                 " and ", hidden, " (or both empty)");
    }
    if (!std::isfinite(split.leverage_lambda) || split.leverage_lambda < 0) {
      return bad("split ", s, ": leverage λ ", split.leverage_lambda, " not finite and >= 0");
    }
    int32_t previous = s + 1;
    for (const TargetMap& t : split.targets) {
      if (t.layer <= previous || t.layer >= layers) {
        return bad("split ", s, ": target layer ", t.layer, " not in [", s + 2, ", ", layers,
                   ") or not ascending");
      }
      previous = t.layer;
      if (t.out_dim != expected_out) {
        return bad("split ", s, " layer ", t.layer, ": out_dim ", t.out_dim, ", expected ",
                   expected_out, " for ", std::string(MapTargetName(maps.kind)), " maps");
      }
      if (t.weight.size() != static_cast<size_t>(int64_t{t.out_dim} * hidden) ||
          t.bias.size() != static_cast<size_t>(t.out_dim)) {
        return bad("split ", s, " layer ", t.layer, ": W has ", t.weight.size(), " floats and b ",
                   t.bias.size(), ", expected ", int64_t{t.out_dim} * hidden, " and ", t.out_dim);
      }
      if (!t.key_scale.empty() && t.key_scale.size() != static_cast<size_t>(maps.num_kv_heads)) {
        return bad("split ", s, " layer ", t.layer, ": ", t.key_scale.size(), " key scales for ",
                   maps.num_kv_heads, " KV heads");
      }
      if (!std::isfinite(t.lambda) || t.lambda < 0) {
        return bad("split ", s, " layer ", t.layer, ": λ ", t.lambda, " not finite and >= 0");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteMapFile(const std::string& path, const MapSet& maps) {
  if (absl::Status s = ValidateMapSet(maps); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("map file ", path, ": ", s.message()));
  }
  // Metadata size does not depend on the offsets, so lay out the data section first.
  uint64_t meta_size = 8 + 4 * 6 + 4 + maps.model.model_name.size() + 4;
  for (const SplitMaps& split : maps.splits) {
    meta_size += kSplitRecordSize + split.targets.size() * kTargetRecordSize;
  }
  const uint64_t data_offset = AlignUp(kHeaderSize + meta_size);
  std::vector<PlacedArray> arrays;
  uint64_t end = data_offset;
  Encoder meta;
  const auto place = [&](std::span<const float> a) {
    if (a.empty()) {
      meta.U64(0);
      meta.U64(0);
      return;
    }
    const uint64_t offset = AlignUp(end);
    arrays.push_back({a, offset});
    end = offset + a.size_bytes();
    meta.U64(offset);
    meta.U64(a.size());
  };
  meta.U64(maps.model.hash);
  meta.U32(maps.model.num_layers);
  meta.U32(maps.model.hidden);
  meta.U32(maps.num_kv_heads);
  meta.U32(maps.head_dim);
  meta.U32(static_cast<uint32_t>(maps.kind));
  meta.U32(kDtypeF32);
  meta.U32(static_cast<uint32_t>(maps.model.model_name.size()));
  meta.Raw(maps.model.model_name.data(), maps.model.model_name.size());
  meta.U32(static_cast<uint32_t>(maps.splits.size()));
  for (const SplitMaps& split : maps.splits) {
    meta.U32(split.split_layer);
    meta.U32(static_cast<uint32_t>(split.targets.size()));
    meta.F32(split.leverage_lambda);
    meta.U32(0);
    place(split.leverage_inverse);
    place(split.leverage_mean);
    for (const TargetMap& t : split.targets) {
      meta.U32(t.layer);
      meta.U32(t.out_dim);
      meta.F32(t.lambda);
      const MapDiagnostics& g = t.diagnostics;
      for (float v : {g.r2, g.k_cos, g.v_cos, g.key_norm_ratio, g.attn_cos}) meta.F32(v);
      place(t.weight);
      place(t.bias);
      place(t.key_scale);
    }
  }
  if (meta.bytes().size() != meta_size) {
    return absl::InternalError("map file metadata size mismatch");  // a bug in this file
  }
  const uint64_t file_size = end + kTrailerSize;

  Encoder header;
  header.Raw(kMagic, 8);
  header.U32(kMapFileVersion);
  header.U32(kHeaderSize);
  header.U64(file_size);
  header.U64(kHeaderSize);
  header.U64(meta_size);
  header.U64(data_offset);
  header.U64(0);
  header.U64(0);

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("map file ", path, ": cannot create ", tmp, ": ", std::strerror(errno)));
  }
  HashingWriter w(f);
  w.Write(header.bytes().data(), header.bytes().size());
  w.Write(meta.bytes().data(), meta.bytes().size());
  for (const PlacedArray& a : arrays) {
    w.PadTo(a.offset);
    w.Write(a.data.data(), a.data.size_bytes());
  }
  const uint64_t digest = w.digest();
  w.Write(&digest, 8);
  w.Write(kTrailerMagic, 8);
  const bool written = w.ok() && w.pos() == file_size;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(
        "map file ", path, ": write failed: ", std::strerror(written ? errno : write_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("map file ", path, ": rename from ", tmp, " failed: ", std::strerror(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MapFile>> MapFile::OpenImpl(const std::string& path,
                                                           const MapFileExpectations* expected) {
  RS_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const uint8_t* base = file->data();
  const uint64_t size = file->size();
  const auto data_loss = [&](auto&&... parts) {
    return absl::DataLossError(absl::StrCat("map file ", path, ": ", parts...));
  };
  const auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("map file ", path, ": ", parts...));
  };
  const auto u32_at = [&](uint64_t off) {
    uint32_t v;
    std::memcpy(&v, base + off, 4);
    return v;
  };
  const auto u64_at = [&](uint64_t off) {
    uint64_t v;
    std::memcpy(&v, base + off, 8);
    return v;
  };

  if (size < sizeof(kMagic)) return data_loss("truncated: ", size, " bytes, no header");
  if (std::memcmp(base, kMagic, sizeof(kMagic)) != 0) {
    return invalid("not a RidgeFill map file (bad magic)");
  }
  if (size < 12) return data_loss("truncated: ", size, " bytes, no version");
  if (const uint32_t version = u32_at(8); version != kMapFileVersion) {
    return invalid("unsupported map file version ", version, " (this build reads version ",
                   kMapFileVersion, ")");
  }
  if (size < kHeaderSize + kTrailerSize) {
    return data_loss("truncated: ", size, " bytes, smaller than header and trailer");
  }
  const uint64_t declared_size = u64_at(16);
  if (declared_size != size) {
    return data_loss(declared_size > size ? "truncated: " : "trailing bytes: ", "header says ",
                     declared_size, " bytes, the file has ", size);
  }
  const uint64_t payload_end = size - kTrailerSize;
  if (std::memcmp(base + payload_end + 8, kTrailerMagic, sizeof(kTrailerMagic)) != 0) {
    return data_loss("trailer missing or damaged");
  }
  const uint64_t stored = u64_at(payload_end);
  const uint64_t computed = Xxh64Hash(base, payload_end);
  if (stored != computed) {
    return data_loss("checksum mismatch (stored ", Hex(stored), ", computed ", Hex(computed),
                     "): the file is corrupted");
  }
  // The checksum vouches for the bytes, not for the writer: check the layout anyway.
  const uint32_t header_size = u32_at(12);
  const uint64_t meta_offset = u64_at(24);
  const uint64_t meta_size = u64_at(32);
  const uint64_t data_offset = u64_at(40);
  if (header_size != kHeaderSize || meta_offset != kHeaderSize ||
      meta_size > payload_end - meta_offset || data_offset % kAlign != 0 ||
      data_offset < meta_offset + meta_size || data_offset > payload_end) {
    return data_loss("malformed header (metadata at ", meta_offset, " size ", meta_size,
                     ", data at ", data_offset, ", ", size, " bytes in all)");
  }
  FileView view{path, base, data_offset, payload_end};
  Decoder dec(base + meta_offset, meta_size);
  RS_ASSIGN_OR_RETURN(MapSet maps, ParseMetadata(view, dec));

  if (expected != nullptr) {
    const ModelFingerprint& want = expected->model;
    if (maps.model.hash != want.hash || maps.model.num_layers != want.num_layers ||
        maps.model.hidden != want.hidden) {
      return absl::FailedPreconditionError(
          absl::StrCat("map file ", path, " was made for model ", Describe(maps.model),
                       ", but the loaded model is ", Describe(want)));
    }
    if ((expected->num_kv_heads != 0 && maps.num_kv_heads != expected->num_kv_heads) ||
        (expected->head_dim != 0 && maps.head_dim != expected->head_dim)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "map file ", path, ": made for ", maps.num_kv_heads, " KV heads of dim ", maps.head_dim,
          ", the loaded model has ", expected->num_kv_heads, " of dim ", expected->head_dim));
    }
  }
  if (absl::Status s = ValidateMapSet(maps); !s.ok()) return invalid(s.message());
  return std::unique_ptr<MapFile>(new MapFile(std::move(file), std::move(maps), stored));
}

absl::StatusOr<std::unique_ptr<MapFile>> MapFile::Open(const std::string& path,
                                                       const MapFileExpectations& expected) {
  return OpenImpl(path, &expected);
}

absl::StatusOr<std::unique_ptr<MapFile>> MapFile::OpenUnchecked(const std::string& path) {
  return OpenImpl(path, nullptr);
}

MapFile::MapFile(std::unique_ptr<MappedFile> file, MapSet maps, uint64_t checksum)
    : file_(std::move(file)), maps_(std::move(maps)), checksum_(checksum) {}

MapFile::~MapFile() = default;

const std::string& MapFile::path() const { return file_->path(); }

const SplitMaps* MapFile::FindSplit(int32_t split_layer) const {
  for (const SplitMaps& s : maps_.splits) {
    if (s.split_layer == split_layer) return &s;
  }
  return nullptr;
}

}  // namespace ridgeserve
