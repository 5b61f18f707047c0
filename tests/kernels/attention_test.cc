// CPU paged attention against a naive dense causal attention in double, and bitwise batch
// invariance: a row's output does not depend on the other rows in the call, on how a prefill
// is chunked, on the thread count, or on how the cache is paged.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::FirstBitDifference;
using ::ridgeserve::testing::RandomFloats;

struct Problem {
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  std::vector<int32_t> seq_lens;
  float q_range = 1.0f;  // q uniform in [-q_range, q_range): larger means peakier softmax
  // Bound on |out - reference|. Float scores (head_dim-term FMA chains), a 2-ulp exp and float
  // sums of up to a few hundred terms give ~1e-7 (V is O(1)); score errors grow with |score|.
  double tolerance = 5e-7;
};

struct Row {
  int32_t seq;
  int32_t pos;
};

// Dense per-sequence Q, K, V, and the same K, V written through StoreKv into a paged cache
// whose blocks are handed out in a shuffled order. Slots no sequence owns, and the tail of
// each sequence's last block, hold NaN: reading one would poison the result.
//
// The cache holds `cache_dtype` (F32, F16 or BF16). With `round_to` F16 or BF16 the dense K
// and V are first rounded to that type by the test's own reference rounding (the reference
// attention then sees exactly what such a cache holds).
class PagedProblem {
 public:
  PagedProblem(Backend& backend, const Problem& p, uint32_t seed, DType cache_dtype = DType::kF32,
               DType round_to = DType::kF32)
      : p_(p) {
    const int32_t kv_width = p.num_kv_heads * p.head_dim;
    std::mt19937 rng(seed);
    int32_t total_blocks = 0;
    offsets_ = {0};
    for (int32_t len : p.seq_lens) {
      const int32_t blocks = (len + p.block_size - 1) / p.block_size;
      total_blocks += blocks;
      offsets_.push_back(offsets_.back() + blocks + 2);  // spare entries: never read
    }
    const int32_t num_blocks = total_blocks + 3;
    std::vector<int32_t> block_ids(num_blocks);
    std::iota(block_ids.begin(), block_ids.end(), 0);
    std::shuffle(block_ids.begin(), block_ids.end(), rng);
    block_tables_.assign(offsets_.back(), -1);
    const size_t cache_elements = size_t(num_blocks) * p.block_size * kv_width;
    const size_t element_bytes = ElementBytes(cache_dtype);
    std::vector<uint8_t> nan(element_bytes);
    const float nan_f32 = std::numeric_limits<float>::quiet_NaN();
    ConvertFromFloat(&nan_f32, 1, cache_dtype, nan.data());
    for (std::vector<uint8_t>* cache : {&k_cache_, &v_cache_}) {
      cache->resize(cache_elements * element_bytes);
      for (size_t e = 0; e < cache_elements; ++e) {
        std::copy(nan.begin(), nan.end(), cache->begin() + e * element_bytes);
      }
    }
    view_ = {k_cache_.data(), v_cache_.data(), cache_dtype, num_blocks,
             p.block_size,    p.num_kv_heads,  p.head_dim};
    auto round = [round_to](std::vector<float> values) {
      if (round_to == DType::kF16) {
        for (float& x : values) x = ::ridgeserve::testing::RoundToHalfReference(x);
      } else if (round_to == DType::kBF16) {
        for (float& x : values) x = ::ridgeserve::testing::RoundToBFloat16Reference(x);
      }
      return values;
    };

    int32_t next_block = 0;
    for (size_t s = 0; s < p.seq_lens.size(); ++s) {
      const int32_t len = p.seq_lens[s];
      for (int32_t b = 0; b * p.block_size < len; ++b) {
        block_tables_[offsets_[s] + b] = block_ids[next_block++];
      }
      q_.push_back(RandomFloats(size_t(len) * p.num_heads * p.head_dim, seed * 7 + 3 * s + 1,
                                -p.q_range, p.q_range));
      k_.push_back(round(RandomFloats(size_t(len) * kv_width, seed * 7 + 3 * s + 2)));
      v_.push_back(round(RandomFloats(size_t(len) * kv_width, seed * 7 + 3 * s + 3)));
      std::vector<int32_t> slots(len);
      for (int32_t pos = 0; pos < len; ++pos) {
        slots[pos] =
            block_tables_[offsets_[s] + pos / p.block_size] * p.block_size + pos % p.block_size;
      }
      backend.StoreKv(view_, k_.back().data(), v_.back().data(), kv_width, len, slots.data());
    }
  }

  int32_t out_width() const { return p_.num_heads * p_.head_dim; }
  float scale() const { return 1.0f / std::sqrt(float(p_.head_dim)); }

  // Runs Backend::Attention for `rows`; q rows sit in a fused-QKV-like buffer (ld wider than
  // the q heads). Returns [rows.size(), out_width()].
  std::vector<float> Run(Backend& backend, const std::vector<Row>& rows) const {
    const int32_t n = static_cast<int32_t>(rows.size());
    const int32_t width = out_width();
    const int32_t ld = width + 2 * p_.num_kv_heads * p_.head_dim;
    std::vector<float> q(size_t(n) * ld, 0.0f);
    std::vector<int32_t> positions(n), seqs(n);
    for (int32_t i = 0; i < n; ++i) {
      positions[i] = rows[i].pos;
      seqs[i] = rows[i].seq;
      std::copy_n(&q_[rows[i].seq][size_t(rows[i].pos) * width], width, &q[size_t(i) * ld]);
    }
    AttentionRows ar;
    ar.num_rows = n;
    ar.positions = positions.data();
    ar.seq = seqs.data();
    ar.block_table_offsets = offsets_.data();
    ar.block_tables = block_tables_.data();
    std::vector<float> out(size_t(n) * width);
    backend.Attention(q.data(), ld, p_.num_heads, view_, ar, scale(), out.data());
    return out;
  }

  // softmax(q_h . K^T * scale) V over positions 0..pos, in double, from the dense arrays.
  std::vector<double> Reference(const Row& row) const {
    const int32_t hd = p_.head_dim, group = p_.num_heads / p_.num_kv_heads;
    const int32_t kv_width = p_.num_kv_heads * hd;
    const std::vector<float>& k = k_[row.seq];
    const std::vector<float>& v = v_[row.seq];
    std::vector<double> out(out_width(), 0.0), scores(row.pos + 1);
    for (int32_t h = 0; h < p_.num_heads; ++h) {
      const float* q = &q_[row.seq][size_t(row.pos) * out_width() + h * hd];
      const int32_t kvh = h / group;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int32_t j = 0; j <= row.pos; ++j) {
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d)
          dot += double{q[d]} * k[size_t(j) * kv_width + kvh * hd + d];
        scores[j] = dot * scale();
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0.0;
      for (int32_t j = 0; j <= row.pos; ++j) sum += scores[j] = std::exp(scores[j] - max_score);
      for (int32_t j = 0; j <= row.pos; ++j) {
        for (int32_t d = 0; d < hd; ++d) {
          out[h * hd + d] += scores[j] / sum * v[size_t(j) * kv_width + kvh * hd + d];
        }
      }
    }
    return out;
  }

  // Every position of every sequence, shuffled.
  std::vector<Row> AllRows(uint32_t seed) const {
    std::vector<Row> rows;
    for (size_t s = 0; s < p_.seq_lens.size(); ++s) {
      for (int32_t pos = 0; pos < p_.seq_lens[s]; ++pos) rows.push_back({int32_t(s), pos});
    }
    std::shuffle(rows.begin(), rows.end(), std::mt19937(seed));
    return rows;
  }

 private:
  Problem p_;
  std::vector<int32_t> offsets_;  // [num_seqs + 1] into block_tables_
  std::vector<int32_t> block_tables_;
  std::vector<uint8_t> k_cache_, v_cache_;
  KvLayerView view_;
  std::vector<std::vector<float>> q_, k_, v_;
};

// Largest |out - reference| over the rows; V is uniform in [-1, 1), so this is relative to
// the output scale.
double MaxError(const PagedProblem& problem, const std::vector<Row>& rows,
                const std::vector<float>& out) {
  double worst = 0.0;
  const int32_t width = problem.out_width();
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<double> ref = problem.Reference(rows[i]);
    for (int32_t c = 0; c < width; ++c) {
      const double err = std::abs(out[i * width + c] - ref[c]);
      worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(worst, err);
    }
  }
  return worst;
}

TEST(CpuAttentionTest, MatchesDenseCausalReference) {
  auto backend = CreateCpuBackend(2);
  const Problem problems[] = {
      // SmolLM2: 9 q heads over 3 kv heads; several sequences, one of length 1.
      {9, 3, 64, 16, {300, 77, 1}},
      // Multi-head (group 1), large pages.
      {4, 4, 32, 64, {130, 65}},
      // Group 7 (Qwen2.5-7B-like), head_dim 128.
      {14, 2, 128, 32, {140}},
      // Odd block size, head_dim 40 (not a multiple of the 16-lane vector), group 4.
      {4, 1, 40, 5, {150, 64}},
      // Tiny head_dim below one vector, one token per block.
      {2, 2, 8, 1, {70}},
      // Group 8 (Llama-3-70B-like), pages bigger than the context.
      {16, 2, 64, 256, {100}},
      // Multi-query: 33 q heads on one kv head, head_dim 16.
      {33, 1, 16, 16, {90}},
      // Peaked softmax: scores of tens, the running max matters.
      {9, 3, 64, 16, {200}, 12.0f, 6e-6},
  };
  uint32_t seed = 1;
  for (const Problem& p : problems) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << p.num_heads << "/" << p.num_kv_heads << " head_dim " << p.head_dim
                 << " block " << p.block_size << " q_range " << p.q_range);
    PagedProblem problem(*backend, p, seed++);
    const std::vector<Row> rows = problem.AllRows(seed);
    const std::vector<float> out = problem.Run(*backend, rows);
    EXPECT_LE(MaxError(problem, rows, out), p.tolerance);
  }
}

TEST(CpuAttentionTest, DecodeRowsAtChunkAndBlockBoundaries) {
  auto backend = CreateCpuBackend(2);
  PagedProblem problem(*backend, {9, 3, 64, 16, {400, 258}}, 11);
  std::vector<Row> rows;
  for (int32_t pos : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257}) {
    rows.push_back({1, pos});
  }
  rows.push_back({0, 399});
  for (const Row& row : rows) {
    const std::vector<float> out = problem.Run(*backend, {row});
    EXPECT_LE(MaxError(problem, {row}, out), 5e-7) << "position " << row.pos;
  }
}

TEST(CpuAttentionTest, PositionZeroReturnsItsValueExactly) {
  auto backend = CreateCpuBackend(1);
  const Problem p{9, 3, 64, 16, {5}};
  PagedProblem problem(*backend, p, 12);
  // With one visible position the softmax weight is exactly 1.
  const std::vector<float> out = problem.Run(*backend, {{0, 0}});
  const std::vector<double> ref = problem.Reference({0, 0});
  for (int32_t c = 0; c < problem.out_width(); ++c) EXPECT_EQ(out[c], float(ref[c])) << c;
}

// Compares rows computed in pieces with the same rows from one call, bitwise.
void ExpectSameRows(const std::vector<Row>& all, const std::vector<float>& all_out,
                    const std::vector<Row>& part, const std::vector<float>& part_out, int32_t width,
                    const char* what) {
  for (size_t i = 0; i < part.size(); ++i) {
    const auto it = std::find_if(all.begin(), all.end(), [&](const Row& r) {
      return r.seq == part[i].seq && r.pos == part[i].pos;
    });
    ASSERT_NE(it, all.end());
    const size_t j = it - all.begin();
    ASSERT_EQ(FirstBitDifference(&part_out[i * width], &all_out[j * width], width), -1)
        << what << ": seq " << part[i].seq << " position " << part[i].pos;
  }
}

TEST(CpuAttentionTest, RowsAreBitwiseBatchInvariant) {
  auto two = CreateCpuBackend(2);
  auto one = CreateCpuBackend(1);
  const Problem p{9, 3, 64, 16, {230, 150, 70}};
  PagedProblem problem(*two, p, 13);
  const int32_t width = problem.out_width();
  const std::vector<Row> all = problem.AllRows(14);
  const std::vector<float> all_out = problem.Run(*two, all);

  // Each row alone (a subset: every 7th), on one thread.
  std::vector<Row> alone_rows;
  std::vector<float> alone_out;
  for (size_t i = 0; i < all.size(); i += 7) {
    const std::vector<float> out = problem.Run(*one, {all[i]});
    alone_rows.push_back(all[i]);
    alone_out.insert(alone_out.end(), out.begin(), out.end());
  }
  ExpectSameRows(all, all_out, alone_rows, alone_out, width, "alone");

  // Chunked prefill: sequence 0 in chunks of 37 positions, each call also carrying one
  // "decode" row of sequences 1 and 2, like a mixed engine step.
  for (int32_t begin = 0; begin < p.seq_lens[0]; begin += 37) {
    std::vector<Row> step;
    for (int32_t pos = begin; pos < std::min(begin + 37, p.seq_lens[0]); ++pos)
      step.push_back({0, pos});
    step.push_back({1, std::min(begin, p.seq_lens[1] - 1)});
    step.push_back({2, std::min(begin / 3, p.seq_lens[2] - 1)});
    ExpectSameRows(all, all_out, step, problem.Run(*two, step), width, "chunked");
  }

  // The whole batch in the opposite order on one thread.
  std::vector<Row> reversed(all.rbegin(), all.rend());
  ExpectSameRows(all, all_out, reversed, problem.Run(*one, reversed), width, "reversed");
}

// Softmax steps follow positions, not pages: the same K/V paged differently gives the same
// bits (so a prefix-cache hit or another block size cannot change a result).
TEST(CpuAttentionTest, ResultDoesNotDependOnPaging) {
  auto backend = CreateCpuBackend(2);
  std::vector<float> reference;
  std::vector<Row> rows;
  for (int32_t block_size : {16, 1, 7, 64, 512}) {
    PagedProblem problem(*backend, {9, 3, 64, block_size, {300}}, /*seed=*/15);
    if (rows.empty()) rows = problem.AllRows(16);
    const std::vector<float> out = problem.Run(*backend, rows);
    if (reference.empty()) {
      reference = out;
      continue;
    }
    EXPECT_EQ(FirstBitDifference(out.data(), reference.data(), out.size()), -1)
        << "block size " << block_size;
  }
}

// An F16 or BF16 cache: StoreKv rounds to nearest even and Attention widens exactly, so the
// result is bitwise that of an F32 cache holding K and V rounded by the test's own reference
// (whose attention the dense reference also checks), for prefill and decode rows alike.
TEST(CpuAttentionTest, HalfCachesEqualF32CacheOfRoundedValues) {
  auto backend = CreateCpuBackend(2);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (const Problem& p : {Problem{9, 3, 64, 16, {300, 1}}, Problem{4, 1, 40, 5, {150}}}) {
      SCOPED_TRACE(::testing::Message()
                   << (dtype == DType::kF16 ? "f16" : "bf16") << " head_dim " << p.head_dim);
      PagedProblem half(*backend, p, 21, dtype);
      PagedProblem rounded(*backend, p, 21, DType::kF32, dtype);
      // Prefill (tiles of many rows widen V once per chunk) and decode (a row of each sequence
      // at its last position reads V in place).
      std::vector<Row> decode;
      for (size_t s = 0; s < p.seq_lens.size(); ++s) {
        decode.push_back({int32_t(s), p.seq_lens[s] - 1});
      }
      for (const std::vector<Row>& rows : {half.AllRows(22), decode}) {
        const std::vector<float> out = half.Run(*backend, rows);
        const std::vector<float> want = rounded.Run(*backend, rows);
        EXPECT_EQ(FirstBitDifference(out.data(), want.data(), out.size()), -1);
        EXPECT_LE(MaxError(rounded, rows, want), p.tolerance);
      }
    }
  }
}

}  // namespace
}  // namespace ridgeserve
