// SpecPC and SpecKV in the serving engine on the default model with the self-draft (its first 8
// layers): whatever the batching, chunking and preemption, a SpecPC request keeps the tokens the
// one-sequence draft (RunSpecPcDraft) keeps and then decodes exactly what a plain greedy loop
// over the kept tokens decodes; a SpecKV request decodes what the one-sequence SpecKvSequence
// does and holds about `budget` KV entries after its prefill; a budget >= the prompt is exact;
// bad parameters are refused. The scoring, selection and decoding over kept entries themselves
// are checked against NumPy in tests/model/specpc_reference_test.py and speckv_reference_test.py.
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"
#include "engine/engine.h"
#include "engine/tools/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/default_model_fixture.h"

namespace ridgeserve {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  absl::Status status;
  FinishReason reason = FinishReason::kNone;
  int32_t prompt_tokens = 0;
  int32_t kept_prompt_tokens = 0;
  int32_t kept_kv_tokens = 0;
  double draft_seconds = 0;
  int32_t kv_blocks_used_after_prefill = -1;  // engine stats at the second token
};

class SpecPcEngineTest : public DefaultModelTest {
 protected:
  static void SetUpTestSuite() {
    DefaultModelTest::SetUpTestSuite();
    auto draft = LoadDraftModel("self:8", *model_, *backend_);
    ASSERT_TRUE(draft.ok()) << draft.status();
    draft_ = draft->release();
  }
  static void TearDownTestSuite() {
    delete draft_;
    draft_ = nullptr;
    DefaultModelTest::TearDownTestSuite();
  }

  static SpecPcParams Params(int32_t budget, int32_t lookahead) {
    return DefaultSpecPcParams(model_->config, draft_->num_layers, budget, lookahead);
  }

  // Greedy tokens of a plain one-sequence loop over `prompt`.
  // Greedy tokens after `prompt`; `rope`: SequenceRunner::SetRopePositions.
  static std::vector<int32_t> Decode(const std::vector<int32_t>& prompt, int max_new,
                                     std::vector<int32_t> rope = {}) {
    SequenceRunner runner(*model_->llama, static_cast<int32_t>(prompt.size()) + max_new);
    runner.SetRopePositions(std::move(rope));
    std::vector<float> logits;
    EXPECT_TRUE(runner.Append(prompt, 512, false, logits).ok());
    std::vector<int32_t> out;
    while (static_cast<int>(out.size()) < max_new) {
      const int32_t token = Argmax(logits);
      const std::vector<int32_t>& eog = model_->tokenizer->end_of_generation_ids();
      if (std::find(eog.begin(), eog.end(), token) != eog.end()) break;
      out.push_back(token);
      const int32_t one[] = {token};
      EXPECT_TRUE(runner.Append(one, 1, false, logits).ok());
    }
    return out;
  }

  // What the engine must produce for a SpecPC request: the offline draft's kept tokens,
  // decoded exactly (at their prompt positions, the rest after the prompt, with
  // original_positions).
  static std::vector<int32_t> Expected(const std::vector<int32_t>& prompt, int32_t budget,
                                       int32_t lookahead, int max_new,
                                       bool original_positions = false) {
    auto draft = RunSpecPcDraft(*draft_->llama, Params(budget, lookahead), prompt, 512,
                                model_->llama->kv_cache_dtype());
    EXPECT_TRUE(draft.ok()) << draft.status();
    EXPECT_EQ(static_cast<int32_t>(draft->kept.size()),
              std::min<int32_t>(budget, static_cast<int32_t>(prompt.size())));
    std::vector<int32_t> compressed;
    for (int32_t p : draft->kept) compressed.push_back(prompt[p]);
    return Decode(compressed, max_new, original_positions ? draft->kept : std::vector<int32_t>{});
  }

  // What the engine must produce for a SpecKV request: the one-sequence SpecKV decode.
  static std::vector<int32_t> ExpectedKv(const std::vector<int32_t>& prompt, int32_t budget,
                                         int32_t lookahead, int max_new) {
    SpecKvParams params;
    params.budget = budget;
    params.lookahead_tokens = std::min(lookahead, max_new);
    SpecKvSequence sequence(*model_->llama, static_cast<int32_t>(prompt.size()), max_new,
                            model_->llama->kv_cache_dtype());
    std::vector<float> logits;
    const std::vector<int32_t>& eog = model_->tokenizer->end_of_generation_ids();
    EXPECT_TRUE(
        sequence.Prefill(*draft_->llama, draft_->num_layers, params, prompt, 512, eog, logits)
            .ok());
    std::vector<int32_t> out;
    while (static_cast<int>(out.size()) < max_new) {
      const int32_t token = Argmax(logits);
      if (std::find(eog.begin(), eog.end(), token) != eog.end()) break;
      out.push_back(token);
      const int32_t one[] = {token};
      EXPECT_TRUE(sequence.Append(one, 1, false, logits).ok());
    }
    return out;
  }

  static EngineRequest Request(std::vector<int32_t> prompt, int32_t budget, int32_t lookahead,
                               int max_new, std::shared_ptr<std::promise<Outcome>> done,
                               bool kv = false, const Engine* engine = nullptr) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_new_tokens = max_new;
    (kv ? r.spec_kv.budget : r.spec_pc.budget) = budget;
    (kv ? r.spec_kv.lookahead_tokens : r.spec_pc.lookahead_tokens) = lookahead;
    auto outcome = std::make_shared<Outcome>();
    r.on_event = [outcome, done, engine](const TokenEvent& e) {
      if (engine != nullptr && outcome->tokens.size() == 1 && !e.tokens.empty()) {
        const EngineStats s = engine->stats();
        outcome->kv_blocks_used_after_prefill = s.kv_blocks_total - s.kv_blocks_free;
      }
      outcome->tokens.insert(outcome->tokens.end(), e.tokens.begin(), e.tokens.end());
      if (e.finished) {
        outcome->status = e.status;
        outcome->reason = e.finish_reason;
        outcome->prompt_tokens = e.prompt_tokens;
        outcome->kept_prompt_tokens = e.kept_prompt_tokens;
        outcome->kept_kv_tokens = e.kept_kv_tokens;
        outcome->draft_seconds = e.timing.draft_seconds;
        done->set_value(*outcome);
      }
    };
    return r;
  }

  struct Case {
    std::vector<int32_t> prompt;
    int32_t budget = 0;  // 0: exact
    int32_t lookahead = 1;
    int max_new = 10;
    bool kv = false;  // SpecKV, else SpecPC
  };

  // Submits every case at once; each must give its expected tokens.
  static void RunAll(Engine& engine, const std::vector<Case>& cases) {
    std::vector<std::vector<int32_t>> expected;
    for (const Case& c : cases) {
      expected.push_back(c.budget == 0 ? Decode(c.prompt, c.max_new)
                         : c.kv        ? ExpectedKv(c.prompt, c.budget, c.lookahead, c.max_new)
                                       : Expected(c.prompt, c.budget, c.lookahead, c.max_new));
    }
    std::vector<std::future<Outcome>> futures;
    for (const Case& c : cases) {
      auto done = std::make_shared<std::promise<Outcome>>();
      futures.push_back(done->get_future());
      ASSERT_TRUE(
          engine.Submit(Request(c.prompt, c.budget, c.lookahead, c.max_new, done, c.kv)).ok());
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      const Outcome out = futures[i].get();
      ASSERT_TRUE(out.status.ok()) << out.status;
      EXPECT_EQ(out.tokens, expected[i]) << "request " << i;
      const int32_t prompt = static_cast<int32_t>(cases[i].prompt.size());
      EXPECT_EQ(out.prompt_tokens, prompt);
      const bool compressed = cases[i].budget > 0 && cases[i].budget < prompt;
      const bool pc = compressed && !cases[i].kv, kv = compressed && cases[i].kv;
      EXPECT_EQ(out.kept_prompt_tokens, pc ? cases[i].budget : prompt) << "request " << i;
      EXPECT_EQ(out.kept_kv_tokens, kv ? cases[i].budget : prompt) << "request " << i;
      EXPECT_EQ(out.draft_seconds > 0, compressed) << "request " << i;
    }
  }

  static inline DraftModel* draft_ = nullptr;
};

TEST_F(SpecPcEngineTest, BatchedAndChunkedRequestsKeepTheOfflineDraftsTokens) {
  EngineOptions options;
  options.draft = draft_;
  options.scheduler.max_batch_tokens = 96;  // prompts are prefilled (draft and target) in chunks
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunAll(**engine, {{RandomTokens(300, 1), 128, 1},
                    {RandomTokens(41, 2), 0},
                    {RandomTokens(420, 3), 160, 4},
                    {RandomTokens(250, 4), 96, 2},
                    {RandomTokens(90, 5), 0}});
}

TEST_F(SpecPcEngineTest, DraftPreemptionRecomputesTheSameSelection) {
  EngineOptions options;
  options.draft = draft_;
  options.scheduler.max_batch_tokens = 128;
  options.draft_kv_cache_tokens = 272;  // one ~200-token prompt and its lookahead at a time
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunAll(**engine, {{RandomTokens(200, 11), 96, 16},
                    {RandomTokens(210, 12), 96, 16},
                    {RandomTokens(190, 13), 80, 8}});
  EXPECT_GT((*engine)->stats().num_preemptions, 0);
}

TEST_F(SpecPcEngineTest, BudgetCoveringThePromptIsExact) {
  EngineOptions options;
  options.draft = draft_;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunAll(**engine, {{RandomTokens(120, 21), 120, 1}, {RandomTokens(100, 22), 512, 1}});
}

TEST_F(SpecPcEngineTest, OriginalPositionsAreBatchInvariant) {
  EngineOptions options;
  options.draft = draft_;
  options.spec_pc_original_positions = true;
  options.scheduler.max_batch_tokens = 64;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = RandomTokens(260, 31);
  auto run = [&](int others) {
    std::vector<std::future<Outcome>> futures;
    for (int i = 0; i <= others; ++i) {
      auto done = std::make_shared<std::promise<Outcome>>();
      futures.push_back(done->get_future());
      std::vector<int32_t> p = i == 0 ? prompt : RandomTokens(200 + 10 * i, 40 + i);
      EXPECT_TRUE((*engine)->Submit(Request(p, 96, 1, 12, done)).ok());
    }
    std::vector<Outcome> outs;
    for (auto& f : futures) outs.push_back(f.get());
    return outs;
  };
  const Outcome alone = run(0)[0];
  ASSERT_TRUE(alone.status.ok()) << alone.status;
  EXPECT_EQ(alone.kept_prompt_tokens, 96);
  EXPECT_EQ(run(3)[0].tokens, alone.tokens);
  // The offline run of the same definition (SequenceRunner's RoPE positions), and not the
  // renumbered one the reference does (else the positions were not applied).
  EXPECT_EQ(alone.tokens, Expected(prompt, 96, 1, 12, /*original_positions=*/true));
  EXPECT_NE(alone.tokens, Expected(prompt, 96, 1, 12));
}

TEST_F(SpecPcEngineTest, SpecKvBatchedWithOtherModesDecodesAsTheOneSequenceRun) {
  EngineOptions options;
  options.draft = draft_;
  options.scheduler.max_batch_tokens = 96;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunAll(**engine, {{RandomTokens(300, 51), 64, 8, 10, true},
                    {RandomTokens(260, 52), 128, 1},
                    {RandomTokens(350, 53), 100, 64, 12, true},
                    {RandomTokens(70, 54), 0}});
}

// The SpecKV request arrives last, so it is the one preempted once both decode into a full
// cache, after its K/V were compacted: it starts over from prompt + lookahead and replays the
// tokens it already emitted.
TEST_F(SpecPcEngineTest, SpecKvPreemptionReplaysTheSameTokens) {
  EngineOptions options;
  options.draft = draft_;
  options.scheduler.max_batch_tokens = 128;
  options.kv_cache_tokens = 352;  // 22 blocks: 60 + 200 and 64 + 150 tokens do not fit together
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunAll(**engine, {{RandomTokens(60, 63), 0, 1, 200}, {RandomTokens(200, 61), 64, 8, 150, true}});
  EXPECT_GT((*engine)->stats().num_preemptions, 0);
}

TEST_F(SpecPcEngineTest, SpecKvHoldsTheBudgetsBlocksAfterPrefill) {
  EngineOptions options;
  options.draft = draft_;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto done = std::make_shared<std::promise<Outcome>>();
  auto future = done->get_future();
  const int32_t prompt = 400, budget = 64;
  ASSERT_TRUE(
      (*engine)
          ->Submit(Request(RandomTokens(prompt, 71), budget, 16, 6, done, true, engine->get()))
          .ok());
  const Outcome out = future.get();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.kept_kv_tokens, budget);
  // Published after the step that compacted (before the next token's block): the budget's
  // entries and at most the next tokens', not the prompt's 25 blocks.
  const int32_t block = options.scheduler.block_size;
  EXPECT_GE(out.kv_blocks_used_after_prefill, (budget + block - 1) / block);
  EXPECT_LE(out.kv_blocks_used_after_prefill, (budget + 2 + block - 1) / block);
}

TEST_F(SpecPcEngineTest, RefusesBadParameters) {
  EngineOptions options;
  auto no_draft = Engine::Create(*model_, options);
  ASSERT_TRUE(no_draft.ok());
  auto done = std::make_shared<std::promise<Outcome>>();
  EXPECT_EQ((*no_draft)->Submit(Request(RandomTokens(200, 1), 128, 1, 4, done)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options.draft = draft_;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  auto status_of = [&](EngineRequest r) { return (*engine)->Submit(std::move(r)).status(); };
  const absl::Status low = status_of(Request(RandomTokens(200, 1), 10, 1, 4, done));
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(low.message().find("spec_pc.budget"), std::string::npos) << low;
  EXPECT_EQ(status_of(Request(RandomTokens(200, 1), 128, 0, 4, done)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status_of(Request(RandomTokens(200, 1), 128, kSpecPcMaxLookahead + 1, 4, done)).code(),
            absl::StatusCode::kInvalidArgument);
  EngineRequest both = Request(RandomTokens(200, 1), 128, 1, 4, done);
  both.ridgefill.split_layer = 4;
  EXPECT_EQ(status_of(std::move(both)).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status kv_low = status_of(Request(RandomTokens(200, 1), 32, 1, 4, done, true));
  EXPECT_EQ(kv_low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kv_low.message().find("spec_kv.budget"), std::string::npos) << kv_low;
  EngineRequest two = Request(RandomTokens(200, 1), 128, 1, 4, done);
  two.spec_kv.budget = 64;
  EXPECT_EQ(status_of(std::move(two)).code(), absl::StatusCode::kInvalidArgument);
  auto bad_draft = LoadDraftModel("self:99", *model_, *backend_);
  EXPECT_EQ(bad_draft.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_draft.status().message().find("self:99"), std::string::npos);
}

TEST_F(SpecPcEngineTest, AbortWhileDraftingEndsTheRequest) {
  EngineOptions options;
  options.draft = draft_;
  options.scheduler.max_batch_tokens = 32;  // drafting takes many steps
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  auto done = std::make_shared<std::promise<Outcome>>();
  auto future = done->get_future();
  auto id = (*engine)->Submit(Request(RandomTokens(600, 7), 128, 1, 8, done));
  ASSERT_TRUE(id.ok());
  (*engine)->Abort(*id);
  const Outcome out = future.get();
  EXPECT_EQ(out.reason, FinishReason::kAborted);
  EXPECT_TRUE(out.tokens.empty());
  // The engine serves on: a later request runs to completion.
  auto next = std::make_shared<std::promise<Outcome>>();
  auto next_future = next->get_future();
  ASSERT_TRUE((*engine)->Submit(Request(RandomTokens(200, 8), 96, 1, 4, next)).ok());
  EXPECT_TRUE(next_future.get().status.ok());
}

}  // namespace
}  // namespace ridgeserve
