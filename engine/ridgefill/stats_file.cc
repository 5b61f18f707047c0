#include "engine/ridgefill/stats_file.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/binary_io.h"

namespace ridgeserve {
namespace {

using binary_io::kArrayRefSize;

constexpr binary_io::Format kFormat = {{'R', 'F', 'S', 'T', 'A', 'T', 'S', 0},
                                       {'R', 'F', 'S', 'T', 'S', 'E', 'N', 'D'},
                                       kStatsFileVersion,
                                       "calibration stats file"};
// Fixed metadata sizes, for bounding counts read from a file before allocating.
constexpr uint64_t kSplitRecordSize = 2 * 4 + 4 * 8 + 4 * kArrayRefSize;
constexpr uint64_t kTargetRecordSize = 4 + 3 * kArrayRefSize;

absl::StatusOr<StatsSet> ParseMetadata(binary_io::DataSection& data, binary_io::Decoder& dec,
                                       const std::string& path) {
  const auto early = [&] { return data.Error("metadata ends early"); };
  StatsSet set;
  uint32_t num_layers, hidden, kind, name_len, num_splits;
  if (!dec.U64(set.model.hash) || !dec.U32(num_layers) || !dec.U32(hidden) || !dec.U32(kind) ||
      !dec.U32(name_len)) {
    return early();
  }
  constexpr uint32_t kMaxI32 = std::numeric_limits<int32_t>::max();
  if (num_layers > kMaxI32 || hidden > kMaxI32) {
    return data.Error("model dimensions out of range");
  }
  set.model.num_layers = static_cast<int32_t>(num_layers);
  set.model.hidden = static_cast<int32_t>(hidden);
  if (kind > static_cast<uint32_t>(MapTarget::kKv)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unknown map target kind ", kind));
  }
  set.kind = static_cast<MapTarget>(kind);
  if (!dec.String(name_len, set.model.model_name) || !dec.U32(num_splits)) return early();
  if (num_splits > dec.remaining() / kSplitRecordSize) return early();
  set.splits.resize(num_splits);
  for (SplitStats& split : set.splits) {
    uint32_t layer, num_targets;
    CalibrationStats& s = split.stats;
    if (!dec.U32(layer) || !dec.U32(num_targets) || !dec.I64(split.seen_rows) ||
        !dec.I64(split.holdout_stride) || !dec.I64(s.rows) || !dec.I64(s.holdout_rows)) {
      return early();
    }
    split.split_layer = static_cast<int32_t>(std::min(layer, kMaxI32));
    s.dim = hidden;
    const std::string where = absl::StrCat("split ", layer);
    RS_RETURN_IF_ERROR(data.Copy(dec, absl::StrCat(where, " mean"), s.mean));
    RS_RETURN_IF_ERROR(data.Copy(dec, absl::StrCat(where, " Gram"), s.gram));
    RS_RETURN_IF_ERROR(
        data.Copy(dec, absl::StrCat(where, " hold-out row index"), s.holdout_row_index));
    RS_RETURN_IF_ERROR(data.Copy(dec, absl::StrCat(where, " hold-out x"), s.holdout_x));
    if (num_targets > dec.remaining() / kTargetRecordSize) return early();
    s.targets.resize(num_targets);
    for (size_t t = 0; t < num_targets; ++t) {
      CalibrationStats::Target& target = s.targets[t];
      uint32_t dim;
      if (!dec.U32(dim)) return early();
      target.dim = dim;
      const std::string twhere = absl::StrCat(where, " target layer ", layer + 2 + t);
      RS_RETURN_IF_ERROR(data.Copy(dec, absl::StrCat(twhere, " mean"), target.mean));
      RS_RETURN_IF_ERROR(data.Copy(dec, absl::StrCat(twhere, " cross"), target.cross));
      RS_RETURN_IF_ERROR(data.Copy(dec, absl::StrCat(twhere, " hold-out y"), target.holdout_y));
    }
  }
  if (dec.remaining() != 0) {
    return data.Error(absl::StrCat(dec.remaining(), " unread bytes after the metadata"));
  }
  return set;
}

}  // namespace

absl::Status ValidateStatsSet(const StatsSet& set) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("inconsistent calibration statistics: ", parts...));
  };
  const int64_t layers = set.model.num_layers;
  const int64_t hidden = set.model.hidden;
  if (layers < 3 || hidden <= 0) {
    return bad("a model needs >= 3 layers and hidden > 0 for RidgeFill, got ", layers,
               " layers and hidden ", hidden);
  }
  if (set.kind != MapTarget::kPreNorm && set.kind != MapTarget::kPostNorm &&
      set.kind != MapTarget::kKv) {
    return bad("unknown map target kind ", static_cast<uint32_t>(set.kind));
  }
  int64_t previous = -1;
  int64_t kv_dim = 0;  // kv targets: the first one's dim, which every other must have
  for (const SplitStats& split : set.splits) {
    const int64_t s = split.split_layer;
    const CalibrationStats& stats = split.stats;
    if (s < 0 || s > layers - 3) {
      return bad("split layer ", s, " outside [0, ", layers - 3, "] for a ", layers,
                 "-layer model");
    }
    if (s <= previous) {
      return bad("split layer ", s, " after ", previous,
                 " (split layers must be distinct "
                 "and ascending)");
    }
    previous = s;
    if (split.holdout_stride != 0 && split.holdout_stride < 2) {
      return bad("split ", s, ": hold-out stride ", split.holdout_stride, " (0 or >= 2)");
    }
    if (split.holdout_stride == 0 && stats.holdout_rows != 0) {
      return bad("split ", s, ": ", stats.holdout_rows, " hold-out rows without a stride");
    }
    if (stats.dim != hidden) {
      return bad("split ", s, ": statistics of dim ", stats.dim, " for hidden ", hidden);
    }
    if (static_cast<int64_t>(stats.targets.size()) != layers - s - 2) {
      return bad("split ", s, ": ", stats.targets.size(),
                 " targets, expected one for each of "
                 "layers ",
                 s + 2, " .. ", layers - 1);
    }
    for (size_t t = 0; t < stats.targets.size(); ++t) {
      const int64_t dim = stats.targets[t].dim;
      if (set.kind == MapTarget::kKv && kv_dim == 0) kv_dim = dim;
      const int64_t expected = set.kind == MapTarget::kKv ? kv_dim : hidden;
      if (dim != expected) {
        return bad("split ", s, " target layer ", s + 2 + static_cast<int64_t>(t), ": dim ", dim,
                   ", expected ", expected, " for ", std::string(MapTargetName(set.kind)),
                   " targets");
      }
    }
    if (absl::Status st = ValidateCalibrationStats(stats, split.seen_rows, s + 2); !st.ok()) {
      return bad("split ", s, ": ", st.message());
    }
  }
  return absl::OkStatus();
}

absl::Status WriteStatsFile(const std::string& path, const StatsSet& set) {
  if (absl::Status s = ValidateStatsSet(set); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  // Metadata size does not depend on the offsets, so lay out the data section first.
  uint64_t meta_size = 8 + 4 * 3 + 4 + set.model.model_name.size() + 4;
  for (const SplitStats& split : set.splits) {
    meta_size += kSplitRecordSize + split.stats.targets.size() * kTargetRecordSize;
  }
  binary_io::ArrayLayout arrays(binary_io::AlignUp(binary_io::kHeaderSize + meta_size));
  binary_io::Encoder meta;
  meta.U64(set.model.hash);
  meta.U32(set.model.num_layers);
  meta.U32(set.model.hidden);
  meta.U32(static_cast<uint32_t>(set.kind));
  meta.U32(static_cast<uint32_t>(set.model.model_name.size()));
  meta.Raw(set.model.model_name.data(), set.model.model_name.size());
  meta.U32(static_cast<uint32_t>(set.splits.size()));
  for (const SplitStats& split : set.splits) {
    const CalibrationStats& s = split.stats;
    meta.U32(split.split_layer);
    meta.U32(static_cast<uint32_t>(s.targets.size()));
    for (int64_t v : {split.seen_rows, split.holdout_stride, s.rows, s.holdout_rows}) {
      meta.U64(static_cast<uint64_t>(v));
    }
    arrays.Place<double>(s.mean, meta);
    arrays.Place<double>(s.gram, meta);
    arrays.Place<int64_t>(s.holdout_row_index, meta);
    arrays.Place<float>(s.holdout_x, meta);
    for (const CalibrationStats::Target& t : s.targets) {
      meta.U32(static_cast<uint32_t>(t.dim));
      arrays.Place<double>(t.mean, meta);
      arrays.Place<double>(t.cross, meta);
      arrays.Place<float>(t.holdout_y, meta);
    }
  }
  return binary_io::WriteContainer(path, path, kFormat, meta, arrays);
}

absl::StatusOr<StatsSet> ReadStatsFile(const std::string& path, const ModelFingerprint* expected) {
  RS_ASSIGN_OR_RETURN(binary_io::Container c, binary_io::OpenContainer(path, path, kFormat));
  // The arrays are copied out: disjoint and in order, so what is allocated is bounded by the
  // file size however many references the metadata holds.
  binary_io::DataSection data(c, path, binary_io::DataSection::Order::kDisjointAscending);
  binary_io::Decoder dec = c.Metadata();
  RS_ASSIGN_OR_RETURN(StatsSet set, ParseMetadata(data, dec, path));
  if (expected != nullptr && !SameModel(set.model, *expected)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": statistics made for model ", DescribeModel(set.model),
                     ", but the loaded model is ", DescribeModel(*expected)));
  }
  if (absl::Status s = ValidateStatsSet(set); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return set;
}

}  // namespace ridgeserve
