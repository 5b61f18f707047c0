#include "engine/draft/attention_scores.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ridgeserve {

void AttentionProbabilities(const float* q, const float* keys, size_t key_stride, int32_t count,
                            int32_t dim, float scale, float* probs) {
  float max_logit = -INFINITY;
  for (int32_t j = 0; j < count; ++j) {
    const float* k = keys + j * key_stride;
    // Eight running sums (vectorized), then the tail.
    float acc[8] = {};
    int32_t e = 0;
    for (; e + 8 <= dim; e += 8) {
      for (int32_t u = 0; u < 8; ++u) acc[u] += q[e + u] * k[e + u];
    }
    float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; e < dim; ++e) dot += q[e] * k[e];
    probs[j] = dot * scale;
    max_logit = std::max(max_logit, probs[j]);
  }
  float sum = 0;
  for (int32_t j = 0; j < count; ++j) {
    probs[j] = std::exp(probs[j] - max_logit);
    sum += probs[j];
  }
  for (int32_t j = 0; j < count; ++j) probs[j] /= sum;
}

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

void ReadSequenceKv(const PagedKvCache& cache, Backend& backend, std::span<const int32_t> blocks,
                    int32_t layer, int32_t count, std::vector<float>& keys,
                    std::vector<float>& values) {
  const KvCacheShape& s = cache.shape();
  const size_t kv_dim = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  keys.resize(count * kv_dim);
  values.resize(count * kv_dim);
  for (int32_t pos = 0; pos < count; pos += s.block_size) {
    const int32_t n = std::min(s.block_size, count - pos);
    cache.CopyToHost(backend, layer, blocks[pos / s.block_size] * s.block_size, n,
                     keys.data() + pos * kv_dim, values.data() + pos * kv_dim);
  }
}

}  // namespace ridgeserve
