// Prometheus metrics of one ridgeserve process (DESIGN.md, "Metrics (interface)"), exported
// with prometheus-cpp on --metrics_port at /metrics. Names follow Prometheus conventions
// (`ridgeserve_` prefix, base units, `_total` counters); histogram bucket edges are vLLM's, so
// its dashboards port over.
//
// What is counted, and when (each request is counted once, in exactly one of the two
// families: sum(ridgeserve_requests_total) + sum(ridgeserve_request_errors_total) = calls):
// - ridgeserve_requests_total{finish_reason, prefill_mode}: requests that reached the engine
//   and ended with an OK status, at their final event. finish_reason: stop, length,
//   stop_sequence, aborted (client cancel, deadline, Abort, drain).
// - ridgeserve_request_errors_total{code}: every Generate/GenerateStream call the server
//   ends with a non-OK status (gRPC code name, e.g. INVALID_ARGUMENT): refused at validation,
//   admission or submission, or failed in the engine.
// - prefill_mode is what the engine did: "ridgefill" when the prompt was prefilled with a
//   RidgeFill split (TokenEvent::split_layer), "spec_pc" / "spec_kv" for a SpecPC / SpecKV
//   request whose budget is below its prompt length (the engine runs a prompt within the
//   budget exactly), else "exact" (also RidgeFill requests with nothing to fill).
// - At a request's first token: ridgeserve_time_to_first_token_seconds (engine-measured),
//   ridgeserve_prompt_tokens_total; for RidgeFill requests that filled rows the filled
//   and skipped layer-token counters and ridgeserve_ridgefill_ttft_saved_seconds; for
//   spec_pc requests ridgeserve_spec_pc_dropped_prompt_tokens_total (prompt tokens the target
//   never prefilled) and ridgeserve_spec_pc_ttft_saved_seconds (the engine's estimate, priced
//   as RidgeFill's is, less the draft's time); for spec_kv requests
//   ridgeserve_spec_kv_kept_kv_tokens_total and ridgeserve_spec_kv_dropped_kv_tokens_total
//   (prompt KV entries per layer and KV head kept after the prefill, the budget, and dropped,
//   prompt_tokens - kept: multiply by layers x KV heads for entries, or by the bytes of one
//   token's KV for memory).
// - At every later event that carries tokens: ridgeserve_inter_token_latency_seconds, one
//   observation per event (an event carrying several tokens is one gap, as in vLLM), timed on
//   the steady clock when the engine thread hands the event to the server (right after
//   sampling, before the event waits for its call's lane), so the gap is the engine's
//   step-to-step time for that request.
// - ridgeserve_generation_tokens_total: tokens the engine generated, as they are produced
//   (including tokens dropped after a stop string matched: they were computed).
// - At the final OK event: ridgeserve_e2e_request_latency_seconds, and for requests that got
//   a first token, ridgeserve_request_queue_time_seconds and
//   ridgeserve_request_prefill_time_seconds (engine-measured), for spec_pc ones
//   ridgeserve_spec_pc_draft_seconds (the draft's prefill and lookahead) and for spec_kv ones
//   ridgeserve_spec_kv_draft_seconds (the draft's prefill and lookahead answer, and the KV
//   selection): a family of its own, as SpecKV's draft decodes up to 64 tokens where SpecPC's
//   usually decodes 1, so one histogram would mix two distributions.
// - Read from Engine::stats() at scrape time (never stale): ridgeserve_num_requests_running,
//   ridgeserve_num_requests_waiting, ridgeserve_kv_cache_usage_ratio (used / total blocks),
//   ridgeserve_num_preemptions_total, ridgeserve_engine_steps_total,
//   ridgeserve_engine_step_rows_total and ridgeserve_engine_step_seconds_total{part} (forward:
//   the model's forward passes; host: the rest of the steps, on the engine thread).
// - ridgeserve_build_info{version, model, backend, tensor_parallel} 1.
// - Read from the RidgeFill maps manager at scrape time (SetRidgeFillMaps):
//   ridgeserve_ridgefill_maps_state{state} (1 for the state now, 0 for the others: none,
//   calibrating, loaded, failed), ridgeserve_ridgefill_maps_version (0: none loaded yet),
//   ridgeserve_ridgefill_calibration_progress_ratio (tokens calibrated / total while
//   calibrating, else 0) and ridgeserve_ridgefill_maps_reloads_total{result} (ok, refused).
// - Read from online calibration at scrape time (--ridgefill_online_calibration,
//   SetRidgeFillOnline): ridgeserve_ridgefill_online_offered_rows_total (rows the engine
//   handed over), ridgeserve_ridgefill_online_rows (served rows in its statistics),
//   ridgeserve_ridgefill_online_dropped_rows_total,
//   ridgeserve_ridgefill_online_accumulate_seconds_total,
//   ridgeserve_ridgefill_online_resolves_total{result} (ok, failed) and
//   ridgeserve_ridgefill_online_last_resolve_seconds.
// - RidgeFill shadow-exact sampling (--ridgefill_shadow_fraction, ridgefill_shadow.h), when a
//   shadow finishes, by split_layer: ridgeserve_ridgefill_shadow_samples_total,
//   ridgeserve_ridgefill_shadow_top1_agreement_total (the exact and RidgeFill distributions
//   after the prompt have the same most likely token), ridgeserve_ridgefill_shadow_kl
//   (KL(exact ‖ RidgeFill) of those distributions, nats), and for the tokens the request
//   generated ridgeserve_ridgefill_shadow_generated_tokens_total and
//   ridgeserve_ridgefill_shadow_generated_nll_total{prefill} (their summed -log p in nats
//   under "ridgefill" and under "exact" prefill: the ratio of the two rates to the tokens'
//   rate is the per-token NLL of each). With sampling on, each split layer of the maps in
//   use has these series at 0 from the first scrape after the maps are loaded.
//   ridgeserve_ridgefill_shadow_dropped_total{reason}:
//   sampled requests whose shadow did not run: "queue" (requests were waiting when it
//   finished) or "displaced" (the engine dropped it for other requests). Shadows are engine
//   requests of their own and are in no other ridgeserve_* family but the engine gauges.
//
// Threading: every method is thread-safe. RequestMetrics belongs to one request and is fed
// its events in order (on its call's lane).
#ifndef RIDGESERVE_SERVER_METRICS_H_
#define RIDGESERVE_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/ridgefill/online_calibration.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "ridgeserve/v1/ridgeserve.pb.h"
#include "server/ridgefill_maps_manager.h"
#include "server/shadow_comparison.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace ridgeserve {

class ServerMetrics {
 public:
  struct BuildInfo {
    std::string version;
    std::string model;
    std::string backend;
    int32_t tensor_parallel = 1;
  };

  // Registers every metric. `engine_stats` is called on every scrape (any thread), typically
  // Engine::stats of an engine that outlives the metrics.
  ServerMetrics(std::function<EngineStats()> engine_stats, const BuildInfo& info);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Serves /metrics on host:port over HTTP (port 0: a free one, see port()). Called at most
  // once; without it the metrics are kept but not exported.
  absl::Status Serve(const std::string& host, int port);
  // The port /metrics is served on; 0 before Serve.
  int port() const { return port_; }

  // The text exposition format of every ridgeserve_* metric, as /metrics serves them (beside
  // prometheus-cpp's own exposer_* metrics there).
  std::string Render() const;

  // A Generate/GenerateStream call ended with this non-OK status.
  void RecordError(absl::StatusCode code);

  // Exports the RidgeFill maps' state (see above), read on every scrape. Before Serve.
  void SetRidgeFillMaps(std::function<RidgeFillMapsSnapshot()> snapshot);
  // Exports online calibration's state (see above), read on every scrape. Before Serve.
  void SetRidgeFillOnline(std::function<OnlineCalibrationStatus()> status);

  // RidgeFill shadow-exact sampling (see above): one comparison, or one shadow that did not
  // run ("queue" or "displaced").
  void RecordShadow(const ShadowComparison& comparison);
  void RecordShadowDropped(const char* reason);
  // From now on every split layer of the maps in use has its shadow series, at 0, from the
  // first scrape after the maps are loaded on: rates then count each split's first comparison
  // when a scrape comes between the load and that comparison.
  // RidgeFillShadow calls it; needs SetRidgeFillMaps.
  void ExportShadowSeriesBySplit() { shadow_by_split_ = true; }

 private:
  friend class RequestMetrics;
  class EngineCollector;

  // The latency histograms of one prefill mode.
  struct ModeMetrics {
    prometheus::Histogram* ttft = nullptr;
    prometheus::Histogram* itl = nullptr;
    prometheus::Histogram* e2e = nullptr;
    prometheus::Histogram* queue = nullptr;
    prometheus::Histogram* prefill = nullptr;
    const char* label = "";  // prefill_mode
  };
  enum Mode { kExact, kRidgeFill, kSpecPc, kSpecKv, kNumModes };  // index into modes_
  // ridgeserve_requests_total{finish_reason (lower case), prefill_mode}.
  prometheus::Counter& RequestCounter(const ModeMetrics& mode, v1::FinishReason reason);
  // The shadow series of one split layer (Family::Add: created at 0 the first time).
  struct ShadowSeries {
    prometheus::Counter* samples;
    prometheus::Counter* top1;
    prometheus::Histogram* kl;
    prometheus::Counter* tokens;
    prometheus::Counter* ridgefill_nll;
    prometheus::Counter* exact_nll;
  };
  ShadowSeries ShadowSeriesOf(int32_t split_layer);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<EngineCollector> engine_collector_;
  std::array<ModeMetrics, kNumModes> modes_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* errors_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Counter* filled_tokens_ = nullptr;
  prometheus::Counter* skipped_layer_tokens_ = nullptr;
  prometheus::Histogram* ttft_saved_ = nullptr;  // RidgeFill's
  prometheus::Counter* spec_pc_dropped_tokens_ = nullptr;
  prometheus::Histogram* spec_pc_draft_ = nullptr;
  prometheus::Histogram* spec_pc_ttft_saved_ = nullptr;
  prometheus::Counter* spec_kv_kept_tokens_ = nullptr;
  prometheus::Counter* spec_kv_dropped_tokens_ = nullptr;
  prometheus::Histogram* spec_kv_draft_ = nullptr;
  prometheus::Family<prometheus::Counter>* shadow_samples_ = nullptr;
  prometheus::Family<prometheus::Counter>* shadow_top1_ = nullptr;
  prometheus::Family<prometheus::Histogram>* shadow_kl_ = nullptr;
  prometheus::Family<prometheus::Counter>* shadow_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* shadow_nll_ = nullptr;
  prometheus::Family<prometheus::Counter>* shadow_dropped_ = nullptr;
  std::atomic<bool> shadow_by_split_ = false;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// One request's metrics: turns its engine events into observations, each at most once.
class RequestMetrics {
 public:
  // `request` as submitted: a SpecPC / SpecKV budget below its prompt length makes it
  // "spec_pc" / "spec_kv".
  RequestMetrics(ServerMetrics& metrics, const EngineRequest& request);

  using Clock = std::chrono::steady_clock;

  // Every engine event of the request, in order. `finish_reason` is what the client is told on
  // the final event (STOP_SEQUENCE when the server matched a stop string); unused before.
  // `handed_over`: when the engine thread handed the event over.
  void OnEvent(const TokenEvent& event, v1::FinishReason finish_reason,
               Clock::time_point handed_over = Clock::now());

 private:
  ServerMetrics& metrics_;
  const bool spec_pc_;
  const bool spec_kv_;
  std::optional<Clock::time_point> last_token_;  // when the previous tokens arrived
  bool finished_ = false;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_METRICS_H_
