// A random input for SpecPC's and SpecKV's selection ops (Backend::AttentionScores, CompactKv),
// shared by the CPU's tests and the CUDA-against-CPU tests, and AttentionScores' definition in
// double, written from the interface's comment.
#ifndef RIDGESERVE_TESTS_KERNELS_SELECTION_PROBLEM_H_
#define RIDGESERVE_TESTS_KERNELS_SELECTION_PROBLEM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve::testing {

struct SelectionShape {
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  int32_t places;  // the sequence's cached places
  DType dtype;
  float q_range = 1.0f;  // q uniform in [-q_range, q_range): larger means peakier softmax
};

// An AttentionScores call on a SelectionProblem of `shape`: rows at `positions`, keys j < count
// scored.
struct ScoresCase {
  SelectionShape shape;
  std::vector<int32_t> positions;
  int32_t count;
};

// One sequence's `places` K/V entries in a paged cache of `dtype` whose blocks are shuffled, with
// two spare blocks; every slot the sequence does not own holds NaN. k_values / v_values: what
// the sequence's entries hold, widened to f32 ([places, kv_heads * head_dim]).
struct SelectionProblem {
  SelectionProblem(const SelectionShape& s, uint32_t seed) : shape(s) {
    std::mt19937 rng(seed);
    const int32_t width = s.num_kv_heads * s.head_dim;
    const int32_t used = (s.places + s.block_size - 1) / s.block_size;
    num_blocks = used + 2;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    blocks.assign(ids.begin(), ids.begin() + used);
    const size_t slots = static_cast<size_t>(num_blocks) * s.block_size;
    const size_t element = ElementBytes(s.dtype);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> nans(slots * width, nan);
    for (std::vector<uint8_t>* cache : {&k, &v}) {
      cache->resize(slots * width * element);
      ConvertFromFloat(nans.data(), static_cast<int64_t>(nans.size()), s.dtype, cache->data());
    }
    const std::vector<float> kf = RandomFloats(static_cast<size_t>(s.places) * width, seed + 1);
    const std::vector<float> vf = RandomFloats(static_cast<size_t>(s.places) * width, seed + 2);
    k_values.resize(kf.size());
    v_values.resize(vf.size());
    for (int32_t p = 0; p < s.places; ++p) {
      const size_t at = Slot(p) * width * element;
      ConvertFromFloat(&kf[size_t(p) * width], width, s.dtype, &k[at]);
      ConvertFromFloat(&vf[size_t(p) * width], width, s.dtype, &v[at]);
      (void)DequantizeRow(s.dtype, &k[at], width, &k_values[size_t(p) * width]);
      (void)DequantizeRow(s.dtype, &v[at], width, &v_values[size_t(p) * width]);
    }
  }

  size_t Slot(int32_t place) const { return PagedSlot(blocks, shape.block_size, place); }
  // The cache's view with K and V at `k_data` / `v_data` (host or device copies of k and v).
  KvLayerView View(uint8_t* k_data, uint8_t* v_data) const {
    return {k_data,        v_data, shape.dtype, num_blocks, shape.block_size, shape.num_kv_heads,
            shape.head_dim};
  }
  // Queries for `positions`, [rows, num_heads * head_dim].
  std::vector<float> Queries(size_t rows, uint32_t seed) const {
    return RandomFloats(rows * shape.num_heads * shape.head_dim, seed, -shape.q_range,
                        shape.q_range);
  }

  // Backend::AttentionScores' definition in double on k_values.
  std::vector<double> ReferenceScores(const std::vector<float>& q,
                                      const std::vector<int32_t>& positions,
                                      const std::vector<float>& weights, float scale,
                                      int32_t count) const {
    const int32_t d = shape.head_dim, width = shape.num_kv_heads * d;
    const int32_t group = shape.num_heads / shape.num_kv_heads;
    std::vector<double> scores(static_cast<size_t>(shape.num_kv_heads) * count, 0.0);
    for (size_t r = 0; r < positions.size(); ++r) {
      for (int32_t h = 0; h < shape.num_heads; ++h) {
        const int32_t g = h / group;
        std::vector<double> s(positions[r] + 1);
        for (int32_t j = 0; j <= positions[r]; ++j) {
          double dot = 0;
          for (int32_t e = 0; e < d; ++e) {
            dot += double{q[(r * shape.num_heads + h) * d + e]} *
                   k_values[size_t(j) * width + g * d + e];
          }
          s[j] = dot * scale;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double l = 0;
        for (double x : s) l += std::exp(x - m);
        for (int32_t j = 0; j < std::min(positions[r] + 1, count); ++j) {
          double& out = scores[size_t(g) * count + j];
          out = std::max(out, weights[r] * std::exp(s[j] - m) / l);
        }
      }
    }
    return scores;
  }

  SelectionShape shape;
  int32_t num_blocks = 0;
  std::vector<int32_t> blocks;  // the sequence's table
  std::vector<uint8_t> k, v;    // the whole cache, as stored
  std::vector<float> k_values, v_values;
};

// Kept places for CompactKv: for each KV head, n sorted distinct places of [0, places), drawn
// from `seed`, so that some are already in place and most move down; [kv_heads, n].
inline std::vector<int32_t> KeptPlaces(int32_t kv_heads, int32_t places, int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> from;
  for (int32_t g = 0; g < kv_heads; ++g) {
    std::vector<int32_t> all(places);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(n);
    std::sort(all.begin(), all.end());
    from.insert(from.end(), all.begin(), all.end());
  }
  return from;
}

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_KERNELS_SELECTION_PROBLEM_H_
