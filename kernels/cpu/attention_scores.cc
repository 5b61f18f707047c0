#include "kernels/cpu/attention_scores.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/dtype.h"

namespace ridgeserve::cpu {
namespace {

// probs[j] = softmax_j(q · keys[j] * scale) for j < n (the header's arithmetic); key j starts
// at keys + j * stride, `dim` wide.
void Probabilities(const float* q, const float* keys, size_t stride, int32_t n, int32_t dim,
                   float scale, float* probs) {
  float max_logit = -INFINITY;
  for (int32_t j = 0; j < n; ++j) {
    const float* k = keys + j * stride;
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
  for (int32_t j = 0; j < n; ++j) {
    probs[j] = std::exp(probs[j] - max_logit);
    sum += probs[j];
  }
  for (int32_t j = 0; j < n; ++j) probs[j] /= sum;
}

}  // namespace

void AttentionScores(const KvLayerView& cache, std::span<const int32_t> blocks, const float* q,
                     int32_t num_heads, std::span<const int32_t> positions,
                     std::span<const float> weights, float scale, int32_t count, float* scores,
                     int num_threads) {
  const int32_t kv_heads = cache.num_kv_heads, d = cache.head_dim;
  const int32_t group = num_heads / kv_heads;
  const int32_t rows = static_cast<int32_t>(positions.size());
  assert(weights.size() == positions.size());
  std::fill(scores, scores + static_cast<size_t>(kv_heads) * count, 0.0f);
  if (rows == 0) return;
  // Every place a row sees, widened to f32: [places, kv_heads * head_dim].
  const int32_t places = *std::max_element(positions.begin(), positions.end()) + 1;
  const size_t width = static_cast<size_t>(kv_heads) * d;
  const size_t element = ElementBytes(cache.dtype);
  std::vector<float> keys(places * width);
  for (int32_t p = 0; p < places; p += cache.block_size) {
    const int32_t n = std::min(cache.block_size, places - p);
    const size_t slot = PagedSlot(blocks, cache.block_size, p);
    const absl::Status widened =
        DequantizeRow(cache.dtype, cache.k + slot * width * element, n * width, &keys[p * width]);
    assert(widened.ok());  // a KV cache is F32, F16 or BF16
    (void)widened;
  }
  // (row, query head) pairs over the threads, each thread's maxima apart, then the maxima of
  // those (a max does not depend on the order).
  const int threads = std::max(1, std::min(num_threads, rows * num_heads));
  std::vector<std::vector<float>> partial(threads);
#pragma omp parallel num_threads(threads)
  {
    std::vector<float>& best = partial[omp_get_thread_num()];
    best.assign(static_cast<size_t>(kv_heads) * count, 0.0f);
    std::vector<float> probs(places);
#pragma omp for schedule(dynamic, 1)
    for (int32_t item = 0; item < rows * num_heads; ++item) {
      const int32_t r = item / num_heads, h = item % num_heads, g = h / group;
      const int32_t seen = positions[r] + 1;
      Probabilities(q + static_cast<size_t>(item) * d, keys.data() + g * d, width, seen, d, scale,
                    probs.data());
      float* out = best.data() + static_cast<size_t>(g) * count;
      for (int32_t j = 0; j < std::min(seen, count); ++j) {
        out[j] = std::max(out[j], probs[j] * weights[r]);
      }
    }
  }
  for (const std::vector<float>& best : partial) {
    for (size_t i = 0; i < best.size(); ++i) scores[i] = std::max(scores[i], best[i]);
  }
}

}  // namespace ridgeserve::cpu
