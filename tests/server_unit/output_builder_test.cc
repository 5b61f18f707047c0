// OutputBuilder on the default model's tokenizer: deltas concatenate to the decoded text,
// never split a UTF-8 character, stop strings cut the text across token boundaries and ask
// for an engine abort, and the final message carries finish_reason, usage and timing.
#include "server/output_builder.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server_unit/smollm2_fixture.h"

namespace ridgeserve {
namespace {

using ::testing::ElementsAreArray;

// UTF-8 validity written from RFC 3629 (independent of the tokenizer's helpers).
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n;
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated
    for (int k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n + 1;
  }
  return true;
}

TokenEvent TokenAt(int32_t token) {
  TokenEvent e;
  e.tokens = {token};
  e.logprobs = {-0.5f};
  return e;
}

TokenEvent Final(FinishReason reason) {
  TokenEvent e;
  e.finished = true;
  e.finish_reason = reason;
  e.prompt_tokens = 11;
  e.completion_tokens = 99;  // the engine's count; the builder reports what it delivered
  e.cached_prompt_tokens = 4;
  e.timing = {0.1, 0.2, 0.3, 0.4};
  return e;
}

class OutputBuilderTest : public SmolLM2Test {};

TEST_F(OutputBuilderTest, DeltasConcatenateToTheTextAndNeverSplitCharacters) {
  const std::string text = "Grüße aus 東京 🙂 — naïve café.";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, false, false);
  OutputBuilder builder(*tokenizer_, "r1", {}, 11);
  std::string joined;
  std::vector<int32_t> seen;
  for (int32_t id : ids) {
    OutputBuilder::Step step = builder.OnEvent(TokenAt(id));
    EXPECT_FALSE(step.finished);
    EXPECT_FALSE(step.abort_engine);
    EXPECT_TRUE(ValidUtf8(step.delta.text())) << step.delta.text();
    EXPECT_EQ(step.delta.request_id(), "r1");
    joined += step.delta.text();
    seen.insert(seen.end(), step.delta.token_ids().begin(), step.delta.token_ids().end());
  }
  OutputBuilder::Step last = builder.OnEvent(Final(FinishReason::kLength));
  joined += last.delta.text();
  EXPECT_EQ(joined, text);
  EXPECT_THAT(seen, ElementsAreArray(ids));
  EXPECT_TRUE(last.finished);
  EXPECT_TRUE(last.status.ok());
  EXPECT_EQ(last.delta.finish_reason(), v1::LENGTH);
  EXPECT_EQ(last.delta.usage().prompt_tokens(), 11);
  EXPECT_EQ(last.delta.usage().completion_tokens(), static_cast<int32_t>(ids.size()));
  EXPECT_EQ(last.delta.usage().cached_prompt_tokens(), 4);
  EXPECT_EQ(last.delta.usage().exact_prompt_tokens(), 11);
  EXPECT_EQ(last.delta.usage().kept_prompt_tokens(), 11);  // the engine left it unset
  EXPECT_EQ(last.delta.usage().kept_kv_tokens(), 11);      // likewise
  EXPECT_DOUBLE_EQ(last.delta.timing().ttft_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(last.delta.timing().e2e_seconds(), 0.4);
}

TEST_F(OutputBuilderTest, StopStringAcrossTokensCutsTextAndAbortsOnce) {
  const std::string text = "The answer is Paris.\n\nUser: more";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, false, false);
  OutputBuilder builder(*tokenizer_, "r2", {"\n\nUser:"}, 3);
  std::string joined;
  int aborts = 0;
  int delivered = 0;
  for (int32_t id : ids) {
    OutputBuilder::Step step = builder.OnEvent(TokenAt(id));
    joined += step.delta.text();
    aborts += step.abort_engine;
    delivered += step.delta.token_ids_size();
    EXPECT_EQ(step.delta.logprobs_size(), step.delta.token_ids_size());
  }
  EXPECT_EQ(aborts, 1);
  EXPECT_TRUE(builder.stop_matched());
  // The engine's final event after the abort.
  OutputBuilder::Step last = builder.OnEvent(Final(FinishReason::kAborted));
  joined += last.delta.text();
  EXPECT_EQ(joined, "The answer is Paris.");
  EXPECT_EQ(last.delta.finish_reason(), v1::STOP_SEQUENCE);
  EXPECT_EQ(last.delta.usage().completion_tokens(), delivered);
  EXPECT_LT(delivered, static_cast<int>(ids.size()));  // tokens after the match are dropped
}

TEST_F(OutputBuilderTest, HeldBackTextIsReleasedAtTheEnd) {
  OutputBuilder builder(*tokenizer_, "r3", {"Paris!"}, 3);
  std::string joined;
  for (int32_t id : tokenizer_->Encode("It is Paris", false, false)) {
    joined += builder.OnEvent(TokenAt(id)).delta.text();
  }
  EXPECT_EQ(joined, "It is ");  // " Paris" could still become "Paris!"
  OutputBuilder::Step last = builder.OnEvent(Final(FinishReason::kStop));
  EXPECT_EQ(joined + last.delta.text(), "It is Paris");
  EXPECT_EQ(last.delta.finish_reason(), v1::STOP);
}

TEST_F(OutputBuilderTest, SpecialTokensAreNotText) {
  OutputBuilder builder(*tokenizer_, "r4", {}, 3);
  TokenEvent e;
  e.tokens = {tokenizer_->Encode("Hi", false, false)[0], 2};  // 2 = <|im_end|>
  OutputBuilder::Step step = builder.OnEvent(e);
  EXPECT_EQ(step.delta.text(), "Hi");
  EXPECT_EQ(step.delta.token_ids_size(), 2);
}

TEST_F(OutputBuilderTest, SpecPcUsageCountsKeptTokensAndDraftTime) {
  OutputBuilder builder(*tokenizer_, "r6", {}, 11);
  TokenEvent e = Final(FinishReason::kLength);
  e.kept_prompt_tokens = 7;
  e.timing.draft_seconds = 0.05;
  e.timing.estimated_ttft_saved_seconds = 0.02;
  const OutputBuilder::Step step = builder.OnEvent(e);
  EXPECT_EQ(step.delta.usage().prompt_tokens(), 11);
  EXPECT_EQ(step.delta.usage().kept_prompt_tokens(), 7);
  EXPECT_EQ(step.delta.usage().exact_prompt_tokens(), 7);  // the dropped 4 ran no layer
  EXPECT_DOUBLE_EQ(step.delta.timing().draft_seconds(), 0.05);
  EXPECT_DOUBLE_EQ(step.delta.timing().estimated_ttft_saved_seconds(), 0.02);
}

TEST_F(OutputBuilderTest, SpecKvUsageCountsKeptKvEntriesAndDraftTime) {
  OutputBuilder builder(*tokenizer_, "r7", {}, 11);
  TokenEvent e = Final(FinishReason::kLength);
  e.prompt_tokens = 11;
  e.kept_prompt_tokens = 11;
  e.kept_kv_tokens = 5;
  e.timing.draft_seconds = 0.25;
  const OutputBuilder::Step step = builder.OnEvent(e);
  EXPECT_EQ(step.delta.usage().prompt_tokens(), 11);
  EXPECT_EQ(step.delta.usage().kept_kv_tokens(), 5);
  EXPECT_EQ(step.delta.usage().kept_prompt_tokens(), 11);  // the whole prompt was prefilled
  EXPECT_EQ(step.delta.usage().exact_prompt_tokens(), 11);
  EXPECT_DOUBLE_EQ(step.delta.timing().draft_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(step.delta.timing().estimated_ttft_saved_seconds(), 0);
}

TEST_F(OutputBuilderTest, FailureIsPassedOn) {
  OutputBuilder builder(*tokenizer_, "r5", {}, 3);
  TokenEvent e = Final(FinishReason::kNone);
  e.status = absl::InternalError("forward failed");
  OutputBuilder::Step step = builder.OnEvent(e);
  EXPECT_TRUE(step.finished);
  EXPECT_EQ(step.status.code(), absl::StatusCode::kInternal);
}

TEST(MergeDeltaTest, AppendsTextAndTokensKeepsFinalFields) {
  v1::GenerateResponse total;
  v1::GenerateResponse a;
  a.set_request_id("x");
  a.set_text("Hel");
  a.add_token_ids(1);
  a.add_logprobs(-1);
  v1::GenerateResponse b;
  b.set_request_id("x");
  b.set_text("lo");
  b.add_token_ids(2);
  b.add_logprobs(-2);
  b.set_finish_reason(v1::STOP);
  b.mutable_usage()->set_completion_tokens(2);
  MergeDelta(a, total);
  MergeDelta(b, total);
  EXPECT_EQ(total.text(), "Hello");
  EXPECT_THAT(total.token_ids(), ElementsAreArray({1, 2}));
  EXPECT_THAT(total.logprobs(), ElementsAreArray({-1.0f, -2.0f}));
  EXPECT_EQ(total.finish_reason(), v1::STOP);
  EXPECT_EQ(total.usage().completion_tokens(), 2);
  EXPECT_EQ(total.request_id(), "x");
}

}  // namespace
}  // namespace ridgeserve
