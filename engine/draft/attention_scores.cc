#include "engine/draft/attention_scores.h"

#include <algorithm>
#include <numeric>

namespace ridgeserve {

std::vector<float> CentredMaxPool(std::span<const float> scores, int32_t kernel) {
  const int32_t n = static_cast<int32_t>(scores.size());
  const int32_t left = (kernel - 1) / 2, right = kernel - 1 - left;
  std::vector<float> pooled(n);
  for (int32_t i = 0; i < n; ++i) {
    float m = 0.0f;  // the padding; scores are >= 0, so it never wins inside
    for (int32_t j = std::max(0, i - left); j <= std::min(n - 1, i + right); ++j) {
      m = std::max(m, scores[j]);
    }
    pooled[i] = m;
  }
  return pooled;
}

std::vector<int32_t> ByDecreasingScore(std::span<const float> scores) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  return order;
}

}  // namespace ridgeserve
