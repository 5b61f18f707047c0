#include "server/ridgefill_shadow.h"

#include <limits>
#include <memory>
#include <utility>

#include "server/shadow_comparison.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

void RidgeFillShadow::Sink::RecordDropped(const char* reason) {
  std::lock_guard<std::mutex> lock(mu);
  if (metrics != nullptr) metrics->RecordShadowDropped(reason);
}

RidgeFillShadow::RidgeFillShadow(Engine& engine, ServerMetrics& metrics, double fraction,
                                 uint64_t seed)
    : engine_(engine), sink_(std::make_shared<Sink>()), fraction_(fraction), rng_(seed) {
  sink_->metrics = &metrics;
  metrics.ExportShadowSeriesBySplit();
}

RidgeFillShadow::~RidgeFillShadow() {
  std::lock_guard<std::mutex> lock(sink_->mu);
  sink_->metrics = nullptr;
}

bool RidgeFillShadow::Sample(EngineRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) >= fraction_) return false;
  }
  request.scoring.capture = true;
  return true;
}

void RidgeFillShadow::Shadow(Sampled sampled) {
  if (sampled.first_logprobs.empty()) return;  // nothing captured to compare with
  if (engine_.stats().num_waiting > 0) {
    sink_->RecordDropped("queue");
    return;
  }
  EngineRequest r;
  r.prompt = std::move(sampled.prompt);
  r.sampling.temperature = 0;
  r.priority = std::numeric_limits<int32_t>::max();
  r.scoring.capture = true;
  r.scoring.background = true;
  // Forced through what the request generated; one token (any: only the distribution after
  // the prompt counts) when it stopped at once.
  r.scoring.forced = sampled.tokens;
  if (r.scoring.forced.empty()) r.scoring.forced.push_back(Argmax(sampled.first_logprobs));
  r.max_new_tokens = static_cast<int32_t>(r.scoring.forced.size());
  // The exact side arrives in the shadow's events; the RidgeFill side waits here.
  struct Pending {
    Sampled filled;
    std::vector<float> exact_first;
  };
  auto pending = std::make_shared<Pending>();
  pending->filled = std::move(sampled);
  r.on_event = [pending, sink = sink_](const TokenEvent& e) {
    if (!e.first_logprobs.empty()) pending->exact_first = e.first_logprobs;
    // Aborted: the engine is stopping.
    if (!e.finished || e.finish_reason == FinishReason::kAborted) return;
    if (!e.status.ok()) {
      if (e.status.code() == absl::StatusCode::kUnavailable) {
        sink->RecordDropped("displaced");
      } else {
        spdlog::warn("RidgeFill shadow request failed: {}", e.status.ToString());
      }
      return;
    }
    const Sampled& f = pending->filled;
    if (pending->exact_first.size() != f.first_logprobs.size()) {
      spdlog::warn("RidgeFill shadow request: no distribution to compare");
      return;
    }
    const DistributionGap gap = CompareDistributions(pending->exact_first, f.first_logprobs);
    ShadowComparison c;
    c.kl = gap.kl;
    c.top1_agree = gap.top1_agree;
    c.split_layer = f.split_layer;
    c.tokens = static_cast<int32_t>(f.tokens.size());
    if (c.tokens > 0) {
      c.ridgefill_nll = f.nll;
      c.exact_nll = e.emitted_nll;
    }
    std::lock_guard<std::mutex> lock(sink->mu);
    if (sink->metrics != nullptr) sink->metrics->RecordShadow(c);
  };
  if (absl::StatusOr<uint64_t> id = engine_.Submit(std::move(r)); !id.ok()) {
    sink_->RecordDropped("queue");
  }
}

}  // namespace ridgeserve
