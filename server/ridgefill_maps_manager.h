// The RidgeFill maps a server serves with (--ridgefill_maps), swapped while it serves:
// - at start, an existing file is loaded before serving (a bad one stops the server);
// - a file that is not there yet (being calibrated beside the server, `make serve`) is waited
//   for: exact requests are served meanwhile, RIDGEFILL is refused with the calibration's
//   progress (read from PATH.progress, which scripts/make_maps.sh writes), and the file is
//   loaded when it appears (written by atomic rename, so never half-written);
// - RequestReload (SIGHUP, Admin.ReloadRidgeFillMaps) reads the file again; a bad file is
//   refused with one log line and the maps in use stay;
// - LoadFile swaps in another file the same way (online calibration's re-solved maps).
// Requests take a Snapshot and hold its maps until they finish (EngineRequest's
// RidgeFillRequest::maps), so a swap never changes the maps of a request in flight, and the
// engine keys the prefix cache on the maps' id (the file's checksum), so K/V filled by two
// map versions never mix.
//
// Threading: every method is thread-safe. One watcher thread opens and checks files; uploads
// run on the engine thread (Engine::RunOnEngineThread), and so do frees of swapped-out maps.
#ifndef RIDGESERVE_SERVER_RIDGEFILL_MAPS_MANAGER_H_
#define RIDGESERVE_SERVER_RIDGEFILL_MAPS_MANAGER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/ridgefill/ridgefill_maps.h"

namespace ridgeserve {

enum class RidgeFillMapsState {
  kNone,         // no --ridgefill_maps: RIDGEFILL is never available
  kCalibrating,  // the file is not there yet: waiting for it (and its calibration)
  kLoaded,
  kFailed,  // the file is there but was refused, and no maps were loaded before
};
// "none", "calibrating", "loaded", "failed" (the metric's state label).
const char* RidgeFillMapsStateName(RidgeFillMapsState state);

struct RidgeFillMapsSnapshot {
  RidgeFillMapsState state = RidgeFillMapsState::kNone;
  std::shared_ptr<const RidgeFillMaps> maps;  // set when loaded
  std::vector<int32_t> split_layers;          // ascending; empty unless loaded
  int32_t default_split_layer = -1;
  uint64_t version = 0;   // 1 for the first maps loaded, +1 for each swap; 0: none yet
  uint64_t checksum = 0;  // the loaded file's XXH64 (the prefix cache's key)
  std::string path;       // the file they came from: --ridgefill_maps, or online maps
  // Calibration progress (kCalibrating): tokens done / total, from PATH.progress; total 0
  // when unknown.
  int64_t calibrated_tokens = 0;
  int64_t calibration_tokens = 0;
  // One sentence on why RIDGEFILL is not available (empty when loaded), for the client.
  std::string unavailable;
  int64_t reloads_ok = 0;       // maps loaded after the start (file appeared or SIGHUP)
  int64_t reloads_refused = 0;  // files refused (the maps in use stayed)
};

class RidgeFillMapsManager {
 public:
  struct Options {
    std::string path;  // empty: kNone
    // -1: the highest split of each file; else every file must have maps for it.
    int32_t default_split_layer = -1;
    float max_leverage = 0;  // --ridgefill_max_leverage (RidgeFillMaps::Load)
    absl::Duration poll_interval = absl::Milliseconds(500);
  };

  // Loads `options.path` if it exists (its errors are returned: the server must not start on
  // a bad file), else starts waiting for it. `model` and `engine` must outlive the manager
  // and every snapshot's maps.
  static absl::StatusOr<std::unique_ptr<RidgeFillMapsManager>> Create(Model& model, Engine& engine,
                                                                      Options options);
  ~RidgeFillMapsManager();
  RidgeFillMapsManager(const RidgeFillMapsManager&) = delete;
  RidgeFillMapsManager& operator=(const RidgeFillMapsManager&) = delete;

  RidgeFillMapsSnapshot Snapshot() const;

  // The outcome of one reload: OK with the state after it (the new version), or
  // FailedPrecondition with the line the log got (the maps in use stay).
  using ReloadDone =
      std::function<void(const absl::Status& status, const RidgeFillMapsSnapshot& after)>;
  // Asks the watcher thread to read the file again and returns at once. `done`, when given, is
  // called once, on the watcher thread, when the file is loaded or refused; at once with
  // FailedPrecondition without --ridgefill_maps; with Unavailable if the manager is destroyed
  // first. Reloads asked for while one runs share the next one.
  void RequestReload(ReloadDone done = nullptr);

  // Loads `path` (online calibration's re-solved maps) as the next version, as a reload would:
  // on the calling thread (not the engine thread), returning when it is loaded or refused (its
  // error; the maps in use stay). A later reload reads --ridgefill_maps again.
  absl::Status LoadFile(const std::string& path);

 private:
  RidgeFillMapsManager(Model& model, Engine& engine, Options options);
  // Opens, checks and uploads the file, then swaps it in. Errors leave everything as it was.
  absl::Status Load(const std::string& path);
  void Watch();
  // Counts and logs a refused file (`signature`: FileSignature) and updates the state; returns
  // the logged line as FailedPrecondition.
  absl::Status Refuse(const absl::Status& error, const std::string& signature);
  void ReadProgress();

  Model& model_;
  Engine& engine_;
  const Options options_;

  std::mutex load_mu_;  // one Load at a time
  mutable std::mutex mu_;
  std::condition_variable cv_;
  RidgeFillMapsSnapshot current_;
  bool reload_requested_ = false;
  std::vector<ReloadDone> reload_waiters_;  // told the outcome of the next reload
  bool stopping_ = false;
  std::string last_refused_;  // the file signature (inode, size, mtime) last refused
  std::thread thread_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_RIDGEFILL_MAPS_MANAGER_H_
