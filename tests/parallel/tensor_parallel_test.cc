// Tensor parallelism on the CPU backend: the thread communicator's collectives, shard
// planning, and the default model sharded over 3 ranks (its 9 heads / 3 KV heads) against the
// same model unsharded. The tiny random Llama / Qwen2 / Qwen3 models at TP 2 and 4 are checked
// against the NumPy reference in tests/model/tiny_models_test.py.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "engine/parallel/rank_group.h"
#include "engine/parallel/tensor_parallel_executor.h"
#include "engine/parallel/thread_communicator.h"
#include "engine/tools/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/default_model_fixture.h"

namespace ridgeserve {
namespace {

// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void OnRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

std::vector<float> RankData(int rank, size_t count) {
  std::vector<float> v(count);
  // Magnitudes that make float addition order visible.
  for (size_t i = 0; i < count; ++i) {
    v[i] = std::ldexp(1.0f + 0.37f * ((i * 7 + rank * 13) % 11), (rank * 11 + i) % 40 - 20);
  }
  return v;
}

TEST(ThreadCommunicatorTest, AllReduceAddsInRankOrderOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 1001;  // not a multiple of the ranks
  ThreadCommunicatorGroup group(kRanks);
  std::vector<std::vector<float>> data(kRanks);
  for (int r = 0; r < kRanks; ++r) data[r] = RankData(r, kCount);
  std::vector<float> want(kCount);
  for (size_t i = 0; i < kCount; ++i) want[i] = (data[0][i] + data[1][i]) + data[2][i];
  std::vector<absl::Status> status(kRanks);
  OnRanks(kRanks, [&](int r) {
    for (int rep = 0; rep < 3 && status[r].ok(); ++rep) {
      std::vector<float> mine = RankData(r, kCount);
      status[r] = group.rank(r).AllReduceSum(mine.data(), kCount);
      if (rep == 2) data[r] = mine;
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(data[r], want) << "rank " << r;
  }
}

TEST(ThreadCommunicatorTest, AllGatherAndBroadcast) {
  constexpr int kRanks = 4;
  ThreadCommunicatorGroup group(kRanks);
  std::vector<std::vector<float>> gathered(kRanks, std::vector<float>(kRanks * 5));
  std::vector<std::vector<int32_t>> cast(kRanks);
  std::vector<absl::Status> status(kRanks);
  OnRanks(kRanks, [&](int r) {
    const std::vector<float> mine = RankData(r, 5);
    status[r] = group.rank(r).AllGather(mine.data(), 5, gathered[r].data());
    cast[r] = {r, r * 10, r * 100};
    if (status[r].ok()) status[r] = group.rank(r).Broadcast(cast[r].data(), 12, 2);
    if (status[r].ok()) status[r] = group.rank(r).Barrier();
  });
  std::vector<float> want;
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<float> part = RankData(r, 5);
    want.insert(want.end(), part.begin(), part.end());
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(gathered[r], want);
    EXPECT_EQ(cast[r], (std::vector<int32_t>{2, 20, 200}));
  }
}

TEST(ThreadCommunicatorTest, AbortReleasesWaitingRanksAndResetRecovers) {
  constexpr int kRanks = 3;
  ThreadCommunicatorGroup group(kRanks);
  std::vector<absl::Status> status(kRanks);
  // Ranks 0 and 1 wait in an all-reduce rank 2 never joins; rank 2 aborts instead.
  OnRanks(kRanks, [&](int r) {
    std::vector<float> mine(8, 1.0f);
    if (r == 2) {
      // Let the others block in the all-reduce first (the wake-up path, not the entry check).
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      group.rank(r).Abort("rank 2: out of memory");
    } else {
      status[r] = group.rank(r).AllReduceSum(mine.data(), mine.size());
    }
  });
  for (int r : {0, 1}) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kAborted) << status[r];
    EXPECT_NE(status[r].message().find("rank 2: out of memory"), std::string::npos) << status[r];
  }
  // Later collectives fail too, until the group is reset.
  float one = 1;
  EXPECT_EQ(group.rank(0).AllReduceSum(&one, 1).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(group.rank(0).Reset().ok());
  std::vector<float> sums(kRanks, 0);
  OnRanks(kRanks, [&](int r) {
    sums[r] = static_cast<float>(r + 1);
    status[r] = group.rank(r).AllReduceSum(&sums[r], 1);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(sums[r], 6.0f);
  }
}

TEST(ThreadCommunicatorTest, RanksCallingDifferentCollectivesAbortInsteadOfReadingAstray) {
  constexpr int kRanks = 3;
  ThreadCommunicatorGroup group(kRanks);
  std::vector<absl::Status> status(kRanks);
  OnRanks(kRanks, [&](int r) {
    std::vector<float> mine(r == 1 ? 4 : 64, 1.0f);
    status[r] = r == 1 ? group.rank(r).Broadcast(mine.data(), sizeof(float) * 4, 0)
                       : group.rank(r).AllReduceSum(mine.data(), mine.size());
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kAborted) << "rank " << r << ": " << status[r];
    EXPECT_NE(status[r].message().find("rank 1 called collective"), std::string::npos) << status[r];
  }
}

ModelConfig Shape(int heads, int kv_heads, int ffn) {
  ModelConfig c;
  c.name = "test";
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.ffn = ffn;
  c.head_dim = 64;
  c.vocab_size = 1000;
  return c;
}

TEST(PlanShardTest, SplitsHeadsFeaturesAndVocabulary) {
  const ModelConfig c = Shape(9, 3, 1536);  // SmolLM2-135M
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<ShardLayout> s = PlanShard(c, r, 3);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->q_head_begin, 3 * r);
    EXPECT_EQ(s->num_heads, 3);
    EXPECT_EQ(s->kv_head_begin, r);
    EXPECT_EQ(s->num_kv_heads, 1);
    EXPECT_EQ(s->ffn_begin, 512 * r);
    EXPECT_EQ(s->vocab_stride, 334);
    EXPECT_EQ(s->vocab_begin, 334 * r);
    EXPECT_EQ(s->vocab, r < 2 ? 334 : 332);
  }
}

// What a rank's step runs, for Backend::ReserveOps: its own widths (the last rank's vocabulary
// slice is the shorter one), its Linear inputs and its heads.
TEST(PlanShardTest, StepOpShapesAreTheRanksLinearsAndHeads) {
  ModelConfig c = Shape(9, 3, 1536);  // head_dim 64, vocabulary 1000
  c.hidden = 576;
  for (int r : {0, 2}) {
    absl::StatusOr<ShardLayout> s = PlanShard(c, r, 3);
    ASSERT_TRUE(s.ok()) << s.status();
    const OpShapes ops = StepOpShapes(c, *s, 512, DType::kBF16);
    EXPECT_EQ(ops.rows, 512);
    // Hidden, the rank's 192 query and 512 MLP features.
    EXPECT_EQ(ops.linear_ks, (std::vector<int64_t>{576, 192, 512}));
    EXPECT_EQ(ops.f32_linear_k, 576);  // the residual stream (RidgeFill), whole on every rank
    // QKV (3 + 2 heads), O and down, gate-up, the LM head slice, RidgeFill's K/V.
    EXPECT_EQ(ops.linear_widths, (std::vector<int64_t>{320, 576, 1024, r == 0 ? 334 : 332, 128}));
    EXPECT_EQ(ops.num_heads, 3);
    EXPECT_EQ(ops.num_kv_heads, 1);
    EXPECT_EQ(ops.head_dim, 64);
    EXPECT_EQ(ops.kv_dtype, DType::kBF16);
  }
}

TEST(PlanShardTest, ReplicatesKvHeadsWhenRanksOutnumberThem) {
  const ModelConfig c = Shape(8, 2, 256);
  for (int r = 0; r < 8; ++r) {
    absl::StatusOr<ShardLayout> s = PlanShard(c, r, 8);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->num_kv_heads, 1);
    // The KV head the rank's query head uses under GQA (4 query heads per KV head).
    EXPECT_EQ(s->kv_head_begin, s->q_head_begin / 4) << "rank " << r;
  }
}

TEST(PlanShardTest, RefusesSizesThatDoNotDivide) {
  const absl::StatusOr<ShardLayout> heads = PlanShard(Shape(9, 3, 1536), 0, 2);
  EXPECT_EQ(heads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(heads.status().message().find("does not divide test's 9 attention heads"),
            std::string::npos)
      << heads.status();
  const absl::StatusOr<ShardLayout> kv = PlanShard(Shape(12, 4, 1536), 0, 6);
  EXPECT_NE(kv.status().message().find("4 KV heads"), std::string::npos) << kv.status();
  const absl::StatusOr<ShardLayout> ffn = PlanShard(Shape(8, 8, 100), 0, 8);
  EXPECT_NE(ffn.status().message().find("MLP width 100"), std::string::npos) << ffn.status();
}

// The default model at TP=3 beside the fixture's TP=1 copy.
class TensorParallelModelTest : public DefaultModelTest {
 protected:
  static constexpr int kRanks = 3;
  static void SetUpTestSuite() {
    DefaultModelTest::SetUpTestSuite();
    auto isa = cpu::IsaFromEnvironment();  // the fixture's path (RIDGESERVE_CPU_ISA)
    ASSERT_TRUE(isa.ok()) << isa.status();
    auto group = CreateRankGroup("cpu", kRanks, {.isa = *isa});
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = new RankGroup(*std::move(group));
    auto model = LoadModel(RIDGESERVE_DEFAULT_MODEL, group_->backend_ptrs(), group_->comms);
    ASSERT_TRUE(model.ok()) << model.status();
    sharded_ = model->release();
  }
  static void TearDownTestSuite() {
    delete sharded_;
    delete group_;
    DefaultModelTest::TearDownTestSuite();
  }

  static std::vector<float> AllLogits(const Model& model, const std::vector<int32_t>& tokens,
                                      int chunk) {
    SequenceRunner runner(model, static_cast<int32_t>(tokens.size()));
    std::vector<float> logits;
    const absl::Status status = runner.Append(tokens, chunk, /*all_logits=*/true, logits);
    EXPECT_TRUE(status.ok()) << status;
    return logits;
  }

  static inline RankGroup* group_ = nullptr;
  static inline Model* sharded_ = nullptr;
};

TEST_F(TensorParallelModelTest, LoadsOneSliceOfEveryWeightPerRank) {
  ASSERT_EQ(sharded_->tensor_parallel(), kRanks);
  size_t total = 0;
  for (LlamaModel* rank : sharded_->rank_models()) {
    EXPECT_EQ(rank->shard().num_heads, 3);
    EXPECT_EQ(rank->shard().num_kv_heads, 1);
    total += rank->weights().resident_bytes();
  }
  const size_t whole = model_->llama->weights().resident_bytes();
  // Every matrix is split; only the norms (and rope table) are replicated.
  EXPECT_LT(total, whole * 1.01) << total << " vs " << whole;
  EXPECT_GT(total, whole * 0.99) << total << " vs " << whole;
}

// Within a stated tolerance of TP=1: the attention and MLP output projections are summed per
// rank and then over ranks, another float order than one dot product.
TEST_F(TensorParallelModelTest, LogitsMatchUnshardedModel) {
  const int32_t vocab = model_->config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(160, 11);
  const std::vector<float> one = AllLogits(*model_, tokens, 64);
  const std::vector<float> three = AllLogits(*sharded_, tokens, 64);
  ASSERT_EQ(one.size(), three.size());
  constexpr float kTol = 2e-3f;  // logits reach ~30 here; measured max |d| is printed
  float max_d = 0;
  int decided = 0, agree = 0;
  for (size_t p = 0; p < tokens.size(); ++p) {
    const float* a = one.data() + p * vocab;
    const float* b = three.data() + p * vocab;
    int best_a = 0, best_b = 0;
    float first = -INFINITY, second = -INFINITY;
    for (int32_t j = 0; j < vocab; ++j) {
      max_d = std::max(max_d, std::abs(a[j] - b[j]));
      if (a[j] > a[best_a]) best_a = j;
      if (b[j] > b[best_b]) best_b = j;
      if (a[j] > first) {
        second = first;
        first = a[j];
      } else if (a[j] > second) {
        second = a[j];
      }
    }
    if (first - second > 2 * kTol) {
      ++decided;
      agree += best_a == best_b;
    }
  }
  std::printf(
      "TP=3 vs TP=1 over %zu positions: max |d| %.3g; greedy equal at %d of %d positions "
      "with margin > %.3g\n",
      tokens.size(), max_d, agree, decided, 2 * kTol);
  EXPECT_LE(max_d, kTol);
  EXPECT_EQ(agree, decided);
  EXPECT_GT(decided, static_cast<int>(tokens.size()) * 9 / 10);
}

// Batch invariance holds within one TP size: a sequence's logits are bitwise the same alone,
// in other chunkings and batched with another sequence.
TEST_F(TensorParallelModelTest, BatchInvariantWithinTheSameSize) {
  const int32_t vocab = model_->config.vocab_size;
  const std::vector<int32_t> a = RandomTokens(70, 12), b = RandomTokens(30, 13);
  const std::vector<float> a_alone = AllLogits(*sharded_, a, 70);
  const std::vector<float> b_alone = AllLogits(*sharded_, b, 30);
  EXPECT_EQ(AllLogits(*sharded_, a, 9), a_alone);

  const ModelConfig& c = model_->config;
  std::vector<std::unique_ptr<PagedKvCache>> caches;
  std::vector<PagedKvCache*> ptrs;
  for (LlamaModel* rank : sharded_->rank_models()) {
    auto cache = PagedKvCache::Create(
        rank->backend(),
        KvCacheShape{c.num_layers, rank->shard().num_kv_heads, c.head_dim, 16, 16});
    ASSERT_TRUE(cache.ok()) << cache.status();
    caches.push_back(std::make_unique<PagedKvCache>(*std::move(cache)));
    ptrs.push_back(caches.back().get());
  }
  TensorParallelExecutor executor(sharded_->rank_models(), ptrs);
  BlockTable ta, tb;
  ASSERT_TRUE(ta.Reserve(ptrs[0]->pool(), 70, 16).ok());
  ASSERT_TRUE(tb.Reserve(ptrs[0]->pool(), 30, 16).ok());
  ForwardBatch step1;
  step1.AddSequence(ta, 16, std::span(a).first(50), 0, true);
  step1.AddSequence(tb, 16, std::span(b).first(29), 0, true);
  std::vector<float> logits;
  ASSERT_TRUE(executor.Run(step1, nullptr).ok());
  executor.head().CopyAllLogits(logits);
  ASSERT_EQ(logits.size(), 2u * vocab);
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + vocab, a_alone.begin() + 49 * vocab));
  EXPECT_TRUE(std::equal(logits.begin() + vocab, logits.end(), b_alone.begin() + 28 * vocab));
  ForwardBatch step2;
  step2.AddSequence(tb, 16, std::span(b).subspan(29), 29, true);
  step2.AddSequence(ta, 16, std::span(a).subspan(50), 50, true);
  ASSERT_TRUE(executor.Run(step2, nullptr).ok());
  executor.head().CopyAllLogits(logits);
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + vocab, b_alone.begin() + 29 * vocab));
  EXPECT_TRUE(std::equal(logits.begin() + vocab, logits.end(), a_alone.begin() + 69 * vocab));
}

// A rank that fails a step (the others already wait in its first collective) fails the step with
// Internal naming it, without hanging, and the group serves the next step correctly.
TEST_F(TensorParallelModelTest, FailedRankFailsTheStepAndTheGroupRecovers) {
  const std::vector<int32_t> tokens = RandomTokens(20, 14);
  const std::vector<float> want = AllLogits(*sharded_, tokens, 20);
  ASSERT_EQ(setenv("RIDGESERVE_TEST_TP_FAULT", "1:2", 1), 0);
  SequenceRunner runner(*sharded_, 40);
  ASSERT_EQ(unsetenv("RIDGESERVE_TEST_TP_FAULT"), 0);
  std::vector<float> logits;
  const absl::Status failed = runner.Append(tokens, 10, /*all_logits=*/true, logits);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_NE(failed.message().find("tensor-parallel rank 1 failed: injected fault at step 2"),
            std::string::npos)
      << failed;
  runner.Reset();
  ASSERT_TRUE(runner.Append(tokens, 20, /*all_logits=*/true, logits).ok());
  EXPECT_EQ(logits, want);
}

// A step the model refuses fails with the model's own error before any rank runs it (so the
// group is not aborted for it: an NCCL group could not recover), and the next step runs. The
// group here is not reset after a failed step, as an NCCL group cannot be: had a rank run the
// refused step and failed, the next step would fail too.
TEST_F(TensorParallelModelTest, AStepTheModelRefusesFailsAloneWithTheModelsError) {
  const ModelConfig& c = model_->config;
  std::vector<std::unique_ptr<PagedKvCache>> caches;
  std::vector<PagedKvCache*> ptrs;
  for (LlamaModel* rank : sharded_->rank_models()) {
    auto cache = PagedKvCache::Create(
        rank->backend(), KvCacheShape{c.num_layers, rank->shard().num_kv_heads, c.head_dim, 16, 4});
    ASSERT_TRUE(cache.ok()) << cache.status();
    caches.push_back(std::make_unique<PagedKvCache>(*std::move(cache)));
    ptrs.push_back(caches.back().get());
  }
  ASSERT_EQ(setenv("RIDGESERVE_TEST_TP_FAULT", "0:1000000:unrecoverable", 1), 0);
  TensorParallelExecutor executor(sharded_->rank_models(), ptrs);
  ASSERT_EQ(unsetenv("RIDGESERVE_TEST_TP_FAULT"), 0);
  const std::vector<int32_t> tokens = RandomTokens(20, 15);
  BlockTable table;
  ASSERT_TRUE(table.Reserve(ptrs[0]->pool(), 20, 16).ok());
  ForwardBatch bad;
  bad.AddSequence(table, 16, tokens, 0, true);
  bad.fill_split = {0};  // one entry for 20 rows
  const absl::Status refused = executor.Run(bad, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("fill_split"), std::string::npos) << refused;
  ForwardBatch good;
  good.AddSequence(table, 16, tokens, 0, true);
  const absl::Status ran = executor.Run(good, nullptr);
  ASSERT_TRUE(ran.ok()) << ran;
  std::vector<float> logits;
  executor.head().CopyAllLogits(logits);
  const std::vector<float> want = AllLogits(*sharded_, tokens, 20);
  ASSERT_EQ(logits.size(), static_cast<size_t>(c.vocab_size));
  EXPECT_TRUE(std::equal(logits.begin(), logits.end(), want.end() - c.vocab_size));
}

}  // namespace
}  // namespace ridgeserve
