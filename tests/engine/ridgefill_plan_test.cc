// Which prompt rows a RidgeFill request fills: the rule in DESIGN.md, row by row.
#include "engine/ridgefill/ridgefill_plan.h"

#include <numeric>

#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

std::vector<int32_t> Prompt(int32_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 100);
  return p;
}

bool NoSpecials(int32_t) { return false; }

TEST(RidgeFillPlanTest, FillsBetweenSinksAndTail) {
  RidgeFillPlanOptions options;
  options.exact_tail_tokens = 3;
  options.sink_tokens = 2;
  auto filled = PlanRidgeFillRows(Prompt(10), options, NoSpecials);
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_EQ(*filled, (std::vector<uint8_t>{0, 0, 1, 1, 1, 1, 1, 0, 0, 0}));
}

TEST(RidgeFillPlanTest, LastRowAlwaysExactEvenWithZeroTail) {
  RidgeFillPlanOptions options;
  options.exact_tail_tokens = 0;
  options.sink_tokens = 0;
  auto filled = PlanRidgeFillRows(Prompt(5), options, NoSpecials);
  ASSERT_TRUE(filled.ok());
  EXPECT_EQ(*filled, (std::vector<uint8_t>{1, 1, 1, 1, 0}));
}

TEST(RidgeFillPlanTest, TailAsLongAsPromptFillsNothing) {
  RidgeFillPlanOptions options;
  options.exact_tail_tokens = 8;
  options.sink_tokens = 0;
  for (int32_t n : {1, 7, 8}) {
    auto filled = PlanRidgeFillRows(Prompt(n), options, NoSpecials);
    ASSERT_TRUE(filled.ok());
    EXPECT_EQ(*filled, std::vector<uint8_t>(n, 0)) << n;
  }
}

TEST(RidgeFillPlanTest, SpecialTokensSpansAndShortPromptsStayExact) {
  RidgeFillPlanOptions options;
  options.exact_tail_tokens = 1;
  options.sink_tokens = 1;
  const std::vector<std::pair<int32_t, int32_t>> spans = {{3, 5}, {4, 6}, {7, 7}};
  options.exact_spans = spans;
  auto special = [](int32_t token) { return token == 108; };  // position 8
  auto filled = PlanRidgeFillRows(Prompt(10), options, special);
  ASSERT_TRUE(filled.ok());
  EXPECT_EQ(*filled, (std::vector<uint8_t>{0, 1, 1, 0, 0, 0, 1, 1, 0, 0}));
  options.min_prompt_tokens = 11;
  filled = PlanRidgeFillRows(Prompt(10), options, special);
  ASSERT_TRUE(filled.ok());
  EXPECT_EQ(*filled, std::vector<uint8_t>(10, 0));
}

TEST(RidgeFillPlanTest, RejectsBadParameters) {
  RidgeFillPlanOptions options;
  options.exact_tail_tokens = -1;
  EXPECT_EQ(PlanRidgeFillRows(Prompt(10), options, NoSpecials).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.exact_tail_tokens = 0;
  for (auto span : {std::pair{-1, 2}, std::pair{5, 4}, std::pair{3, 11}}) {
    const std::vector<std::pair<int32_t, int32_t>> spans = {span};
    options.exact_spans = spans;
    const auto result = PlanRidgeFillRows(Prompt(10), options, NoSpecials);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(result.status().message().find("exact_spans[0]"), std::string::npos);
  }
}

TEST(RidgeFillPlanTest, CacheSaltsDifferBySplitAndMapsAndNeverZero) {
  EXPECT_NE(RidgeFillCacheSalt(14, 1), RidgeFillCacheSalt(22, 1));
  EXPECT_NE(RidgeFillCacheSalt(14, 1), RidgeFillCacheSalt(14, 2));
  EXPECT_NE(RidgeFillCacheSalt(14, 1), 0u);
}

}  // namespace
}  // namespace ridgeserve
