#include "server/shadow_comparison.h"

#include <cassert>
#include <cmath>

#include "engine/sampling/sampler.h"

namespace ridgeserve {

ShadowComparison CompareDistributions(std::span<const float> exact_logprobs,
                                      std::span<const float> filled_logprobs) {
  assert(exact_logprobs.size() == filled_logprobs.size());
  ShadowComparison c;
  double kl = 0;
  for (size_t i = 0; i < exact_logprobs.size(); ++i) {
    const double lp = exact_logprobs[i];
    const double p = std::exp(lp);
    if (p > 0) kl += p * (lp - static_cast<double>(filled_logprobs[i]));
  }
  // Rounding can leave a tiny negative sum for equal distributions.
  c.kl = kl > 0 ? kl : 0;
  c.top1_agree = Argmax(exact_logprobs) == Argmax(filled_logprobs);
  return c;
}

}  // namespace ridgeserve
