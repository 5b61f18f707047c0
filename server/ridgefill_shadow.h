// Shadow-exact quality sampling of RIDGEFILL requests (--ridgefill_shadow_fraction F): what
// RidgeFill costs on the traffic actually served. A sampled fraction F of the RIDGEFILL
// requests capture the distribution after the prompt and the -log p of the tokens they
// generate (ScoringRequest::capture). When one that filled rows finishes (stop or length), the
// exact prefill of the same prompt runs as a background engine request, teacher-forced through
// the same tokens: on idle capacity only, dropped under load (never delaying a real request
// by more than one step; SchedRequest::background). Its own capture gives KL(exact ‖
// RidgeFill), top-1 agreement and the tokens' NLL under exact prefill, exported by split
// layer (ServerMetrics::RecordShadow).
//
// Threading: Sample from gRPC threads, Shadow from the calls' event lanes; the shadows' events
// on the engine thread.
#ifndef RIDGESERVE_SERVER_RIDGEFILL_SHADOW_H_
#define RIDGESERVE_SERVER_RIDGEFILL_SHADOW_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace ridgeserve {

class RidgeFillShadow {
 public:
  // A sampled RIDGEFILL request's side of the comparison, gathered from its events.
  struct Sampled {
    std::vector<int32_t> prompt;
    int32_t split_layer = -1;
    int32_t filled_prompt_tokens = 0;
    std::vector<float> first_logprobs;
    std::vector<int32_t> tokens;  // generated (emitted) tokens
    double nll = 0;               // their -log p under the RidgeFill run
  };

  // `fraction` in (0, 1]. `engine` and `metrics` must outlive the shadow; shadows still in
  // the engine when it goes record nothing. Turns on metrics' shadow series by split layer.
  RidgeFillShadow(Engine& engine, ServerMetrics& metrics, double fraction, uint64_t seed);
  ~RidgeFillShadow();
  RidgeFillShadow(const RidgeFillShadow&) = delete;
  RidgeFillShadow& operator=(const RidgeFillShadow&) = delete;

  // For a RIDGEFILL request about to be submitted: true (and its capture set) when sampled.
  bool Sample(EngineRequest& request);
  // A sampled request finished: submits its exact shadow, unless other requests are waiting
  // (then it is counted as dropped).
  void Shadow(Sampled sampled);

 private:
  // Where the shadows' events record their results; metrics is null once the shadow is gone
  // (the engine may still end shadows after the server's metrics are destroyed).
  struct Sink {
    std::mutex mu;
    ServerMetrics* metrics = nullptr;
    void RecordDropped(const char* reason);
  };

  Engine& engine_;
  const std::shared_ptr<Sink> sink_;
  const double fraction_;
  std::mutex mu_;
  std::mt19937_64 rng_;  // under mu_
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_RIDGEFILL_SHADOW_H_
