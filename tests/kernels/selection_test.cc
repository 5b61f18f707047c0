// SpecPC's and SpecKV's selection ops on the CPU: AttentionScores against its definition in
// double on a paged cache with NaN wherever the sequence does not own a slot, and CompactKv
// moving each KV head's kept entries, bits unchanged, and nothing else.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/selection_problem.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::KeptPlaces;
using ::ridgeserve::testing::ScoresCase;
using ::ridgeserve::testing::SelectionProblem;
using ::ridgeserve::testing::SelectionShape;

std::vector<float> Weights(size_t rows) {
  std::vector<float> w = ::ridgeserve::testing::RandomFloats(rows, 99, 0.0f, 1.0f);
  w.back() = 1.0f;
  if (rows > 2) w[1] = 0.0f;  // a row that weighs nothing
  return w;
}

std::vector<float> Scores(Backend& backend, SelectionProblem& problem, const ScoresCase& c,
                          const std::vector<float>& q, const std::vector<float>& weights) {
  std::vector<float> scores(static_cast<size_t>(c.shape.num_kv_heads) * c.count, -1.0f);
  backend.AttentionScores(problem.View(problem.k.data(), problem.v.data()), problem.blocks,
                          q.data(), c.shape.num_heads, c.positions, weights,
                          1.0f / std::sqrt(static_cast<float>(c.shape.head_dim)), c.count,
                          scores.data());
  return scores;
}

// Rows near the end of the sequence (SpecPC's window and lookahead), some past `count` (keys
// they see but that are not scored), and one early row that sees few keys.
const ScoresCase kCases[] = {
    // SmolLM2's heads; a row at position 3.
    {{9, 3, 64, 16, 300, DType::kF32}, {3, 250, 270, 285, 299}, 280},
    // head_dim 40 (not a multiple of 8: the dot product's tail), odd block size, f16 cache.
    {{6, 2, 40, 5, 150, DType::kF16}, {100, 120, 149}, 130},
    // Group 8 (Llama-3-70B-like) on a bf16 cache.
    {{8, 1, 128, 16, 260, DType::kBF16}, {200, 230, 259}, 259},
    // Multi-head, head_dim 24, a peaked softmax (scores of tens).
    {{4, 4, 24, 16, 90, DType::kF32, 6.0f}, {60, 70, 89}, 80},
};

TEST(CpuAttentionScoresTest, MatchesTheDefinitionInDouble) {
  auto backend = CreateCpuBackend(2);
  uint32_t seed = 1;
  double worst_overall = 0;
  for (const ScoresCase& c : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << c.shape.num_heads << "/" << c.shape.num_kv_heads << " dim "
                 << c.shape.head_dim << " " << KvCacheDTypeName(c.shape.dtype));
    SelectionProblem problem(c.shape, seed++);
    const std::vector<float> q = problem.Queries(c.positions.size(), seed++);
    const std::vector<float> weights = Weights(c.positions.size());
    const std::vector<float> got = Scores(*backend, problem, c, q, weights);
    const std::vector<double> want = problem.ReferenceScores(
        q, c.positions, weights, 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim)), c.count);
    // Relative to the score: float dot products of head_dim terms and a float softmax.
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(want[i], 1e-6));
    }
    worst_overall = std::max(worst_overall, worst);
    EXPECT_LE(worst, 2e-5);
  }
  std::printf("AttentionScores vs double: max relative error %.3g\n", worst_overall);
}

TEST(CpuAttentionScoresTest, KeysNoRowSeesScoreZero) {
  auto backend = CreateCpuBackend(2);
  // count past the sequence's blocks: keys no row sees are not read.
  const ScoresCase c = {{6, 2, 32, 16, 40, DType::kF16}, {5, 9}, 60};
  SelectionProblem problem(c.shape, 7);
  const std::vector<float> q = problem.Queries(2, 8);
  const std::vector<float> got = Scores(*backend, problem, c, q, {1.0f, 0.5f});
  for (int32_t g = 0; g < 2; ++g) {
    for (int32_t j = 0; j < c.count; ++j) {
      const float s = got[g * c.count + j];
      if (j <= 9) {
        EXPECT_GT(s, 0.0f) << "head " << g << " key " << j;
      } else {
        EXPECT_EQ(s, 0.0f) << "head " << g << " key " << j;
      }
    }
  }
}

TEST(CpuAttentionScoresTest, ThreadCountDoesNotChangeABit) {
  auto one = CreateCpuBackend(1), two = CreateCpuBackend(2);
  const ScoresCase& c = kCases[0];
  SelectionProblem problem(c.shape, 21);
  const std::vector<float> q = problem.Queries(c.positions.size(), 22);
  const std::vector<float> weights = Weights(c.positions.size());
  const std::vector<float> a = Scores(*one, problem, c, q, weights);
  const std::vector<float> b = Scores(*two, problem, c, q, weights);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0);
}

// For each KV head its own kept places, most moving down onto places other kept entries are
// read from (copied in place from the last to the first, or all at once, entries would be
// overwritten before they are read).
TEST(CpuCompactKvTest, MovesEachHeadsKeptEntriesBitsUnchangedAndNothingElse) {
  auto backend = CreateCpuBackend(2);
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(KvCacheDTypeName(dtype));
    const SelectionShape shape = {6, 3, 40, 16, 150, dtype};
    SelectionProblem problem(shape, 31);
    const int32_t n = 70;
    const std::vector<int32_t> from = KeptPlaces(shape.num_kv_heads, shape.places, n, 32);
    const std::vector<uint8_t> k0 = problem.k, v0 = problem.v;
    backend->CompactKv(problem.View(problem.k.data(), problem.v.data()), problem.blocks, from, n);
    const size_t head_bytes = ElementBytes(dtype) * shape.head_dim;
    const size_t slot_bytes = head_bytes * shape.num_kv_heads;
    const size_t slots = problem.k.size() / slot_bytes;
    std::vector<int32_t> place_of(slots, -1);
    for (int32_t p = 0; p < shape.places; ++p) place_of[problem.Slot(p)] = p;
    int moved = 0;
    for (const auto& [now, before] : {std::pair{&problem.k, &k0}, std::pair{&problem.v, &v0}}) {
      for (size_t slot = 0; slot < slots; ++slot) {
        for (int32_t g = 0; g < shape.num_kv_heads; ++g) {
          const int32_t place = place_of[slot];
          // What the slot's head must hold: the kept entry for places < n, else what it held.
          size_t source = slot;
          if (place >= 0 && place < n) source = problem.Slot(from[g * n + place]);
          moved += source != slot;
          EXPECT_EQ(std::memcmp(now->data() + slot * slot_bytes + g * head_bytes,
                                before->data() + source * slot_bytes + g * head_bytes, head_bytes),
                    0)
              << "slot " << slot << " (place " << place << ") head " << g;
        }
      }
    }
    EXPECT_GT(moved, 2 * shape.num_kv_heads * n / 2);  // most entries moved
  }
}

}  // namespace
}  // namespace ridgeserve
