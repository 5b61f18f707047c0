#include "server/ridgefill_maps_manager.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/ridgefill_load.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

// The file's identity for "is it the one refused before?": inode, size, mtime. Empty when
// the file is not there.
std::string FileSignature(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

}  // namespace

const char* RidgeFillMapsStateName(RidgeFillMapsState state) {
  switch (state) {
    case RidgeFillMapsState::kNone:
      return "none";
    case RidgeFillMapsState::kCalibrating:
      return "calibrating";
    case RidgeFillMapsState::kLoaded:
      return "loaded";
    case RidgeFillMapsState::kFailed:
      return "failed";
  }
  return "none";
}

RidgeFillMapsManager::RidgeFillMapsManager(Model& model, Engine& engine, Options options)
    : model_(model), engine_(engine), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<RidgeFillMapsManager>> RidgeFillMapsManager::Create(
    Model& model, Engine& engine, Options options) {
  auto manager =
      std::unique_ptr<RidgeFillMapsManager>(new RidgeFillMapsManager(model, engine, options));
  RidgeFillMapsManager& m = *manager;
  if (options.path.empty()) {
    m.current_.unavailable = "no RidgeFill maps loaded (start the server with --ridgefill_maps)";
    return manager;
  }
  if (!FileSignature(options.path).empty()) {
    RS_RETURN_IF_ERROR(m.Load(options.path));
    m.current_.reloads_ok = 0;  // the start's load is not a reload
  } else {
    m.current_.state = RidgeFillMapsState::kCalibrating;
    m.ReadProgress();
    spdlog::info(
        "RidgeFill maps {} are not there yet: serving exact requests, loading the maps "
        "when the file appears ({})",
        options.path, m.current_.unavailable);
  }
  m.thread_ = std::thread([&m] { m.Watch(); });
  return manager;
}

RidgeFillMapsManager::~RidgeFillMapsManager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  const absl::Status stopped = absl::UnavailableError("the server is stopping");
  for (const ReloadDone& done : reload_waiters_) done(stopped, current_);
}

RidgeFillMapsSnapshot RidgeFillMapsManager::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void RidgeFillMapsManager::RequestReload(ReloadDone done) {
  if (options_.path.empty()) {
    constexpr char kNoMaps[] =
        "reload requested, but the server was started without --ridgefill_maps";
    spdlog::warn(kNoMaps);
    if (done) done(absl::FailedPreconditionError(kNoMaps), Snapshot());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    reload_requested_ = true;
    if (done) reload_waiters_.push_back(std::move(done));
  }
  cv_.notify_all();
}

absl::Status RidgeFillMapsManager::LoadFile(const std::string& path) {
  const absl::Status status = Load(path);
  if (!status.ok()) return Refuse(status, FileSignature(path));
  return status;
}

absl::Status RidgeFillMapsManager::Load(const std::string& path) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  const absl::Time start = absl::Now();
  RS_ASSIGN_OR_RETURN(std::unique_ptr<MapFile> file, OpenRidgeFillMapFile(path, model_));
  std::vector<int32_t> splits;
  for (const SplitMaps& s : file->maps().splits) splits.push_back(s.split_layer);
  std::sort(splits.begin(), splits.end());
  if (splits.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no split layers"));
  int32_t default_split = options_.default_split_layer;
  if (default_split < 0) {
    default_split = splits.back();
  } else if (file->FindSplit(default_split) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--default_split_layer ", default_split, ": ",
                                                   path, " has no maps for it (it has ",
                                                   absl::StrJoin(splits, ", "), ")"));
  }
  // The upload is backend work: on the engine thread, between two steps.
  absl::StatusOr<std::unique_ptr<RidgeFillMaps>> uploaded =
      absl::UnavailableError("engine stopped");
  RS_RETURN_IF_ERROR(engine_.RunOnEngineThread(
      [&] { uploaded = UploadRidgeFillMaps(*file, model_, options_.max_leverage); }));
  if (!uploaded.ok()) return uploaded.status();
  // Freed on the engine thread too, when the last request on them is done (the deleter may
  // run on any thread; on the engine thread RunOnEngineThread runs it at once).
  Engine* engine = &engine_;
  std::shared_ptr<const RidgeFillMaps> maps(uploaded->release(), [engine](RidgeFillMaps* p) {
    if (!engine->RunOnEngineThread([p] { delete p; }).ok()) delete p;
  });
  uint64_t version;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RidgeFillMapsSnapshot& c = current_;
    c.state = RidgeFillMapsState::kLoaded;
    c.split_layers = splits;
    c.default_split_layer = default_split;
    c.version = version = c.version + 1;
    c.checksum = file->checksum();
    c.path = path;
    c.calibrated_tokens = c.calibration_tokens = 0;
    c.unavailable.clear();
    ++c.reloads_ok;
    last_refused_.clear();
    std::swap(c.maps, maps);
  }
  // `maps` now holds the old maps (if any); requests still on them keep them alive.
  maps.reset();
  spdlog::info(
      "RidgeFill maps {}: version {} (checksum {}), split layers {}, default {}, loaded "
      "in {:.2f} s",
      path, version, Hex(file->checksum()), absl::StrJoin(splits, ", "), default_split,
      absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

// PATH.progress: the calibrator's stderr ("calibrate: 12288/65536 tokens, ...") and
// make_maps.sh's own lines ("make_maps: ..."). Sets current_'s progress and `unavailable`.
void RidgeFillMapsManager::ReadProgress() {
  const std::string progress_path = options_.path + ".progress";
  std::ifstream in(progress_path);
  long long done = 0, total = 0;
  std::string script_line;
  bool have_file = in.good();
  for (std::string line; std::getline(in, line);) {
    long long d, t;
    if (std::sscanf(line.c_str(), "calibrate: %lld/%lld tokens", &d, &t) == 2) {
      done = d;
      total = t;
    } else if (line.rfind("make_maps: ", 0) == 0) {
      script_line = line.substr(11);
    }
  }
  std::string text;
  if (script_line.rfind("failed", 0) == 0) {
    text = absl::StrCat("RidgeFill maps calibration failed (", progress_path, ": ", script_line,
                        "); exact requests are served");
  } else if (total > 0) {
    text = absl::StrFormat(
        "RidgeFill maps are being calibrated: %lld/%lld tokens (%.0f%%)%s; RIDGEFILL is "
        "available when %s is written, exact requests are served meanwhile",
        done, total, 100.0 * static_cast<double>(done) / static_cast<double>(total),
        done >= total ? ", solving the maps" : "", options_.path);
  } else if (have_file) {
    text = absl::StrCat(
        "RidgeFill maps are being calibrated: ", script_line.empty() ? "starting" : script_line,
        "; RIDGEFILL is available "
        "when ",
        options_.path, " is written, exact requests are served meanwhile");
  } else {
    text = absl::StrCat("RidgeFill maps are not loaded yet: waiting for ", options_.path,
                        " (no calibration progress in ", progress_path,
                        "); exact requests are served meanwhile");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (current_.state != RidgeFillMapsState::kCalibrating) return;
  current_.calibrated_tokens = done;
  current_.calibration_tokens = total;
  current_.unavailable = std::move(text);
}

void RidgeFillMapsManager::Watch() {
  while (true) {
    bool reload = false;
    RidgeFillMapsState state;
    std::vector<ReloadDone> waiters;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.poll_interval),
                   [&] { return stopping_ || reload_requested_; });
      if (stopping_) return;
      reload = reload_requested_;
      reload_requested_ = false;
      waiters.swap(reload_waiters_);
      state = current_.state;
    }
    const std::string signature = FileSignature(options_.path);
    if (!reload) {
      // Without SIGHUP: only a file that appears while none is loaded (and not the one
      // refused before).
      if (state == RidgeFillMapsState::kLoaded) continue;
      if (signature.empty()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (current_.state == RidgeFillMapsState::kFailed) {
            current_.state = RidgeFillMapsState::kCalibrating;
          }
        }
        ReadProgress();
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (signature == last_refused_) continue;
    }
    absl::Status status = Load(options_.path);
    if (!status.ok()) status = Refuse(status, signature);
    const RidgeFillMapsSnapshot after = Snapshot();
    for (const ReloadDone& done : waiters) done(status, after);
  }
}

absl::Status RidgeFillMapsManager::Refuse(const absl::Status& error, const std::string& signature) {
  std::lock_guard<std::mutex> lock(mu_);
  ++current_.reloads_refused;
  last_refused_ = signature;
  std::string line;
  if (current_.state == RidgeFillMapsState::kLoaded) {
    // One line; the maps in use stay.
    line = absl::StrCat("RidgeFill maps reload refused, keeping version ", current_.version, ": ",
                        error.ToString());
  } else {
    line = absl::StrCat("RidgeFill maps refused: ", error.ToString());
    if (!signature.empty()) {
      current_.state = RidgeFillMapsState::kFailed;
      current_.unavailable =
          absl::StrCat("RidgeFill maps ", options_.path, " were refused: ", error.message());
    }
  }
  spdlog::error(line);
  return absl::FailedPreconditionError(line);
}

}  // namespace ridgeserve
