#include "engine/ridgefill/online_calibration.h"

#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/ridge_solver.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// out = N [a · base + b · served + w · dy dxᵀ] element-wise over [rows, cols] row-major
// (the mix of one centred moment matrix).
void MixMoment(std::span<const double> base, std::span<const double> served,
               std::span<const double> dy, std::span<const double> dx, double a, double b, double w,
               double n, std::vector<double>& out) {
  const size_t cols = dx.size();
  out.resize(base.size());
  for (size_t i = 0; i < dy.size(); ++i) {
    for (size_t j = 0; j < cols; ++j) {
      const size_t k = i * cols + j;
      out[k] = n * (a * base[k] + b * served[k] + w * dy[i] * dx[j]);
    }
  }
}

// x̄ = (1 − β) base + β served, and δ = served − base.
void MixMean(const std::vector<double>& base, const std::vector<double>& served, double beta,
             std::vector<double>& mean, std::vector<double>& delta) {
  mean.resize(base.size());
  delta.resize(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    mean[i] = (1 - beta) * base[i] + beta * served[i];
    delta[i] = served[i] - base[i];
  }
}

}  // namespace

absl::StatusOr<CalibrationStats> MixCalibrationStats(const CalibrationStats& base,
                                                     const CalibrationStats& served,
                                                     double served_share) {
  if (!(served_share >= 0 && served_share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("served share must be in [0, 1], got ", served_share));
  }
  bool same_shape = base.dim == served.dim && base.targets.size() == served.targets.size();
  for (size_t t = 0; same_shape && t < base.targets.size(); ++t) {
    same_shape = base.targets[t].dim == served.targets[t].dim;
  }
  if (!same_shape) {
    return absl::InvalidArgumentError(
        "calibration statistics to mix differ in their dimensions or targets");
  }
  if (base.rows == 0 || served.rows == 0) {
    CalibrationStats one = served.rows == 0 ? base : served;
    for (size_t t = 0; t < one.targets.size(); ++t) {
      one.targets[t].holdout_y = served.targets[t].holdout_y;
    }
    one.holdout_rows = served.holdout_rows;
    one.holdout_row_index = served.holdout_row_index;
    one.holdout_x = served.holdout_x;
    return one;
  }
  const double n_b = static_cast<double>(base.rows), n_s = static_cast<double>(served.rows);
  const double beta = served_share;
  const double a = (1 - beta) / n_b, b = beta / n_s, w = beta * (1 - beta), n = n_b + n_s;
  CalibrationStats mixed;
  mixed.dim = base.dim;
  mixed.rows = base.rows + served.rows;
  std::vector<double> dx;
  MixMean(base.mean, served.mean, beta, mixed.mean, dx);
  MixMoment(base.gram, served.gram, dx, dx, a, b, w, n, mixed.gram);
  mixed.targets.resize(base.targets.size());
  std::vector<double> dy;
  for (size_t t = 0; t < base.targets.size(); ++t) {
    CalibrationStats::Target& out = mixed.targets[t];
    out.dim = base.targets[t].dim;
    MixMean(base.targets[t].mean, served.targets[t].mean, beta, out.mean, dy);
    MixMoment(base.targets[t].cross, served.targets[t].cross, dy, dx, a, b, w, n, out.cross);
    out.holdout_y = served.targets[t].holdout_y;
  }
  mixed.holdout_rows = served.holdout_rows;
  mixed.holdout_row_index = served.holdout_row_index;
  mixed.holdout_x = served.holdout_x;
  return mixed;
}

namespace {

std::vector<int32_t> SplitLayers(const MapSet& maps) {
  std::vector<int32_t> splits;
  for (const SplitMaps& s : maps.splits) splits.push_back(s.split_layer);
  std::sort(splits.begin(), splits.end());
  return splits;
}

bool HasKeyScale(const MapSet& maps) {
  for (const SplitMaps& s : maps.splits) {
    for (const TargetMap& t : s.targets) {
      if (!t.key_scale.empty()) return true;
    }
  }
  return false;
}

// `file`'s statistics in the order of `splits`, each shaped as `statistics` accumulates them.
absl::StatusOr<std::vector<SplitStats>> MatchSplits(const std::string& file, StatsSet stats,
                                                    const SplitStatistics& statistics) {
  if (stats.kind != statistics.kinds().front()) {
    return absl::FailedPreconditionError(
        absl::StrCat(file, ": statistics of --map_target ", std::string(MapTargetName(stats.kind)),
                     ", the maps are ", std::string(MapTargetName(statistics.kinds().front()))));
  }
  std::vector<SplitStats> out;
  for (size_t i = 0; i < statistics.splits().size(); ++i) {
    const int32_t s = statistics.splits()[i];
    auto it = std::find_if(stats.splits.begin(), stats.splits.end(),
                           [&](const SplitStats& x) { return x.split_layer == s; });
    if (it == stats.splits.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(file, ": no statistics for split layer ", s, ", which the maps have"));
    }
    const CalibrationAccumulator& acc = statistics.accumulator(0, i);
    const CalibrationStats shape = acc.Finish();
    bool same = it->stats.dim == shape.dim && it->stats.targets.size() == shape.targets.size();
    for (size_t t = 0; same && t < shape.targets.size(); ++t) {
      same = it->stats.targets[t].dim == shape.targets[t].dim;
    }
    if (!same) {
      return absl::FailedPreconditionError(
          absl::StrCat(file, ": split layer ", s, "'s statistics do not fit the model's shape"));
    }
    out.push_back(std::move(*it));
  }
  return out;
}

}  // namespace

OnlineCalibrator::OnlineCalibrator(LlamaModel& model, const ModelFingerprint& fingerprint,
                                   const MapSet& shipped, OnlineCalibrationOptions options)
    : config_(model.config()),
      fingerprint_(fingerprint),
      kind_(shipped.kind),
      key_scale_(HasKeyScale(shipped)),
      options_(std::move(options)),
      statistics_(model, SplitLayers(shipped), {shipped.kind}, options_.holdout) {
  pending_.resize(statistics_.depths().size());
}

absl::StatusOr<std::unique_ptr<OnlineCalibrator>> OnlineCalibrator::Create(
    LlamaModel& model, const ModelFingerprint& fingerprint, const MapSet& shipped,
    const std::string& base_stats_path, OnlineCalibrationOptions options) {
  if (shipped.splits.empty()) return absl::InvalidArgumentError("the maps have no split layers");
  if (!(options.served_share >= 0 && options.served_share <= 1) || options.resolve_rows < 1 ||
      options.row_stride < 1 || options.sink_tokens < 0 || options.max_pending_rows < 1) {
    return absl::InvalidArgumentError(
        "online calibration: need served share in [0, 1], resolve rows >= 1, row stride >= 1, "
        "sink tokens >= 0, max pending rows >= 1");
  }
  auto calibrator = std::unique_ptr<OnlineCalibrator>(
      new OnlineCalibrator(model, fingerprint, shipped, std::move(options)));
  OnlineCalibrator& c = *calibrator;
  RS_ASSIGN_OR_RETURN(StatsSet base, ReadStatsFile(base_stats_path, &fingerprint));
  RS_ASSIGN_OR_RETURN(c.base_.splits, MatchSplits(base_stats_path, std::move(base), c.statistics_));
  c.base_.model = fingerprint;
  c.base_.kind = c.kind_;
  const std::string& checkpoint = c.options_.checkpoint_path;
  std::error_code ec;
  if (std::filesystem::exists(checkpoint, ec)) {
    RS_ASSIGN_OR_RETURN(StatsSet saved, ReadStatsFile(checkpoint, &fingerprint));
    RS_ASSIGN_OR_RETURN(std::vector<SplitStats> splits,
                        MatchSplits(checkpoint, std::move(saved), c.statistics_));
    for (size_t i = 0; i < splits.size(); ++i) {
      if (absl::Status s = c.statistics_.accumulator(0, i).Restore(
              splits[i].stats, splits[i].seen_rows, splits[i].holdout_stride);
          !s.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(checkpoint, ": ", s.message()));
      }
    }
    c.status_.rows = c.checkpointed_rows_ = c.statistics_.accumulator(0, 0).total_rows();
    spdlog::info("RidgeFill online calibration: restored {} served rows from {}", c.status_.rows,
                 checkpoint);
  }
  return calibrator;
}

OnlineCalibrator::~OnlineCalibrator() { Stop(); }

void OnlineCalibrator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void OnlineCalibrator::Take(std::span<const std::vector<float>> states,
                            std::span<const int32_t> rows) {
  const size_t hidden = static_cast<size_t>(config_.hidden);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t room = static_cast<size_t>(options_.max_pending_rows - pending_rows_);
    const size_t n = std::min(rows.size(), room);
    status_.offered_rows += static_cast<int64_t>(rows.size());
    status_.dropped_rows += static_cast<int64_t>(rows.size() - n);
    for (size_t i = 0; i < pending_.size(); ++i) {
      for (size_t j = 0; j < n; ++j) {
        const float* row = states[i].data() + static_cast<size_t>(rows[j]) * hidden;
        pending_[i].insert(pending_[i].end(), row, row + hidden);
      }
    }
    pending_rows_ += static_cast<int64_t>(n);
    status_.pending_rows = pending_rows_;
  }
  cv_.notify_all();
}

void OnlineCalibrator::Start(std::function<absl::Status(const std::string& maps_path)> swap_in) {
  swap_in_ = std::move(swap_in);
  thread_ = std::thread([this] { Run(); });
}

OnlineCalibrationStatus OnlineCalibrator::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void OnlineCalibrator::Run() {
  // Background work: SCHED_IDLE, so it runs only on a core no other thread wants and a
  // serving thread that wakes takes the core back at once (nice 19 where the policy is
  // refused); and single-threaded BLAS (OpenBLAS's own threads would spin against the engine's
  // workers; the server makes no other BLAS call while serving).
  const sched_param idle{};
  if (const int error = pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle); error != 0) {
    spdlog::warn("RidgeFill online calibration: SCHED_IDLE refused ({}), running at nice 19",
                 std::strerror(error));
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  }
  openblas_set_num_threads(1);
  // A restored checkpoint that had been re-solved from: its maps again, at once.
  bool resolve = status().rows >= options_.resolve_rows;
  std::vector<std::vector<float>> rows(pending_.size());
  while (true) {
    if (resolve) {
      const auto start = std::chrono::steady_clock::now();
      const absl::Status status = Resolve();
      std::lock_guard<std::mutex> lock(mu_);
      if (status.ok()) {
        ++status_.resolves;
        status_.last_resolve_seconds = SecondsSince(start);
      } else {
        ++status_.failed_resolves;
        spdlog::error("RidgeFill online calibration: re-solve failed, the maps in use stay: {}",
                      status.ToString());
      }
      rows_at_resolve_ = status_.rows;
    }
    int64_t count;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || pending_rows_ > 0; });
      if (stopping_) break;
      for (size_t i = 0; i < rows.size(); ++i) {
        rows[i].swap(pending_[i]);
        pending_[i].clear();
      }
      count = pending_rows_;
      pending_rows_ = status_.pending_rows = 0;
    }
    const auto start = std::chrono::steady_clock::now();
    const absl::Status added = statistics_.Add(rows, 0, count, 1);
    if (!added.ok()) {
      spdlog::warn("RidgeFill online calibration: rows left out: {}", added.ToString());
    }
    std::lock_guard<std::mutex> lock(mu_);
    status_.accumulate_seconds += SecondsSince(start);
    status_.rows = statistics_.accumulator(0, 0).total_rows();
    resolve = status_.rows - rows_at_resolve_ >= options_.resolve_rows;
  }
  // Stopping: what was accumulated since the last checkpoint is kept for the next start.
  if (statistics_.accumulator(0, 0).total_rows() == checkpointed_rows_) return;
  if (const absl::Status s = Checkpoint(ServedStats()); !s.ok()) {
    spdlog::error("RidgeFill online calibration: checkpoint at exit failed: {}", s.ToString());
  } else {
    spdlog::info("RidgeFill online calibration: {} served rows checkpointed to {}",
                 checkpointed_rows_, options_.checkpoint_path);
  }
}

absl::Status OnlineCalibrator::Resolve() {
  const StatsSet served = ServedStats();
  std::vector<SplitFit> fits;
  for (size_t i = 0; i < served.splits.size(); ++i) {
    const CalibrationStats& stats = served.splits[i].stats;
    if (stats.holdout_rows == 0) {
      return absl::FailedPreconditionError("no held-out served rows yet to choose λ on");
    }
    RS_ASSIGN_OR_RETURN(const CalibrationStats mixed,
                        MixCalibrationStats(base_.splits[i].stats, stats, options_.served_share));
    RS_ASSIGN_OR_RETURN(std::unique_ptr<RidgeSolver> solver, RidgeSolver::Create(mixed));
    RS_ASSIGN_OR_RETURN(SplitFit fit,
                        FitSplitMaps(served.splits[i].split_layer, kind_, {-1, key_scale_}, mixed,
                                     *solver, statistics_.projectors(), config_));
    fits.push_back(std::move(fit));
  }
  RS_RETURN_IF_ERROR(
      WriteMapFile(options_.maps_path, ToMapSet(fits, kind_, fingerprint_, config_)));
  RS_RETURN_IF_ERROR(Checkpoint(served));
  spdlog::info("RidgeFill online calibration: maps re-solved from {} served rows (share {}), {}",
               checkpointed_rows_, options_.served_share, options_.maps_path);
  return swap_in_(options_.maps_path);
}

StatsSet OnlineCalibrator::ServedStats() const {
  StatsSet served{fingerprint_, kind_, {}};
  for (size_t i = 0; i < statistics_.splits().size(); ++i) {
    const CalibrationAccumulator& acc = statistics_.accumulator(0, i);
    served.splits.push_back(
        SplitStats{statistics_.splits()[i], acc.total_rows(), acc.holdout_stride(), acc.Finish()});
  }
  return served;
}

absl::Status OnlineCalibrator::Checkpoint(const StatsSet& served) {
  RS_RETURN_IF_ERROR(WriteStatsFile(options_.checkpoint_path, served));
  checkpointed_rows_ = served.splits.front().seen_rows;
  return absl::OkStatus();
}

}  // namespace ridgeserve
