#include "engine/ridgefill/map_file.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/model/mapped_file.h"
#include "engine/ridgefill/binary_io.h"
#include "engine/ridgefill/xxh64.h"

namespace ridgeserve {
namespace {

using binary_io::kArrayRefSize;

constexpr binary_io::Format kFormat = {{'R', 'F', 'M', 'A', 'P', 0, 0, 0},
                                       {'R', 'F', 'M', 'A', 'P', 'E', 'N', 'D'},
                                       kMapFileVersion,
                                       "map file"};
constexpr uint32_t kDtypeF32 = 0;
// Fixed metadata sizes, for bounding counts read from a file before allocating.
constexpr uint64_t kSplitRecordSize = 16 + 2 * kArrayRefSize;
constexpr uint64_t kTargetRecordSize = 32 + 3 * kArrayRefSize;

std::string ErrorPrefix(const std::string& path) { return absl::StrCat("map file ", path); }

absl::StatusOr<MapSet> ParseMetadata(binary_io::DataSection& data, binary_io::Decoder& dec,
                                     absl::string_view error_prefix) {
  const auto early = [&] { return data.Error("metadata ends early"); };
  MapSet maps;
  uint32_t num_layers, hidden, kv_heads, head_dim, kind, dtype, name_len, num_splits;
  if (!dec.U64(maps.model.hash) || !dec.U32(num_layers) || !dec.U32(hidden) || !dec.U32(kv_heads) ||
      !dec.U32(head_dim) || !dec.U32(kind) || !dec.U32(dtype) || !dec.U32(name_len)) {
    return early();
  }
  constexpr uint32_t kMaxI32 = std::numeric_limits<int32_t>::max();
  if (num_layers > kMaxI32 || hidden > kMaxI32 || kv_heads > kMaxI32 || head_dim > kMaxI32) {
    return data.Error("model dimensions out of range");
  }
  maps.model.num_layers = static_cast<int32_t>(num_layers);
  maps.model.hidden = static_cast<int32_t>(hidden);
  maps.num_kv_heads = static_cast<int32_t>(kv_heads);
  maps.head_dim = static_cast<int32_t>(head_dim);
  if (kind > static_cast<uint32_t>(MapTarget::kKv)) {
    return absl::InvalidArgumentError(
        absl::StrCat(error_prefix, ": unknown map target kind ", kind));
  }
  maps.kind = static_cast<MapTarget>(kind);
  if (dtype != kDtypeF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(error_prefix, ": unsupported dtype ", dtype, " (only f32)"));
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
                        data.View<float>(dec, absl::StrCat(where, " leverage inverse")));
    RS_ASSIGN_OR_RETURN(split.leverage_mean,
                        data.View<float>(dec, absl::StrCat(where, " leverage mean")));
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
      RS_ASSIGN_OR_RETURN(t.weight, data.View<float>(dec, absl::StrCat(twhere, " W")));
      RS_ASSIGN_OR_RETURN(t.bias, data.View<float>(dec, absl::StrCat(twhere, " b")));
      RS_ASSIGN_OR_RETURN(t.key_scale, data.View<float>(dec, absl::StrCat(twhere, " key scale")));
    }
  }
  if (dec.remaining() != 0) {
    return data.Error(absl::StrCat(dec.remaining(), " unread bytes after the metadata"));
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

bool SameModel(const ModelFingerprint& made_for, const ModelFingerprint& loaded) {
  return made_for.hash == loaded.hash && made_for.num_layers == loaded.num_layers &&
         made_for.hidden == loaded.hidden;
}

std::string DescribeModel(const ModelFingerprint& m) {
  return absl::StrCat("'", m.model_name, "' (fingerprint ", absl::StrFormat("%016x", m.hash), ", ",
                      m.num_layers, " layers, hidden ", m.hidden, ")");
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
  const std::string prefix = ErrorPrefix(path);
  if (absl::Status s = ValidateMapSet(maps); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": ", s.message()));
  }
  // Metadata size does not depend on the offsets, so lay out the data section first.
  uint64_t meta_size = 8 + 4 * 6 + 4 + maps.model.model_name.size() + 4;
  for (const SplitMaps& split : maps.splits) {
    meta_size += kSplitRecordSize + split.targets.size() * kTargetRecordSize;
  }
  binary_io::ArrayLayout arrays(binary_io::AlignUp(binary_io::kHeaderSize + meta_size));
  binary_io::Encoder meta;
  const auto place = [&](std::span<const float> a) { arrays.Place(a, meta); };
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
  return binary_io::WriteContainer(path, prefix, kFormat, meta, arrays);
}

absl::StatusOr<std::unique_ptr<MapFile>> MapFile::OpenImpl(const std::string& path,
                                                           const MapFileExpectations* expected) {
  const std::string prefix = ErrorPrefix(path);
  RS_ASSIGN_OR_RETURN(binary_io::Container c, binary_io::OpenContainer(path, prefix, kFormat));
  binary_io::DataSection data(c, prefix, binary_io::DataSection::Order::kAny);
  binary_io::Decoder dec = c.Metadata();
  RS_ASSIGN_OR_RETURN(MapSet maps, ParseMetadata(data, dec, prefix));

  if (expected != nullptr) {
    const ModelFingerprint& want = expected->model;
    if (!SameModel(maps.model, want)) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, " was made for model ", DescribeModel(maps.model),
                       ", but the loaded model is ", DescribeModel(want)));
    }
    if ((expected->num_kv_heads != 0 && maps.num_kv_heads != expected->num_kv_heads) ||
        (expected->head_dim != 0 && maps.head_dim != expected->head_dim)) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, ": made for ", maps.num_kv_heads, " KV heads of dim ", maps.head_dim,
          ", the loaded model has ", expected->num_kv_heads, " of dim ", expected->head_dim));
    }
  }
  if (absl::Status s = ValidateMapSet(maps); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": ", s.message()));
  }
  return std::unique_ptr<MapFile>(new MapFile(std::move(c.file), std::move(maps), c.checksum));
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
