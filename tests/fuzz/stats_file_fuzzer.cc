// RidgeFill calibration-statistics file reader (engine/ridgefill/stats_file.*) on arbitrary
// bytes, and CalibrationAccumulator::Restore on what it accepts.
//
// Input: byte 0 holds flags, the rest is the file (ridgefill_file_input.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/ridgefill/calibration_stats.h"
#include "engine/ridgefill/stats_file.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/ridgefill_file_input.h"

namespace {

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool SameStats(const ridgeserve::CalibrationStats& a, const ridgeserve::CalibrationStats& b) {
  const auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() &&
           (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  if (a.dim != b.dim || a.rows != b.rows || a.holdout_rows != b.holdout_rows ||
      !same(a.mean, b.mean) || !same(a.gram, b.gram) ||
      !same(a.holdout_row_index, b.holdout_row_index) || !same(a.holdout_x, b.holdout_x) ||
      a.targets.size() != b.targets.size()) {
    return false;
  }
  for (size_t t = 0; t < a.targets.size(); ++t) {
    const auto& p = a.targets[t];
    const auto& q = b.targets[t];
    if (p.dim != q.dim || !same(p.mean, q.mean) || !same(p.cross, q.cross) ||
        !same(p.holdout_y, q.holdout_y)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  if (size == 0) return 0;
  const std::string bytes = fuzz::RidgeFillFileFromInput(data, size);
  const std::string path = fuzz::WriteScratchFile("stats.rfstats", bytes);
  auto set = ReadStatsFile(path, nullptr);
  if (!set.ok()) {
    const std::string message(set.status().message());
    if (message.rfind(path + ": ", 0) != 0) {
      fuzz::Fail("an error that does not start with the file's path");
    }
    if (message.find('\n') != std::string::npos) fuzz::Fail("an error of more than one line");
    return 0;
  }
  if (!ValidateStatsSet(*set).ok()) fuzz::Fail("a stats file that reads fails ValidateStatsSet");

  // What was read writes, and reads back the same (the writer's bytes are canonical).
  const std::string again = fuzz::ScratchDir() + "/again.rfstats";
  if (!WriteStatsFile(again, *set).ok()) fuzz::Fail("a stats file that reads does not write");
  auto back = ReadStatsFile(again, &set->model);
  if (!back.ok() || back->splits.size() != set->splits.size()) {
    fuzz::Fail("a written stats file does not read back");
  }
  for (size_t s = 0; s < set->splits.size(); ++s) {
    const SplitStats& a = set->splits[s];
    const SplitStats& b = back->splits[s];
    if (a.split_layer != b.split_layer || a.seen_rows != b.seen_rows ||
        a.holdout_stride != b.holdout_stride || !SameStats(a.stats, b.stats)) {
      fuzz::Fail("a written stats file reads back different");
    }
  }
  const std::string canonical = ReadBytes(again);
  if (!WriteStatsFile(again, *back).ok() || ReadBytes(again) != canonical) {
    fuzz::Fail("writing what was read back gives other bytes");
  }

  ModelFingerprint other = set->model;
  other.hash ^= 1;
  if (ReadStatsFile(path, &other).status().code() != absl::StatusCode::kFailedPrecondition) {
    fuzz::Fail("a stats file matches another model");
  }

  // Each split as a checkpoint, into an accumulator of its dims whose options allow its
  // stride: Restore either refuses or takes it exactly.
  for (const SplitStats& split : set->splits) {
    const CalibrationStats& st = split.stats;
    std::vector<int64_t> dims;
    for (const CalibrationStats::Target& t : st.targets) dims.push_back(t.dim);
    HoldoutOptions holdout{.holdout_every = split.holdout_stride,
                           .max_holdout_rows = std::max<int64_t>(1, st.holdout_rows)};
    CalibrationAccumulator acc(st.dim, dims, holdout);
    const absl::Status restored = acc.Restore(st, split.seen_rows, split.holdout_stride);
    if (restored.ok()) {
      if (!SameStats(acc.Finish(), st)) fuzz::Fail("Restore then Finish changed the statistics");
    } else if (restored.code() != absl::StatusCode::kInvalidArgument) {
      fuzz::Fail("Restore failed with a code other than InvalidArgument");
    }
  }
  return 0;
}
