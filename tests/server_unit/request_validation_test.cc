// Request validation on the default model's tokenizer and config: every documented limit is
// refused with the right code and a message naming the field, and a good request becomes the
// engine request the documentation promises (defaults, chat template, context clamp).
#include "server/request_validation.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server_unit/smollm2_fixture.h"

namespace ridgeserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RequestValidationTest : public SmolLM2Test {
 protected:
  static v1::GenerateRequest Text(const std::string& text) {
    v1::GenerateRequest r;
    r.set_text(text);
    return r;
  }
  absl::StatusOr<ValidatedRequest> Validate(const v1::GenerateRequest& r,
                                            const ServerOptions& options = {}) {
    return ValidateGenerateRequest(r, *tokenizer_, *config_, options);
  }
  // The request is refused with `code` and a message containing `field`.
  void ExpectRefused(const v1::GenerateRequest& r, absl::StatusCode code, const std::string& field,
                     const ServerOptions& options = {}) {
    absl::StatusOr<ValidatedRequest> v = Validate(r, options);
    ASSERT_FALSE(v.ok()) << "accepted; expected " << field;
    EXPECT_EQ(v.status().code(), code) << v.status();
    EXPECT_THAT(std::string(v.status().message()), HasSubstr(field));
  }
  // `r` (SPEC_PC or SPEC_KV) with a budget below min_budget or a lookahead outside
  // [1, kSpecPcMaxLookahead] in `b` (its prefill.spec_pc or .spec_kv, named `field`): refused
  // with INVALID_ARGUMENT naming the field.
  void ExpectOutOfRangeRefused(const v1::GenerateRequest& r, v1::BudgetOptions& b,
                               const std::string& field, int32_t min_budget,
                               const ServerOptions& options) {
    for (const auto& [budget, lookahead, name] :
         {std::tuple{min_budget - 1, 1, "budget"}, std::tuple{0, 1, "budget"},
          std::tuple{128, 0, "lookahead_tokens"},
          std::tuple{128, kSpecPcMaxLookahead + 1, "lookahead_tokens"}}) {
      SCOPED_TRACE(absl::StrCat("budget ", budget, ", lookahead ", lookahead));
      b.set_budget(budget);
      b.set_lookahead_tokens(lookahead);
      ExpectRefused(r, absl::StatusCode::kInvalidArgument, absl::StrCat(field, ".", name), options);
    }
  }
};

TEST_F(RequestValidationTest, TextWithDefaults) {
  absl::StatusOr<ValidatedRequest> v = Validate(Text("Hello world"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.prompt, tokenizer_->Encode("Hello world", true, true));
  EXPECT_EQ(v->engine.max_new_tokens, kDefaultMaxNewTokens);
  EXPECT_EQ(v->engine.sampling.temperature, 1.0f);
  EXPECT_EQ(v->engine.sampling.top_p, 1.0f);
  EXPECT_FALSE(v->engine.sampling.has_seed);
  EXPECT_FALSE(v->engine.sampling.logprobs);
  EXPECT_TRUE(v->stop.empty());
  EXPECT_EQ(v->request_id, "");
}

TEST_F(RequestValidationTest, SamplingFieldsAreCarried) {
  v1::GenerateRequest r = Text("Hi");
  r.set_request_id("abc");
  r.set_priority(-3);
  v1::SamplingParams& s = *r.mutable_sampling();
  s.set_temperature(0);
  s.set_top_p(0.5f);
  s.set_top_k(7);
  s.set_min_p(0.1f);
  s.set_repetition_penalty(1.2f);
  s.set_seed(42);
  s.set_max_new_tokens(9);
  s.add_stop("\n\n");
  s.add_stop_token_ids(2);
  s.set_ignore_eos(true);
  s.set_logprobs(true);
  absl::StatusOr<ValidatedRequest> v = Validate(r);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->request_id, "abc");
  EXPECT_EQ(v->engine.priority, -3);
  EXPECT_EQ(v->engine.sampling.temperature, 0.0f);
  EXPECT_EQ(v->engine.sampling.top_p, 0.5f);
  EXPECT_EQ(v->engine.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(v->engine.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(v->engine.sampling.repetition_penalty, 1.2f);
  EXPECT_TRUE(v->engine.sampling.has_seed);
  EXPECT_EQ(v->engine.sampling.seed, 42u);
  EXPECT_EQ(v->engine.max_new_tokens, 9);
  EXPECT_THAT(v->stop, ElementsAre("\n\n"));
  EXPECT_THAT(v->engine.sampling.stop_token_ids, ElementsAre(2));
  EXPECT_TRUE(v->engine.sampling.ignore_eos);
  EXPECT_TRUE(v->engine.sampling.logprobs);
}

TEST_F(RequestValidationTest, ChatUsesTheTemplateWithGenerationPrompt) {
  v1::GenerateRequest r;
  v1::ChatMessage& m = *r.mutable_chat()->add_messages();
  m.set_role("user");
  m.set_content("What is the capital of France?");
  absl::StatusOr<ValidatedRequest> v = Validate(r);
  ASSERT_TRUE(v.ok()) << v.status();
  const std::vector<ChatMessage> messages = {{"user", "What is the capital of France?"}};
  const std::string prompt = tokenizer_->ApplyChatTemplate(messages, true);
  EXPECT_THAT(prompt, HasSubstr("<|im_start|>assistant\n"));
  EXPECT_EQ(v->engine.prompt, tokenizer_->Encode(prompt, false, true));
}

TEST_F(RequestValidationTest, TokenIdsAreTakenAsTheyAre) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  r.mutable_token_ids()->add_ids(49151);
  absl::StatusOr<ValidatedRequest> v = Validate(r);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->engine.prompt, ElementsAre(1, 49151));
}

TEST_F(RequestValidationTest, BadSamplingNamesTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::function<void(v1::SamplingParams&)> set;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& s) { s.set_temperature(-1); }, "sampling.temperature"},
      {[&](auto& s) { s.set_temperature(nan); }, "sampling.temperature"},
      {[&](auto& s) { s.set_temperature(inf); }, "sampling.temperature"},
      {[](auto& s) { s.set_top_p(1.5f); }, "sampling.top_p"},
      {[](auto& s) { s.set_top_p(0); }, "sampling.top_p"},
      {[&](auto& s) { s.set_top_p(nan); }, "sampling.top_p"},
      {[](auto& s) { s.set_top_k(-1); }, "sampling.top_k"},
      {[](auto& s) { s.set_min_p(-0.1f); }, "sampling.min_p"},
      {[](auto& s) { s.set_min_p(1.5f); }, "sampling.min_p"},
      {[](auto& s) { s.set_repetition_penalty(0); }, "sampling.repetition_penalty"},
      {[&](auto& s) { s.set_repetition_penalty(inf); }, "sampling.repetition_penalty"},
      {[](auto& s) { s.set_max_new_tokens(0); }, "sampling.max_new_tokens"},
      {[](auto& s) { s.set_max_new_tokens(-5); }, "sampling.max_new_tokens"},
      {[](auto& s) { s.set_max_new_tokens(1000000000); }, "sampling.max_new_tokens"},
      {[](auto& s) { s.set_max_new_tokens(kMaxNewTokensLimit + 1); }, "sampling.max_new_tokens"},
      {[](auto& s) {
         for (int i = 0; i < 17; ++i) s.add_stop(std::string(1, 'x'));
       },
       "sampling.stop"},
      {[](auto& s) { s.add_stop(""); }, "sampling.stop[0]"},
      {[](auto& s) {
         s.add_stop("ok");
         s.add_stop(std::string(257, 'a'));
       },
       "sampling.stop[1]"},
      {[](auto& s) { s.add_stop_token_ids(49152); }, "sampling.stop_token_ids[0]"},
      {[](auto& s) {
         s.add_stop_token_ids(3);
         s.add_stop_token_ids(-1);
       },
       "sampling.stop_token_ids[1]"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Text("Hi");
    c.set(*r.mutable_sampling());
    SCOPED_TRACE(r.sampling().ShortDebugString());
    ExpectRefused(r, absl::StatusCode::kInvalidArgument, c.field);
  }
}

TEST_F(RequestValidationTest, LimitsThemselvesAreAccepted) {
  v1::GenerateRequest r = Text("Hi");
  v1::SamplingParams& s = *r.mutable_sampling();
  s.set_temperature(0);
  s.set_top_p(1);
  s.set_min_p(1);
  s.set_top_k(0);
  for (int i = 0; i < kMaxStopStrings; ++i) s.add_stop(std::string(kMaxStopStringBytes, 'a'));
  r.set_request_id(std::string(kMaxRequestIdBytes, 'r'));
  EXPECT_TRUE(Validate(r).ok()) << Validate(r).status();
}

TEST_F(RequestValidationTest, BadInputNamesTheField) {
  ExpectRefused(v1::GenerateRequest(), absl::StatusCode::kInvalidArgument, "input");
  ExpectRefused(Text(""), absl::StatusCode::kInvalidArgument, "text");

  v1::GenerateRequest ids;
  ids.mutable_token_ids();
  ExpectRefused(ids, absl::StatusCode::kInvalidArgument, "token_ids.ids");
  ids.mutable_token_ids()->add_ids(5);
  ids.mutable_token_ids()->add_ids(49152);
  ExpectRefused(ids, absl::StatusCode::kInvalidArgument, "token_ids.ids[1]");

  v1::GenerateRequest chat;
  chat.mutable_chat();
  ExpectRefused(chat, absl::StatusCode::kInvalidArgument, "chat.messages");
  v1::ChatMessage& m = *chat.mutable_chat()->add_messages();
  m.set_role("user");
  m.set_content("hi");
  v1::ChatMessage& bad = *chat.mutable_chat()->add_messages();
  bad.set_role("tool");
  ExpectRefused(chat, absl::StatusCode::kInvalidArgument, "chat.messages[1].role");

  v1::GenerateRequest long_id = Text("hi");
  long_id.set_request_id(std::string(kMaxRequestIdBytes + 1, 'r'));
  ExpectRefused(long_id, absl::StatusCode::kInvalidArgument, "request_id");
}

TEST_F(RequestValidationTest, PromptOverTheContextIsOutOfRange) {
  const int32_t context = config_->context_length;
  v1::GenerateRequest r;
  for (int i = 0; i < context; ++i) r.mutable_token_ids()->add_ids(100);
  ExpectRefused(r, absl::StatusCode::kOutOfRange, "context");

  // Room for exactly max_new_tokens: accepted; one more: refused.
  v1::GenerateRequest fits;
  for (int i = 0; i < context - 10; ++i) fits.mutable_token_ids()->add_ids(100);
  fits.mutable_sampling()->set_max_new_tokens(10);
  EXPECT_TRUE(Validate(fits).ok());
  fits.mutable_sampling()->set_max_new_tokens(11);
  ExpectRefused(fits, absl::StatusCode::kOutOfRange, "sampling.max_new_tokens");

  // Unset max_new_tokens shrinks to what the context has left.
  fits.mutable_sampling()->clear_max_new_tokens();
  absl::StatusOr<ValidatedRequest> v = Validate(fits);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.max_new_tokens, 10);
}

TEST_F(RequestValidationTest, PrefillModes) {
  v1::GenerateRequest r = Text("Hi");
  r.mutable_prefill()->set_mode(v1::PrefillOptions::RIDGEFILL);
  ExpectRefused(r, absl::StatusCode::kFailedPrecondition, "no RidgeFill maps loaded");
  r.mutable_prefill()->set_mode(v1::PrefillOptions::SPEC_PC);
  ExpectRefused(r, absl::StatusCode::kFailedPrecondition, "no draft model loaded");
  r.mutable_prefill()->set_mode(v1::PrefillOptions::SPEC_KV);
  ExpectRefused(r, absl::StatusCode::kFailedPrecondition, "no draft model loaded");
  ExpectRefused(r, absl::StatusCode::kFailedPrecondition, "SPEC_KV");
  r.mutable_prefill()->set_mode(static_cast<v1::PrefillOptions::Mode>(9));
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "prefill.mode");

  v1::GenerateRequest tail = Text("Hi");
  tail.mutable_prefill()->mutable_ridgefill()->set_exact_tail_tokens(-1);
  ExpectRefused(tail, absl::StatusCode::kInvalidArgument, "prefill.ridgefill.exact_tail_tokens");
  v1::GenerateRequest span = Text("Hi");
  v1::Span& s = *span.mutable_prefill()->mutable_ridgefill()->add_exact_spans();
  s.set_begin(5);
  s.set_end(2);
  ExpectRefused(span, absl::StatusCode::kInvalidArgument, "prefill.ridgefill.exact_spans[0]");
  v1::GenerateRequest budget = Text("Hi");
  budget.mutable_prefill()->mutable_spec_kv()->set_budget(0);
  ExpectRefused(budget, absl::StatusCode::kInvalidArgument, "prefill.spec_kv.budget");

  v1::GenerateRequest exact = Text("Hi");
  exact.mutable_prefill()->set_mode(v1::PrefillOptions::EXACT);
  EXPECT_TRUE(Validate(exact).ok());
}

TEST_F(RequestValidationTest, SpecPcWithADraftModel) {
  ServerOptions options;
  options.has_draft_model = true;
  options.spec_pc_budget = 512;
  options.spec_pc_lookahead_tokens = 3;
  v1::GenerateRequest r = Text("Hello world");
  r.mutable_prefill()->set_mode(v1::PrefillOptions::SPEC_PC);
  // Unset fields: the server's defaults.
  absl::StatusOr<ValidatedRequest> v = Validate(r, options);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.spec_pc.budget, 512);
  EXPECT_EQ(v->engine.spec_pc.lookahead_tokens, 3);
  // The request's own, at the limits.
  v1::BudgetOptions& b = *r.mutable_prefill()->mutable_spec_pc();
  b.set_budget(kSpecPcMinBudget);
  b.set_lookahead_tokens(kSpecPcMaxLookahead);
  v = Validate(r, options);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.spec_pc.budget, kSpecPcMinBudget);
  EXPECT_EQ(v->engine.spec_pc.lookahead_tokens, kSpecPcMaxLookahead);
  b.set_lookahead_tokens(1);
  v = Validate(r, options);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.spec_pc.lookahead_tokens, 1);

  // Out of range: INVALID_ARGUMENT naming the field.
  ExpectOutOfRangeRefused(r, b, "prefill.spec_pc", kSpecPcMinBudget, options);

  // Other modes carry no SpecPC budget.
  r.mutable_prefill()->clear_spec_pc();
  r.mutable_prefill()->set_mode(v1::PrefillOptions::EXACT);
  v = Validate(r, options);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.spec_pc.budget, 0);
  EXPECT_EQ(v->engine.spec_kv.budget, 0);
}

TEST_F(RequestValidationTest, SpecKvWithADraftModel) {
  ServerOptions options;
  options.has_draft_model = true;
  options.spec_kv_budget = 256;
  options.spec_kv_lookahead_tokens = 16;
  v1::GenerateRequest r = Text("Hello world");
  r.mutable_prefill()->set_mode(v1::PrefillOptions::SPEC_KV);
  // Unset fields: the server's defaults; no SpecPC budget.
  absl::StatusOr<ValidatedRequest> v = Validate(r, options);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->engine.spec_kv.budget, 256);
  EXPECT_EQ(v->engine.spec_kv.lookahead_tokens, 16);
  EXPECT_EQ(v->engine.spec_pc.budget, 0);
  // The request's own, at the limits (the engine's: kSpecKvMinBudget, kSpecPcMaxLookahead).
  v1::BudgetOptions& b = *r.mutable_prefill()->mutable_spec_kv();
  for (const int32_t lookahead : {1, kSpecPcMaxLookahead}) {
    b.set_budget(kSpecKvMinBudget);
    b.set_lookahead_tokens(lookahead);
    v = Validate(r, options);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->engine.spec_kv.budget, kSpecKvMinBudget);
    EXPECT_EQ(v->engine.spec_kv.lookahead_tokens, lookahead);
  }

  // Out of range: INVALID_ARGUMENT naming the field.
  ExpectOutOfRangeRefused(r, b, "prefill.spec_kv", kSpecKvMinBudget, options);

  // Without a draft: FAILED_PRECONDITION naming the flag.
  b.set_budget(128);
  b.set_lookahead_tokens(8);
  options.has_draft_model = false;
  ExpectRefused(r, absl::StatusCode::kFailedPrecondition, "--draft_model", options);
}

TEST_F(RequestValidationTest, TokenizeInput) {
  v1::TokenizeRequest r;
  EXPECT_EQ(TokenizeRequestInput(r, *tokenizer_).status().code(),
            absl::StatusCode::kInvalidArgument);
  r.set_text("Hello <|im_end|>");
  absl::StatusOr<std::vector<int32_t>> ids = TokenizeRequestInput(r, *tokenizer_);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, tokenizer_->Encode("Hello <|im_end|>", false, true));
  EXPECT_EQ(ids->back(), 2);  // <|im_end|> parsed as the special token
}

}  // namespace
}  // namespace ridgeserve
