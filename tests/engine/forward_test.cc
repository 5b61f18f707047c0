// Batch invariance of the whole forward pass on the default model: a sequence's logits are
// bitwise the same alone, split into prefill chunks, and batched with other sequences (some
// prefilling, some decoding). And the contract of filled rows (ForwardBatch::fill_split) with
// a fill that is not RidgeFill's: rows it sends back to exact run as exact rows. And the model
// on bf16 activations (the CUDA backend's Backend::ActivationDType), on the CPU.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv/paged_kv_cache.h"
#include "engine/tools/sequence_runner.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/sample.h"
#include "tests/engine/decode_steps.h"
#include "tests/engine/default_model_fixture.h"
#include "tests/engine/forwarding_backend.h"

namespace ridgeserve {
namespace {

class ForwardTest : public DefaultModelTest {
 protected:
  static std::vector<float> AloneAllLogits(const std::vector<int32_t>& tokens, int chunk) {
    SequenceRunner runner(*model_->llama, static_cast<int32_t>(tokens.size()));
    std::vector<float> logits;
    EXPECT_TRUE(runner.Append(tokens, chunk, /*all_logits=*/true, logits).ok());
    return logits;
  }
};

TEST_F(ForwardTest, ChunkedPrefillIsBitwiseIdentical) {
  const std::vector<int32_t> tokens = RandomTokens(150, 1);
  const std::vector<float> whole = AloneAllLogits(tokens, 150);
  for (int chunk : {1, 7, 64}) {
    EXPECT_EQ(AloneAllLogits(tokens, chunk), whole) << "chunk " << chunk;
  }
}

TEST_F(ForwardTest, BatchedSequencesMatchEachAlone) {
  const int32_t vocab = model_->config.vocab_size;
  const std::vector<int32_t> a = RandomTokens(90, 2);
  const std::vector<int32_t> b = RandomTokens(40, 3);
  const std::vector<float> a_alone = AloneAllLogits(a, 90);
  const std::vector<float> b_alone = AloneAllLogits(b, 40);

  const ModelConfig& c = model_->config;
  absl::StatusOr<PagedKvCache> created = PagedKvCache::Create(
      *backend_, KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, 16, 32});
  ASSERT_TRUE(created.ok()) << created.status();
  PagedKvCache& cache = *created;
  BlockTable ta, tb;
  ASSERT_TRUE(ta.Reserve(cache.pool(), 90, 16).ok());
  ASSERT_TRUE(tb.Reserve(cache.pool(), 40, 16).ok());
  std::vector<float> logits;

  // Step 1: a's first 60 tokens and all of b's 39 first tokens together.
  ForwardBatch step1;
  step1.AddSequence(ta, 16, std::span(a).first(60), 0, true);
  step1.AddSequence(tb, 16, std::span(b).first(39), 0, true);
  ASSERT_TRUE(model_->llama->Forward(step1, cache, logits).ok());
  ASSERT_EQ(logits.size(), 2u * vocab);
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + vocab, a_alone.begin() + 59 * vocab));
  EXPECT_TRUE(std::equal(logits.begin() + vocab, logits.end(), b_alone.begin() + 38 * vocab));

  // Step 2: b decodes one token while a prefills the rest.
  ForwardBatch step2;
  step2.AddSequence(tb, 16, std::span(b).subspan(39, 1), 39, true);
  step2.AddSequence(ta, 16, std::span(a).subspan(60), 60, true);
  ASSERT_TRUE(model_->llama->Forward(step2, cache, logits).ok());
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + vocab, b_alone.begin() + 39 * vocab));
  EXPECT_TRUE(std::equal(logits.begin() + vocab, logits.end(), a_alone.begin() + 89 * vocab));
}

// The logits of `tokens` (all rows of one prefill, then the last row of each one-token append
// of `more`) with the runner's RoPE positions set to `rope` (SequenceRunner::SetRopePositions).
std::vector<float> RunWithRope(LlamaModel& model, const std::vector<int32_t>& tokens,
                               const std::vector<int32_t>& more, std::vector<int32_t> rope) {
  SequenceRunner runner(model, static_cast<int32_t>(tokens.size() + more.size()));
  runner.SetRopePositions(std::move(rope));
  std::vector<float> all, logits;
  EXPECT_TRUE(runner.Append(tokens, 16, /*all_logits=*/true, all).ok());
  for (int32_t t : more) {
    EXPECT_TRUE(runner.Append(std::span(&t, 1), 1, false, logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// SpecPC with original positions runs tokens at RoPE positions other than their cache places.
// RoPE sees only position differences, so shifting every position (the prefill's and the
// appends' after it) leaves the logits equal up to the rounding of larger angles, while a gap
// in the positions changes them.
TEST_F(ForwardTest, RopePositionsShiftTheAttentionAsRelativePositions) {
  const std::vector<int32_t> tokens = RandomTokens(40, 5);
  const std::vector<int32_t> more = RandomTokens(3, 6);
  std::vector<int32_t> shifted(tokens.size()), gap(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    shifted[i] = static_cast<int32_t>(i) + 700;
    gap[i] = static_cast<int32_t>(i < 20 ? i : i + 500);
  }
  const std::vector<float> plain = RunWithRope(*model_->llama, tokens, more, {});
  const float shift_diff = MaxAbsDiff(plain, RunWithRope(*model_->llama, tokens, more, shifted));
  const float gap_diff = MaxAbsDiff(plain, RunWithRope(*model_->llama, tokens, more, gap));
  EXPECT_LT(shift_diff, 1e-3f);  // measured 7.5e-5
  EXPECT_GT(gap_diff, 1.0f);     // measured 11.5
  std::printf("max |logit difference|: shifted by 700 %.3g, gap of 500 %.3g\n", shift_diff,
              gap_diff);
}

// A fill without maps: in every layer above the split it writes the K/V that h_s would give as
// that layer's input (an identity "map"), and it sends back to exact every `send_back`-th row
// of each group (0: none).
class IdentityFill : public RowFill {
 public:
  explicit IdentityFill(int32_t send_back) : send_back_(send_back) {}
  absl::Status CheckSplit(const LlamaModel& model, int32_t split_layer) const override {
    if (split_layer + 2 > model.config().num_layers) {
      return absl::InvalidArgumentError("split too high");
    }
    return absl::OkStatus();
  }
  bool SelectsExactRows(int32_t) const override { return send_back_ > 0; }
  void SelectExactRows(LlamaModel&, const FilledRows& rows,
                       std::span<int32_t> exact) const override {
    for (int32_t i = 0; i < rows.count; ++i) exact[i] = (i + 1) % send_back_ == 0;
  }
  void WriteKv(LlamaModel& model, int32_t layer, const FilledRows& rows,
               const KvLayerView& kv) const override {
    model.StoreKvFromInput(layer, rows.h, rows, kv);
  }

 private:
  int32_t send_back_;
};

TEST_F(ForwardTest, FilledRowsSentBackToExactRunAsExactRows) {
  const std::vector<int32_t> tokens = RandomTokens(64, 7);
  const int32_t split = 10;
  // The last row's logits, and how many filled rows the fill sent back to exact; `saved` gets
  // the run's estimated seconds saved (from its ForwardProfile's timings).
  double saved = 0;
  auto last_logits = [&](const RidgeFillRun* fill, int32_t& promoted) {
    SequenceRunner runner(*model_->llama, static_cast<int32_t>(tokens.size()));
    std::vector<float> logits;
    EXPECT_TRUE(runner.Append(tokens, 64, false, logits, fill).ok());
    promoted = runner.promoted_rows();
    saved = runner.estimated_saved_seconds();
    return logits;
  };
  auto filled_logits = [&](const std::vector<uint8_t>& rows, const IdentityFill& fill,
                           int32_t& promoted) {
    const RidgeFillRun run{split, rows, &fill};
    return last_logits(&run, promoted);
  };
  int32_t promoted = -1;
  const std::vector<float> exact = last_logits(nullptr, promoted);
  std::vector<uint8_t> rows(tokens.size(), 0);
  std::fill(rows.begin() + 4, rows.end() - 4, uint8_t{1});  // 56 filled rows
  const IdentityFill keep(0), all_back(1), every_second_back(2);

  const std::vector<float> filled = filled_logits(rows, keep, promoted);
  EXPECT_NE(filled, exact);  // the filled rows' K/V changed the exact last row's attention
  EXPECT_EQ(promoted, 0);
  // 56 rows skipping 19 full layers each, less their K/V writes: the profile's span over layers
  // 0..split and the fills' times give a positive estimate.
  EXPECT_GT(saved, 0.0);
  EXPECT_EQ(filled_logits(rows, all_back, promoted), exact);
  EXPECT_EQ(promoted, 56);

  // Sending back rows mid-forward (permuted after layer `split`) equals planning them exact.
  std::vector<uint8_t> planned = rows;
  for (int32_t i = 0, k = 0; i < static_cast<int32_t>(rows.size()); ++i) {
    if (rows[i] != 0 && ++k % 2 == 0) planned[i] = 0;
  }
  const std::vector<float> sent_back = filled_logits(rows, every_second_back, promoted);
  EXPECT_EQ(promoted, 28);
  int32_t none = -1;
  EXPECT_EQ(sent_back, filled_logits(planned, keep, none));
  EXPECT_NE(sent_back, exact);

  // A fill that refuses the split, and a filled row without a fill, are InvalidArgument.
  SequenceRunner runner(*model_->llama, static_cast<int32_t>(tokens.size()));
  std::vector<float> logits;
  const RidgeFillRun too_high{model_->config.num_layers - 1, rows, &keep};
  EXPECT_EQ(runner.Append(tokens, 64, false, logits, &too_high).code(),
            absl::StatusCode::kInvalidArgument);
  const RidgeFillRun no_fill{split, rows, nullptr};
  EXPECT_EQ(runner.Append(tokens, 64, false, logits, &no_fill).code(),
            absl::StatusCode::kInvalidArgument);
}

// The RidgeFill profile takes its times as marks in the queued work (Backend::MarkTime), so a
// forward pass with filled rows does not wait for the backend inside its layer loop: on a
// backend whose marks, like CUDA's events, do not synchronize, no Synchronize or CopyToHost falls
// between the first mark and the last (before time marks, each fill span synchronized twice a
// layer), and the estimate read after the step comes from those marks.
TEST_F(ForwardTest, AProfiledForwardWithFilledRowsDoesNotWaitInsideTheLayerLoop) {
  class QueueClock final : public testing::ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;
    void Synchronize() override {
      ++waits;
      inner_.Synchronize();
    }
    void CopyToHost(void* dst, const void* src, size_t bytes) override {
      ++waits;
      inner_.CopyToHost(dst, src, bytes);
    }
    void ResetTimeMarks() override { waits_at_mark.clear(); }
    int32_t MarkTime() override {
      waits_at_mark.push_back(waits);
      return static_cast<int32_t>(waits_at_mark.size()) - 1;
    }
    // One millisecond per mark between them: a stand-in for device time.
    double SecondsBetween(int32_t a, int32_t b) override { return 1e-3 * (b - a); }

    int waits = 0;
    std::vector<int> waits_at_mark;
  };
  QueueClock backend(*backend_);
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(RIDGESERVE_DEFAULT_MODEL, backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> tokens = RandomTokens(64, 7);
  std::vector<uint8_t> rows(tokens.size(), 0);
  std::fill(rows.begin() + 4, rows.end() - 4, uint8_t{1});
  const IdentityFill keep(0);
  const int32_t split = 10;
  const RidgeFillRun fill{split, rows, &keep};
  SequenceRunner runner(*(*model)->llama, static_cast<int32_t>(tokens.size()));
  std::vector<float> logits;
  ASSERT_TRUE(runner.Append(tokens, 64, false, logits, &fill).ok());
  // The full span (2 marks) and a span a layer above the split.
  const int32_t layers = (*model)->config.num_layers;
  ASSERT_EQ(backend.waits_at_mark.size(), size_t(2 + 2 * (layers - 1 - split)));
  EXPECT_EQ(backend.waits_at_mark.front(), backend.waits_at_mark.back());
  // What the estimate makes of these marks: marks 0 and 1 bound layers 0..10 of the 64 rows
  // (1 ms over 704 row-layers), and each of the 19 fill spans (marks 2k, 2k + 1) is 1 ms for the
  // 56 filled rows, which skipped 19 full layers each.
  const int32_t above = layers - 1 - split, filled = 56;
  const double per_row = above * (1e-3 / ((split + 1) * 64.0)) - above * 1e-3 / filled;
  EXPECT_NEAR(runner.estimated_saved_seconds(), filled * per_row, 1e-15);
}

// Residual capture in a batch with filled rows (online calibration takes exact requests' rows
// from such batches): the states hold the rows exact from the start, in batch order, and each is
// bitwise what the same sequence gives in a batch of its own; promoted rows are not among them.
TEST_F(ForwardTest, ResidualCaptureWithFilledRowsHoldsTheExactRowsOnly) {
  LlamaModel& llama = *model_->llama;
  const ModelConfig& c = model_->config;
  const int32_t split = 10;
  const std::vector<int32_t> a = RandomTokens(24, 11), b = RandomTokens(32, 12);
  std::vector<uint8_t> b_filled(b.size(), 0);
  std::fill(b_filled.begin() + 4, b_filled.end() - 4, uint8_t{1});  // 24 filled, 8 exact
  const IdentityFill every_second_back(2);
  const std::vector<int32_t> depths = {0, split + 1, 20, c.num_layers};
  // One forward over the sequences given; fill rows of b as b_filled says when `fill_b`.
  auto run = [&](bool with_a, bool with_b, bool fill_b) {
    auto cache = PagedKvCache::Create(
        *backend_,
        KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, 16, 8, llama.kv_cache_dtype()});
    EXPECT_TRUE(cache.ok()) << cache.status();
    BlockTable ta, tb;
    EXPECT_TRUE(ta.Reserve(cache->pool(), 32, 16).ok());
    EXPECT_TRUE(tb.Reserve(cache->pool(), 32, 16).ok());
    ForwardBatch batch;
    if (with_a) batch.AddSequence(ta, 16, a, 0, false);
    if (with_b) {
      const int32_t row0 = batch.num_rows();
      batch.AddSequence(tb, 16, b, 0, true);
      if (fill_b) {
        batch.fill_split.assign(batch.num_rows(), -1);
        batch.row_fill.assign(batch.num_rows(), nullptr);
        for (size_t p = 0; p < b.size(); ++p) {
          if (b_filled[p] == 0) continue;
          batch.fill_split[row0 + p] = split;
          batch.row_fill[row0 + p] = &every_second_back;
        }
      }
    }
    ForwardCapture capture;
    capture.depths = depths;
    std::vector<float> logits;
    EXPECT_TRUE(llama.Forward(batch, *cache, logits, &capture).ok());
    return capture.states;
  };
  const auto both = run(true, true, true);
  const auto a_alone = run(true, false, false);
  const auto b_alone = run(false, true, true);
  for (size_t i = 0; i < depths.size(); ++i) {
    std::vector<float> want = a_alone[i];
    want.insert(want.end(), b_alone[i].begin(), b_alone[i].end());
    EXPECT_EQ(both[i].size(), static_cast<size_t>(24 + 8) * c.hidden) << "depth " << depths[i];
    EXPECT_TRUE(both[i] == want) << "depth " << depths[i];
  }
  // Below the split b's exact rows are those of b run without any fill.
  const auto b_exact = run(false, true, false);
  std::vector<float> want;
  for (size_t p = 0; p < b.size(); ++p) {
    if (b_filled[p] != 0) continue;
    const float* row = &b_exact[1][p * c.hidden];
    want.insert(want.end(), row, row + c.hidden);
  }
  EXPECT_TRUE(b_alone[1] == want);
}

TEST_F(ForwardTest, RejectsTokenOutsideVocabulary) {
  SequenceRunner runner(*model_->llama, 4);
  std::vector<float> logits;
  const int32_t bad[] = {model_->config.vocab_size};
  EXPECT_EQ(runner.Append(bad, 1, false, logits).code(), absl::StatusCode::kInvalidArgument);
}

// After Run the logits stay on the backend: SampleLogits and CopyLogits read the rows it
// computed and name a row or penalty range outside them.
TEST_F(ForwardTest, SampleAndCopyLogitsReadOnlyTheRowsTheRunComputed) {
  const ModelConfig& c = model_->config;
  absl::StatusOr<PagedKvCache> created = PagedKvCache::Create(
      *backend_, KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, 16, 4});
  ASSERT_TRUE(created.ok()) << created.status();
  // Two sequences, so a row mix-up shows: the second row's logits against the same row of
  // AloneAllLogits (one sequence, its own forward pass).
  BlockTable table, other;
  ASSERT_TRUE(table.Reserve(created->pool(), 8, 16).ok());
  ASSERT_TRUE(other.Reserve(created->pool(), 8, 16).ok());
  const std::vector<int32_t> tokens = RandomTokens(8, 5), second = RandomTokens(6, 6);
  const std::vector<float> second_alone = AloneAllLogits(second, 6);
  const std::vector<float> want(second_alone.end() - c.vocab_size, second_alone.end());
  const std::vector<float> first_alone = AloneAllLogits(tokens, 8);
  const std::vector<float> want_0(first_alone.end() - c.vocab_size, first_alone.end());
  ForwardBatch batch;
  batch.AddSequence(table, 16, tokens, 0, true);
  batch.AddSequence(other, 16, second, 0, true);
  LlamaModel& model = *model_->llama;
  ASSERT_TRUE(model.Run(batch, *created).ok());
  std::vector<float> row(c.vocab_size);
  const int32_t row_1[] = {1};
  ASSERT_TRUE(model.CopyLogits(row_1, row.data()).ok());
  EXPECT_TRUE(row == want);
  // Several rows come in the order asked: {0, 1} is one run of consecutive rows, {1, 0} two.
  for (const bool reversed : {false, true}) {
    const int32_t rows[2] = {reversed ? 1 : 0, reversed ? 0 : 1};
    std::vector<float> both(2 * static_cast<size_t>(c.vocab_size));
    ASSERT_TRUE(model.CopyLogits(rows, both.data()).ok());
    EXPECT_TRUE(std::vector<float>(both.begin(), both.begin() + c.vocab_size) ==
                (reversed ? want : want_0))
        << reversed;
    EXPECT_TRUE(std::vector<float>(both.begin() + c.vocab_size, both.end()) ==
                (reversed ? want_0 : want))
        << reversed;
  }
  SampleSpec greedy;
  greedy.temperature = 0.0f;
  greedy.row = 1;
  SampledToken token;
  ASSERT_TRUE(model.SampleLogits(std::span(&greedy, 1), {}, &token).ok());
  EXPECT_EQ(token.token, Argmax(want));
  greedy.row = 0;

  const int32_t past[] = {2};
  const absl::Status copy = model.CopyLogits(past, row.data());
  EXPECT_EQ(copy.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(copy.message().find("logit row 2 of 2"), std::string::npos) << copy;
  SampleSpec wrong_row = greedy;
  wrong_row.row = 2;
  EXPECT_EQ(model.SampleLogits(std::span(&wrong_row, 1), {}, &token).code(),
            absl::StatusCode::kOutOfRange);
  SampleSpec wrong_ids = greedy;
  wrong_ids.repetition_penalty = 1.2f;
  wrong_ids.penalty_end = 3;
  const int32_t two_ids[] = {4, 5};
  const absl::Status ids = model.SampleLogits(std::span(&wrong_ids, 1), two_ids, &token);
  EXPECT_EQ(ids.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(ids.message().find("penalty ids [0, 3) of 2"), std::string::npos) << ids;
  const SampleSpec twice[] = {greedy, greedy};
  SampledToken two[2];
  EXPECT_EQ(model.SampleLogits(twice, {}, two).code(), absl::StatusCode::kInvalidArgument);
}

// Captured queries come in the order of query_rows, gaps and out-of-order rows among them
// (RunFullLayer packs runs of consecutive rows): each equals that row captured alone. A row
// asked for twice is refused.
TEST_F(ForwardTest, CapturedQueryRowsComeInTheOrderAsked) {
  LlamaModel& llama = *model_->llama;
  const ModelConfig& c = model_->config;
  const std::vector<int32_t> tokens = RandomTokens(12, 13);
  const size_t q_width = static_cast<size_t>(c.num_heads) * c.head_dim;
  auto capture_of = [&](std::vector<int32_t> rows, absl::StatusCode want = absl::StatusCode::kOk) {
    auto cache = PagedKvCache::Create(
        *backend_,
        KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, 16, 2, llama.kv_cache_dtype()});
    EXPECT_TRUE(cache.ok()) << cache.status();
    BlockTable table;
    EXPECT_TRUE(table.Reserve(cache->pool(), 16, 16).ok());
    ForwardBatch batch;
    batch.AddSequence(table, 16, tokens, 0, true);
    ForwardCapture capture;
    capture.query_rows = std::move(rows);
    capture.query_layers = {0, c.num_layers - 1};
    EXPECT_EQ(llama.Run(batch, *cache, &capture).code(), want);
    return capture.queries;
  };
  const std::vector<int32_t> asked = {7, 2, 3, 4, 0, 11};
  const std::vector<std::vector<float>> together = capture_of(asked);
  ASSERT_EQ(together.size(), 2u);
  for (size_t j = 0; j < asked.size(); ++j) {
    const std::vector<std::vector<float>> alone = capture_of({asked[j]});
    for (size_t layer = 0; layer < 2; ++layer) {
      ASSERT_EQ(together[layer].size(), asked.size() * q_width);
      ASSERT_EQ(alone[layer].size(), q_width);
      EXPECT_TRUE(std::equal(alone[layer].begin(), alone[layer].end(),
                             together[layer].begin() + j * q_width))
          << "row " << asked[j] << ", layer " << layer;
    }
  }
  capture_of({1, 5, 1}, absl::StatusCode::kInvalidArgument);
}

TEST(DecodeGraphBucketsTest, CoverEveryBatchUpToTheMaximum) {
  EXPECT_EQ(LlamaModel::DecodeGraphBuckets(64),
            (std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}));
  EXPECT_EQ(LlamaModel::DecodeGraphBuckets(3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(LlamaModel::DecodeGraphBuckets(1), (std::vector<int32_t>{1}));
  const std::vector<int32_t> wide = LlamaModel::DecodeGraphBuckets(300);
  EXPECT_EQ(std::vector<int32_t>(wide.end() - 4, wide.end()),
            (std::vector<int32_t>{240, 256, 288, 300}));
  EXPECT_TRUE(std::is_sorted(wide.begin(), wide.end()));
}

// Decode steps padded to a graph bucket (run unrecorded here: the CPU has no graphs) give the
// real rows bitwise the logits of the unpadded steps, and the padding rows write nothing to
// the cache: three sequences pad to four rows, two fill their bucket, and seven sequences
// decode 7, 5, 6, 7 and 5 at a time within the bucket of eight.
TEST_F(ForwardTest, DecodeStepsPaddedToAGraphBucketMatchUnpaddedOnes) {
  LlamaModel& model = *model_->llama;
  const std::vector<std::pair<int32_t, std::vector<int32_t>>> cases = {
      {3, {3, 3, 3, 3}}, {2, {2, 2, 2}}, {7, {7, 5, 6, 7, 5}}};
  for (const auto& [seqs, active] : cases) {
    SCOPED_TRACE(seqs);
    model.SetDecodeGraphBuckets({});
    const testing::DecodeRun eager = testing::RunDecodeSteps(model, seqs, active, 21);
    model.SetDecodeGraphBuckets({1, 2, 4, 8});
    const testing::DecodeRun padded = testing::RunDecodeSteps(model, seqs, active, 21);
    model.SetDecodeGraphBuckets({});
    ASSERT_EQ(padded.logits.size(), eager.logits.size());
    for (size_t step = 0; step < eager.logits.size(); ++step) {
      ASSERT_EQ(padded.logits[step].size(), size_t(active[step]) * model_->config.vocab_size);
      EXPECT_TRUE(padded.logits[step] == eager.logits[step]) << "step " << step;
    }
    EXPECT_TRUE(padded.k == eager.k);
    EXPECT_TRUE(padded.v == eager.v);
  }
}

// The CPU backend with the CUDA backend's activation type: RmsNorm, SwiGlu and Attention compute
// in f32 on the CPU and store their results rounded to bf16; Linear widens bf16 rows to f32
// (exactly) and multiplies them on the CPU. So the model hands its activations over as on CUDA,
// and a buffer it passed with the wrong type would be read as the wrong bits.
class Bf16ActivationsBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  DType ActivationDType() const override { return DType::kBF16; }
  void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps,
               void* out) override {
    f32_.resize(size_t(n) * dim);
    inner_.RmsNorm(x, w, n, dim, eps, f32_.data());
    StoreBf16(out);
  }
  void Attention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                 const AttentionRows& rows, float scale, void* out) override {
    f32_.resize(size_t(rows.num_rows) * num_heads * cache.head_dim);
    inner_.Attention(q, ld, num_heads, cache, rows, scale, f32_.data());
    StoreBf16(out);
  }
  void SwiGlu(const float* gate_up, int32_t n, int32_t ff, void* out) override {
    f32_.resize(size_t(n) * ff);
    inner_.SwiGlu(gate_up, n, ff, f32_.data());
    StoreBf16(out);
  }
  void LinearRows(LinearInput x, int32_t n, const Weight& w, int64_t row_begin, int64_t rows,
                  const float* bias, float* y) override {
    if (x.dtype == DType::kF32) return inner_.LinearRows(x, n, w, row_begin, rows, bias, y);
    ASSERT_EQ(x.dtype, DType::kBF16);
    wide_.resize(size_t(n) * w.cols());
    ASSERT_TRUE(DequantizeRow(DType::kBF16, static_cast<const uint8_t*>(x.data),
                              static_cast<int64_t>(wide_.size()), wide_.data())
                    .ok());
    inner_.LinearRows(wide_.data(), n, w, row_begin, rows, bias, y);
  }

 private:
  void StoreBf16(void* out) {
    ConvertFromFloat(f32_.data(), static_cast<int64_t>(f32_.size()), DType::kBF16,
                     static_cast<uint8_t*>(out));
  }
  std::vector<float> f32_, wide_;
};

// The default model on bf16 activations against the same model on f32 ones, at every position
// of an English text: rounding each GEMM input to bf16 (2^-9 of a value) moves the logits by a
// little (measured below), a buffer handed over with the wrong type by O(10) (its bits read as
// the other type's: garbage); the top-1 token agrees wherever the f32 top-2 margin exceeds
// kMargin; and prefilling in chunks gives bitwise the same logits, as on f32.
TEST_F(ForwardTest, Bf16ActivationsStayCloseToF32AndBatchInvariant) {
  // Both on the CPU's f32 Linear arithmetic, whatever RIDGESERVE_TEST_ACTIVATIONS asks of the
  // fixture (int8 would add its own quantization of the activations on both sides).
  absl::StatusOr<std::unique_ptr<Backend>> cpu =
      CreateCpuBackendFromEnvironment(0, cpu::Activations::kF32);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<Model>> exact = LoadModel(RIDGESERVE_DEFAULT_MODEL, **cpu);
  ASSERT_TRUE(exact.ok()) << exact.status();
  Bf16ActivationsBackend bf16(**cpu);
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(RIDGESERVE_DEFAULT_MODEL, bf16);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> tokens = model_->tokenizer->Encode(
      "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a can "
      "of oil and a small brass key. For thirty years he had trimmed the wick, polished the "
      "great lens and written the weather into a leather book: wind from the north-west, a "
      "heavy swell, two fishing boats returning late. When the automatic lamp was installed, "
      "the harbour board sent him a letter thanking him for his service. He read it twice, "
      "folded it into the book, and went on climbing the stairs, because the ships still "
      "passed in the night and someone ought to watch them go by. In winter the storms came "
      "in from the sea and shook the windows of the tower until the glass sang.",
      /*add_bos=*/true, /*parse_special=*/false);
  ASSERT_GT(tokens.size(), size_t{120});
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t vocab = model_->config.vocab_size;
  auto all_logits = [&](LlamaModel& llama, int chunk) {
    SequenceRunner runner(llama, n);
    std::vector<float> logits;
    EXPECT_TRUE(runner.Append(tokens, chunk, /*all_logits=*/true, logits).ok());
    return logits;
  };
  const std::vector<float> f32 = all_logits(*(*exact)->llama, n);
  const std::vector<float> rounded = all_logits(*(*model)->llama, n);
  ASSERT_EQ(rounded.size(), size_t(n) * vocab);
  EXPECT_TRUE(rounded == all_logits(*(*model)->llama, 37)) << "chunked prefill on bf16";
  constexpr double kMaxAbs = 0.7, kMeanAbs = 0.1, kMargin = 0.5;
  double worst = 0, sum = 0;
  int32_t checked = 0, agree = 0;
  for (int32_t p = 0; p < n; ++p) {
    const float* a = f32.data() + size_t(p) * vocab;
    const float* b = rounded.data() + size_t(p) * vocab;
    for (int32_t v = 0; v < vocab; ++v) {
      const double d = std::abs(double{a[v]} - b[v]);
      ASSERT_FALSE(std::isnan(d)) << "position " << p;
      worst = std::max(worst, d);
      sum += d;
    }
    std::vector<float> row(a, a + vocab);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
    if (row[0] - row[1] <= kMargin) continue;
    ++checked;
    const int32_t top = static_cast<int32_t>(std::max_element(a, a + vocab) - a);
    agree += top == static_cast<int32_t>(std::max_element(b, b + vocab) - b);
  }
  const double mean = sum / (double(n) * vocab);
  std::printf(
      "[ measured ] bf16 vs f32 activations, %d positions: max |d| %.4f, mean |d| %.5f, "
      "top-1 agrees at %d of %d positions with a margin over %.1f\n",
      n, worst, mean, agree, checked, kMargin);
  EXPECT_GT(worst, 0.0) << "the activations were not rounded";
  EXPECT_LE(worst, kMaxAbs);
  EXPECT_LE(mean, kMeanAbs);
  EXPECT_GT(checked, n / 4);
  EXPECT_EQ(agree, checked);

  // Filled rows (a fill writing their K/V from h_s through the layer's own norm and projection,
  // StoreKvFromInput) on bf16 activations: the last row, which attends to their K/V, stays as
  // close to the same fill on f32.
  std::vector<uint8_t> filled(tokens.size(), 0);
  std::fill(filled.begin() + 4, filled.end() - 4, uint8_t{1});
  const IdentityFill keep(0);
  const RidgeFillRun fill{10, filled, &keep};
  auto last_filled = [&](LlamaModel& llama) {
    SequenceRunner runner(llama, n);
    std::vector<float> logits;
    EXPECT_TRUE(runner.Append(tokens, n, /*all_logits=*/false, logits, &fill).ok());
    return logits;
  };
  const std::vector<float> filled_f32 = last_filled(*(*exact)->llama);
  const std::vector<float> filled_bf16 = last_filled(*(*model)->llama);
  ASSERT_EQ(filled_f32.size(), size_t(vocab));
  EXPECT_NE(filled_f32, std::vector<float>(f32.end() - vocab, f32.end()));  // the fill ran
  double filled_worst = 0;
  for (int32_t v = 0; v < vocab; ++v) {
    filled_worst = std::max(filled_worst, std::abs(double{filled_f32[v]} - filled_bf16[v]));
  }
  std::printf("[ measured ] with %d filled rows, the last row: max |d| %.4f\n", n - 8,
              filled_worst);
  EXPECT_LE(filled_worst, kMaxAbs);
}

}  // namespace
}  // namespace ridgeserve
