#include "server/metrics.h"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace ridgeserve {
namespace {

// vLLM's bucket edges (vllm/v1/metrics/loggers.py), seconds.
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const prometheus::Histogram::BucketBoundaries kItlBuckets = {
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const prometheus::Histogram::BucketBoundaries kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// KL(exact ‖ RidgeFill), nats: from distributions that agree to a few parts in ten thousand up
// to ones that share little.
const prometheus::Histogram::BucketBoundaries kShadowKlBuckets = {
    0.0003, 0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0};

// prefill_mode labels, by ServerMetrics::Mode.
constexpr const char* kPrefillModes[] = {"exact", "ridgefill", "spec_pc", "spec_kv"};

// Engine::stats() turned into gauges and a counter at scrape time, so they are never stale.
prometheus::MetricFamily OneValue(const char* name, const char* help, prometheus::MetricType type,
                                  double value) {
  prometheus::MetricFamily family{name, help, type, {}};
  prometheus::ClientMetric& m = family.metric.emplace_back();
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return family;
}

// A counter family with one label: one series per (label value, count).
template <typename Count>
prometheus::MetricFamily CounterBy(const char* name, const char* help, const char* label,
                                   std::initializer_list<std::pair<const char*, Count>> values) {
  prometheus::MetricFamily family{name, help, prometheus::MetricType::Counter, {}};
  for (const auto& [value, n] : values) {
    prometheus::ClientMetric& c = family.metric.emplace_back();
    c.label.push_back({label, value});
    c.counter.value = static_cast<double>(n);
  }
  return family;
}

}  // namespace

class ServerMetrics::EngineCollector final : public prometheus::Collectable {
 public:
  explicit EngineCollector(std::function<EngineStats()> stats) : stats_(std::move(stats)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const EngineStats s = stats_();
    const double usage =
        s.kv_blocks_total > 0
            ? static_cast<double>(s.kv_blocks_total - s.kv_blocks_free) / s.kv_blocks_total
            : 0.0;
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> families = {
        OneValue("ridgeserve_num_requests_running",
                 "Requests prefilling or decoding in the engine.", MetricType::Gauge,
                 s.num_running),
        OneValue("ridgeserve_num_requests_waiting", "Requests waiting to be scheduled.",
                 MetricType::Gauge, s.num_waiting),
        OneValue("ridgeserve_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0 to 1).",
                 MetricType::Gauge, usage),
        OneValue("ridgeserve_num_preemptions_total",
                 "Requests preempted (their KV blocks freed, to be recomputed).",
                 MetricType::Counter, static_cast<double>(s.num_preemptions)),
        OneValue("ridgeserve_engine_steps_total", "Engine steps that ran the model.",
                 MetricType::Counter, static_cast<double>(s.num_steps)),
        OneValue("ridgeserve_engine_step_rows_total",
                 "Rows (prompt and decode tokens) of the model's forward passes in engine steps.",
                 MetricType::Counter, static_cast<double>(s.step_rows)),
        CounterBy<double>(
            "ridgeserve_engine_step_seconds_total",
            "Wall time of engine steps: part forward on the backend (the model's forward "
            "passes, target and draft, and drawing the tokens), part host on the engine "
            "thread around them (scheduling, building the batch, handing tokens to their "
            "requests).",
            "part",
            {{"forward", s.forward_seconds},
             {"host", std::max(0.0, s.step_seconds - s.forward_seconds)}}),
        OneValue("ridgeserve_engine_step_in_progress_seconds",
                 "How long the engine step now running has run (0 between steps); past "
                 "--step_timeout_s the engine stalls.",
                 MetricType::Gauge, s.step_in_progress_seconds),
        OneValue("ridgeserve_engine_broken",
                 "1 once the engine can run no more steps (a step past --step_timeout_s, or a "
                 "tensor-parallel group that failed for good): health NOT_SERVING, requests "
                 "UNAVAILABLE.",
                 MetricType::Gauge, s.broken ? 1 : 0),
    };
    if (ridgefill_ != nullptr) AppendRidgeFill(ridgefill_(), families);
    if (online_ != nullptr) AppendOnline(online_(), families);
    return families;
  }

  // Set before the exposer starts scraping.
  std::function<RidgeFillMapsSnapshot()> ridgefill_;
  std::function<OnlineCalibrationStatus()> online_;

 private:
  static void AppendRidgeFill(const RidgeFillMapsSnapshot& m,
                              std::vector<prometheus::MetricFamily>& out) {
    using prometheus::MetricType;
    prometheus::MetricFamily state{"ridgeserve_ridgefill_maps_state",
                                   "RidgeFill maps state: 1 for the state now (none, calibrating, "
                                   "loaded, failed), 0 for the others.",
                                   MetricType::Gauge,
                                   {}};
    for (RidgeFillMapsState s : {RidgeFillMapsState::kNone, RidgeFillMapsState::kCalibrating,
                                 RidgeFillMapsState::kLoaded, RidgeFillMapsState::kFailed}) {
      prometheus::ClientMetric& c = state.metric.emplace_back();
      c.label.push_back({"state", RidgeFillMapsStateName(s)});
      c.gauge.value = s == m.state ? 1 : 0;
    }
    out.push_back(std::move(state));
    out.push_back(OneValue("ridgeserve_ridgefill_maps_version",
                           "Version of the RidgeFill maps in use: 1 for the first loaded, +1 per "
                           "reload; 0 before any.",
                           MetricType::Gauge, static_cast<double>(m.version)));
    out.push_back(OneValue(
        "ridgeserve_ridgefill_calibration_progress_ratio",
        "While the RidgeFill maps are being calibrated: tokens done / total (0 to 1), else 0.",
        MetricType::Gauge,
        m.calibration_tokens > 0
            ? static_cast<double>(m.calibrated_tokens) / static_cast<double>(m.calibration_tokens)
            : 0.0));
    out.push_back(CounterBy<int64_t>("ridgeserve_ridgefill_maps_reloads_total",
                                     "RidgeFill map files loaded after the start (result ok) or "
                                     "refused, keeping the maps in use (result refused).",
                                     "result",
                                     {{"ok", m.reloads_ok}, {"refused", m.reloads_refused}}));
  }

  static void AppendOnline(const OnlineCalibrationStatus& o,
                           std::vector<prometheus::MetricFamily>& out) {
    using prometheus::MetricType;
    out.push_back(OneValue("ridgeserve_ridgefill_online_offered_rows_total",
                           "Served prompt rows the engine handed to online calibration since the "
                           "start (accumulated, queued or dropped).",
                           MetricType::Counter, static_cast<double>(o.offered_rows)));
    out.push_back(OneValue("ridgeserve_ridgefill_online_rows",
                           "Served prompt rows in the online calibration statistics (checkpoint "
                           "included).",
                           MetricType::Gauge, static_cast<double>(o.rows)));
    out.push_back(OneValue("ridgeserve_ridgefill_online_dropped_rows_total",
                           "Served rows online calibration left out because its queue was full "
                           "(the accumulating thread runs at the lowest priority).",
                           MetricType::Counter, static_cast<double>(o.dropped_rows)));
    out.push_back(OneValue("ridgeserve_ridgefill_online_accumulate_seconds_total",
                           "Time online calibration spent adding served rows to its statistics.",
                           MetricType::Counter, o.accumulate_seconds));
    out.push_back(
        CounterBy<int64_t>("ridgeserve_ridgefill_online_resolves_total",
                           "Online re-solves of the RidgeFill maps: swapped in (result ok) "
                           "or failed (the maps in use stayed).",
                           "result", {{"ok", o.resolves}, {"failed", o.failed_resolves}}));
    out.push_back(OneValue("ridgeserve_ridgefill_online_last_resolve_seconds",
                           "Duration of the last online re-solve (maps and checkpoint written).",
                           MetricType::Gauge, o.last_resolve_seconds));
  }

  const std::function<EngineStats()> stats_;
};

void ServerMetrics::SetRidgeFillMaps(std::function<RidgeFillMapsSnapshot()> snapshot) {
  // The collector runs before the registry's families in a scrape (Serve), so series added
  // here are in the same one.
  engine_collector_->ridgefill_ = [this, snapshot = std::move(snapshot)] {
    RidgeFillMapsSnapshot s = snapshot();
    if (shadow_by_split_) {
      for (int32_t split : s.split_layers) ShadowSeriesOf(split);
    }
    return s;
  };
}

void ServerMetrics::SetRidgeFillOnline(std::function<OnlineCalibrationStatus()> status) {
  engine_collector_->online_ = std::move(status);
}

ServerMetrics::ServerMetrics(std::function<EngineStats()> engine_stats, const BuildInfo& info)
    : registry_(std::make_shared<prometheus::Registry>()),
      engine_collector_(std::make_shared<EngineCollector>(std::move(engine_stats))) {
  prometheus::Registry& r = *registry_;
  auto histogram = [&r](const char* name,
                        const char* help) -> prometheus::Family<prometheus::Histogram>& {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
  };
  auto& ttft = histogram("ridgeserve_time_to_first_token_seconds",
                         "Time from arrival to the first token, by prefill mode.");
  auto& itl = histogram("ridgeserve_inter_token_latency_seconds",
                        "Time between consecutive token events of a request, by prefill mode.");
  auto& e2e = histogram("ridgeserve_e2e_request_latency_seconds",
                        "Time from arrival to the final event, by prefill mode.");
  auto& queue = histogram("ridgeserve_request_queue_time_seconds",
                          "Time from arrival to first scheduled, by prefill mode.");
  auto& prefill = histogram("ridgeserve_request_prefill_time_seconds",
                            "Time from first scheduled to the first token, by prefill mode.");
  requests_ =
      &prometheus::BuildCounter()
           .Name("ridgeserve_requests_total")
           .Help(
               "Requests that reached the engine and ended OK, by finish reason and prefill mode.")
           .Register(r);
  for (int mode = 0; mode < kNumModes; ++mode) {
    ModeMetrics& m = modes_[mode];
    m.label = kPrefillModes[mode];
    const prometheus::Labels labels = {{"prefill_mode", m.label}};
    m.ttft = &ttft.Add(labels, kTtftBuckets);
    m.itl = &itl.Add(labels, kItlBuckets);
    m.e2e = &e2e.Add(labels, kRequestLatencyBuckets);
    m.queue = &queue.Add(labels, kRequestLatencyBuckets);
    m.prefill = &prefill.Add(labels, kRequestLatencyBuckets);
    // Every (finish_reason, prefill_mode) series exists from the start, so rate() sees the
    // first request of each.
    for (v1::FinishReason reason : {v1::STOP, v1::LENGTH, v1::STOP_SEQUENCE, v1::ABORTED}) {
      RequestCounter(m, reason);
    }
  }
  errors_ = &prometheus::BuildCounter()
                 .Name("ridgeserve_request_errors_total")
                 .Help("Generate/GenerateStream calls ended with a non-OK status, by gRPC code.")
                 .Register(r);
  // The codes the server itself returns exist from the start (others appear when first seen).
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kUnavailable, absl::StatusCode::kAlreadyExists,
        absl::StatusCode::kInternal}) {
    errors_->Add({{"code", absl::StatusCodeToString(code)}});
  }
  auto counter = [&r](const char* name, const char* help) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
  };
  prompt_tokens_ = &counter("ridgeserve_prompt_tokens_total",
                            "Prompt tokens of requests whose prefill completed.");
  generation_tokens_ =
      &counter("ridgeserve_generation_tokens_total", "Tokens generated by the engine.");
  filled_tokens_ = &counter("ridgeserve_ridgefill_filled_tokens_total",
                            "RidgeFill: prompt rows filled approximately instead of run exactly.");
  skipped_layer_tokens_ = &counter("ridgeserve_ridgefill_skipped_layer_tokens_total",
                                   "RidgeFill: sum over filled rows of the layers they skipped.");
  ttft_saved_ =
      &histogram("ridgeserve_ridgefill_ttft_saved_seconds",
                 "RidgeFill: per-request estimate of the prefill time the filled rows saved "
                 "(measured per-row cost of the exact layers), for requests that filled rows.")
           .Add({}, kTtftBuckets);
  spec_pc_dropped_tokens_ =
      &counter("ridgeserve_spec_pc_dropped_prompt_tokens_total",
               "SpecPC: prompt tokens the draft's scores dropped (never prefilled by the model).");
  spec_pc_draft_ = &histogram("ridgeserve_spec_pc_draft_seconds",
                              "SpecPC: per-request time of the draft's prefill and lookahead.")
                        .Add({}, kTtftBuckets);
  spec_pc_ttft_saved_ =
      &histogram("ridgeserve_spec_pc_ttft_saved_seconds",
                 "SpecPC: per-request estimate of the prefill time the dropped tokens saved "
                 "(measured per-token cost of the prefill that ran the kept ones), less the "
                 "draft's time.")
           .Add({}, kTtftBuckets);
  spec_kv_kept_tokens_ =
      &counter("ridgeserve_spec_kv_kept_kv_tokens_total",
               "SpecKV: prompt KV entries kept per layer and KV head after the prefill (the "
               "budget), summed over requests.");
  spec_kv_dropped_tokens_ =
      &counter("ridgeserve_spec_kv_dropped_kv_tokens_total",
               "SpecKV: prompt KV entries dropped per layer and KV head after the prefill (prompt "
               "tokens - budget), summed over requests.");
  spec_kv_draft_ =
      &histogram("ridgeserve_spec_kv_draft_seconds",
                 "SpecKV: per-request time of the draft's prefill and lookahead answer and the KV "
                 "selection.")
           .Add({}, kTtftBuckets);
  auto family = [&r](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  shadow_samples_ = family("ridgeserve_ridgefill_shadow_samples_total",
                           "RidgeFill shadow sampling: requests compared with their exact "
                           "shadow, by split layer.");
  shadow_top1_ = family("ridgeserve_ridgefill_shadow_top1_agreement_total",
                        "RidgeFill shadow sampling: compared requests whose next-token "
                        "distribution after the prompt has the exact one's most likely token.");
  shadow_kl_ = &histogram("ridgeserve_ridgefill_shadow_kl",
                          "RidgeFill shadow sampling: KL(exact || RidgeFill) of the next-token "
                          "distributions after the prompt, nats, by split layer.");
  shadow_tokens_ = family("ridgeserve_ridgefill_shadow_generated_tokens_total",
                          "RidgeFill shadow sampling: tokens the compared requests generated.");
  shadow_nll_ = family("ridgeserve_ridgefill_shadow_generated_nll_total",
                       "RidgeFill shadow sampling: summed -log p (nats) of the compared requests' "
                       "generated tokens, under ridgefill and under exact prefill.");
  shadow_dropped_ = family("ridgeserve_ridgefill_shadow_dropped_total",
                           "RidgeFill shadow sampling: sampled requests whose shadow did not run "
                           "(queue: requests waiting; displaced: dropped for other requests).");
  for (const char* reason : {"queue", "displaced"}) shadow_dropped_->Add({{"reason", reason}});
  prometheus::BuildGauge()
      .Name("ridgeserve_build_info")
      .Help("Build and serving configuration; always 1.")
      .Register(r)
      .Add({{"version", info.version},
            {"model", info.model},
            {"backend", info.backend},
            {"tensor_parallel", absl::StrCat(info.tensor_parallel)}})
      .Set(1);
}

ServerMetrics::~ServerMetrics() = default;

absl::Status ServerMetrics::Serve(const std::string& host, int port) {
  const bool ipv6 = absl::StrContains(host, ':') && !absl::StartsWith(host, "[");
  const std::string address =
      ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  // The engine collector first: shadow series it adds (SetRidgeFillMaps) are then in the
  // registry's part of the same scrape.
  exposer_->RegisterCollectable(engine_collector_);
  exposer_->RegisterCollectable(registry_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    exposer_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  port_ = ports.front();
  return absl::OkStatus();
}

std::string ServerMetrics::Render() const {
  // In the exposer's order (Serve).
  std::vector<prometheus::MetricFamily> families = engine_collector_->Collect();
  for (prometheus::MetricFamily& f : registry_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

prometheus::Counter& ServerMetrics::RequestCounter(const ModeMetrics& mode,
                                                   v1::FinishReason reason) {
  // Family::Add returns the existing series for labels it has seen.
  return requests_->Add({{"finish_reason", absl::AsciiStrToLower(v1::FinishReason_Name(reason))},
                         {"prefill_mode", mode.label}});
}

void ServerMetrics::RecordError(absl::StatusCode code) {
  errors_->Add({{"code", absl::StatusCodeToString(code)}}).Increment();
}

ServerMetrics::ShadowSeries ServerMetrics::ShadowSeriesOf(int32_t split_layer) {
  const std::string split = absl::StrCat(split_layer);
  const prometheus::Labels labels = {{"split_layer", split}};
  return {&shadow_samples_->Add(labels),
          &shadow_top1_->Add(labels),
          &shadow_kl_->Add(labels, kShadowKlBuckets),
          &shadow_tokens_->Add(labels),
          &shadow_nll_->Add({{"split_layer", split}, {"prefill", "ridgefill"}}),
          &shadow_nll_->Add({{"split_layer", split}, {"prefill", "exact"}})};
}

void ServerMetrics::RecordShadow(const ShadowComparison& c) {
  // Every series of a split exists from its first sample at the latest, so ratios of rates
  // see zeros.
  const ShadowSeries s = ShadowSeriesOf(c.split_layer);
  s.samples->Increment();
  s.top1->Increment(c.top1_agree ? 1 : 0);
  s.kl->Observe(c.kl);
  s.tokens->Increment(c.tokens);
  s.ridgefill_nll->Increment(c.ridgefill_nll);
  s.exact_nll->Increment(c.exact_nll);
}

void ServerMetrics::RecordShadowDropped(const char* reason) {
  shadow_dropped_->Add({{"reason", reason}}).Increment();
}

RequestMetrics::RequestMetrics(ServerMetrics& metrics, const EngineRequest& request)
    : metrics_(metrics),
      spec_pc_(request.spec_pc.budget > 0 &&
               static_cast<size_t>(request.spec_pc.budget) < request.prompt.size()),
      spec_kv_(request.spec_kv.budget > 0 &&
               static_cast<size_t>(request.spec_kv.budget) < request.prompt.size()) {}

void RequestMetrics::OnEvent(const TokenEvent& event, v1::FinishReason finish_reason,
                             Clock::time_point handed_over) {
  if (finished_) return;
  ServerMetrics::ModeMetrics& mode =
      metrics_.modes_[event.split_layer >= 0 ? ServerMetrics::kRidgeFill
                      : spec_pc_             ? ServerMetrics::kSpecPc
                      : spec_kv_             ? ServerMetrics::kSpecKv
                                             : ServerMetrics::kExact];
  if (!event.tokens.empty()) {
    if (!last_token_) {
      mode.ttft->Observe(event.timing.ttft_seconds);
      metrics_.prompt_tokens_->Increment(event.prompt_tokens);
      if (event.filled_prompt_tokens > 0) {
        metrics_.filled_tokens_->Increment(event.filled_prompt_tokens);
        metrics_.skipped_layer_tokens_->Increment(static_cast<double>(event.skipped_layer_tokens));
        metrics_.ttft_saved_->Observe(event.timing.estimated_ttft_saved_seconds);
      }
      if (spec_pc_) {
        metrics_.spec_pc_dropped_tokens_->Increment(event.prompt_tokens - event.kept_prompt_tokens);
        metrics_.spec_pc_ttft_saved_->Observe(event.timing.estimated_ttft_saved_seconds);
      }
      if (spec_kv_) {
        metrics_.spec_kv_kept_tokens_->Increment(event.kept_kv_tokens);
        metrics_.spec_kv_dropped_tokens_->Increment(event.prompt_tokens - event.kept_kv_tokens);
      }
    } else {
      mode.itl->Observe(std::chrono::duration<double>(handed_over - *last_token_).count());
    }
    last_token_ = handed_over;
    metrics_.generation_tokens_->Increment(static_cast<double>(event.tokens.size()));
  }
  if (!event.finished) return;
  finished_ = true;
  if (!event.status.ok()) {
    metrics_.RecordError(event.status.code());
    return;
  }
  metrics_.RequestCounter(mode, finish_reason).Increment();
  mode.e2e->Observe(event.timing.e2e_seconds);
  if (last_token_) {
    mode.queue->Observe(event.timing.queue_seconds);
    mode.prefill->Observe(event.timing.prefill_seconds);
    if (spec_pc_) metrics_.spec_pc_draft_->Observe(event.timing.draft_seconds);
    if (spec_kv_) metrics_.spec_kv_draft_->Observe(event.timing.draft_seconds);
  }
}

}  // namespace ridgeserve
