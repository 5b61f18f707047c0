// Online RidgeFill calibration (the server's --ridgefill_online_calibration): the maps learn
// the served text. Exact requests' prompt rows ran every layer on exact K/V, so they are
// calibration rows of the served distribution, free. The engine hands their residual stream
// to Take (EngineOptions::calibration_rows); a background thread streams them into the same
// statistics ridgeserve-calibrate accumulates (SplitStatistics: double precision, centred
// Gram and cross-covariances, every 10th row held out), and every `resolve_rows` new rows it
// re-solves the maps of every split of the served map file (FitSplitMaps: one
// eigendecomposition per split, λ scored on K/V), writes them, checkpoints the statistics and
// hands the new map file to the server, which swaps it in like a reload.
//
// What is solved is a mix of the shipped calibration statistics (ridgeserve-calibrate
// --stats_out) and the served ones, with served rows making up `served_share` β of the weight
// (MixCalibrationStats); λ is chosen on the served held-out rows, the distribution the maps are
// meant for.
//
// Rows of RidgeFill, SpecPC and SpecKV requests are not taken: above the split a RidgeFill
// request's exact tail attends to predicted K/V, so its states would feed the maps' own error
// back into the next maps; SpecPC prefills a compressed prompt; SpecKV's prefill runs over the
// draft's lookahead too. Shadow-exact prefills (--ridgefill_shadow_fraction) are exact requests
// of RIDGEFILL prompts, so with shadow sampling on the RIDGEFILL traffic is learned as well.
//
// The statistics are aggregates of hidden states (sums of outer products, means, and a few
// hundred held-out rows of hidden states), never token ids or text, and stay on the server.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_ONLINE_CALIBRATION_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_ONLINE_CALIBRATION_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama.h"
#include "engine/ridgefill/calibration_stats.h"
#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/map_fit.h"
#include "engine/ridgefill/stats_file.h"

namespace ridgeserve {

// The moments of two row populations mixed so that `served`'s rows carry the share β of the
// weight and `base`'s rows 1 − β (each row of a population weighs the same):
//   x̄ = (1 − β) x̄_b + β x̄_s
//   G = N [(1 − β) G_b / n_b + β G_s / n_s + β (1 − β) δ δᵀ],  δ = x̄_s − x̄_b,  N = n_b + n_s
// and C_l the same with (δ_y, δ_x); rows = N, so λ's scale (trace(G)/d) and the leverage's
// (about d/N for a typical row) read as for N rows. Held-out rows are `served`'s. With no
// served training rows the base moments are returned as they are (β is moot); with no base
// rows, the served ones. InvalidArgument when the shapes differ or β is outside [0, 1].
absl::StatusOr<CalibrationStats> MixCalibrationStats(const CalibrationStats& base,
                                                     const CalibrationStats& served,
                                                     double served_share);

struct OnlineCalibrationOptions {
  std::string checkpoint_path;  // the served statistics (a stats file): restored, then rewritten
  std::string maps_path;        // where re-solved maps are written before they are swapped in
  double served_share = 0.5;    // β of MixCalibrationStats
  int64_t resolve_rows = 8192;  // served rows (training + held out) between re-solves
  int32_t row_stride = 4;       // every k-th prompt position is taken
  int32_t sink_tokens = 4;      // prompt positions below this are not (attention sinks)
  int64_t max_pending_rows = 1024;  // taken but not yet accumulated; more are dropped
  HoldoutOptions holdout{10, 256};
};

struct OnlineCalibrationStatus {
  int64_t offered_rows = 0;  // rows the engine handed to Take (queued or dropped)
  int64_t rows = 0;          // served rows in the statistics (training + held out)
  int64_t dropped_rows = 0;  // rows Take dropped because the queue was full
  int64_t pending_rows = 0;
  int64_t resolves = 0;             // re-solves whose maps were handed over
  int64_t failed_resolves = 0;      // re-solves that failed (logged; the maps in use stayed)
  double accumulate_seconds = 0;    // spent adding rows to the statistics
  double last_resolve_seconds = 0;  // the last re-solve, maps and checkpoint written
};

class OnlineCalibrator {
 public:
  // `shipped`: the map file served (its kind and split layers; key scales if it has them).
  // `base_stats_path`: its calibration statistics, which must be of the same model and kind
  // and have every split. The checkpoint is restored when it exists (the same rules). Builds
  // the target projectors: backend work, so call it on the thread that drives the model's
  // backend, before the engine thread runs. Errors name the file at fault.
  static absl::StatusOr<std::unique_ptr<OnlineCalibrator>> Create(
      LlamaModel& model, const ModelFingerprint& fingerprint, const MapSet& shipped,
      const std::string& base_stats_path, OnlineCalibrationOptions options);
  // Stop().
  ~OnlineCalibrator();
  OnlineCalibrator(const OnlineCalibrator&) = delete;
  OnlineCalibrator& operator=(const OnlineCalibrator&) = delete;

  // What the engine captures for Take (EngineOptions::calibration_rows).
  const std::vector<int32_t>& depths() const { return statistics_.depths(); }
  int32_t first_position() const { return options_.sink_tokens; }
  int32_t row_stride() const { return options_.row_stride; }
  // Queues rows `rows` of the captured residuals (states[i]: [n, hidden] at depths()[i]);
  // drops (and counts) those that do not fit. Any thread; copies and returns.
  void Take(std::span<const std::vector<float>> states, std::span<const int32_t> rows);

  // Starts the background thread. `swap_in(maps_path)` is called on it after each re-solve
  // has written the maps (the server loads them as a new map version); its error counts as a
  // failed re-solve. A restored checkpoint of at least `resolve_rows` rows is re-solved at once.
  void Start(std::function<absl::Status(const std::string& maps_path)> swap_in);

  // Stops the thread (waiting for a re-solve in progress, swap_in included) and checkpoints
  // what it accumulated since the last checkpoint; rows still queued are dropped. Call before
  // whatever swap_in uses goes. Idempotent.
  void Stop();

  OnlineCalibrationStatus status() const;

 private:
  OnlineCalibrator(LlamaModel& model, const ModelFingerprint& fingerprint, const MapSet& shipped,
                   OnlineCalibrationOptions options);
  void Run();
  // Mixes, solves every split, writes the maps and the checkpoint, calls swap_in_.
  absl::Status Resolve();
  // The served statistics of every split, as the checkpoint holds them.
  StatsSet ServedStats() const;
  // Writes `served` (ServedStats) to options_.checkpoint_path.
  absl::Status Checkpoint(const StatsSet& served);

  const ModelConfig& config_;
  const ModelFingerprint fingerprint_;
  const MapTarget kind_;
  const bool key_scale_;
  const OnlineCalibrationOptions options_;
  SplitStatistics statistics_;  // the served rows; the background thread's after Create
  StatsSet base_;               // the shipped statistics, splits in statistics_'s order
  std::function<absl::Status(const std::string&)> swap_in_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<float>> pending_;  // [depth slot] rows × hidden
  int64_t pending_rows_ = 0;
  bool stopping_ = false;
  OnlineCalibrationStatus status_;
  int64_t rows_at_resolve_ = 0;    // status_.rows at the last re-solve
  int64_t checkpointed_rows_ = 0;  // the background thread's: rows in the last checkpoint
  std::thread thread_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_ONLINE_CALIBRATION_H_
