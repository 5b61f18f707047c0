// What RidgeFill's shadow-exact sampling measures (ridgefill_shadow.h): the next-token
// distribution after the prompt, exact against RidgeFill-filled, and the tokens the request
// generated, scored under both.
#ifndef RIDGESERVE_SERVER_SHADOW_COMPARISON_H_
#define RIDGESERVE_SERVER_SHADOW_COMPARISON_H_

#include <cstdint>

namespace ridgeserve {

struct ShadowComparison {
  int32_t split_layer = -1;
  // KL(exact ‖ RidgeFill) of the distributions after the prompt, in nats
  // (CompareDistributions, engine/sampling/sampler.h).
  double kl = 0;
  // The two distributions' most likely tokens are the same.
  bool top1_agree = false;
  // The tokens the RidgeFill request generated (after the first one's distribution), and
  // their summed -log p, nats, under the RidgeFill run and under the exact shadow.
  int32_t tokens = 0;
  double ridgefill_nll = 0;
  double exact_nll = 0;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_SHADOW_COMPARISON_H_
