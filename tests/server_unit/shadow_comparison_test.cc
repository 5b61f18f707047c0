// CompareDistributions against distributions whose KL is known in closed form.
#include "server/shadow_comparison.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

std::vector<float> Log(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(ShadowComparisonTest, KlOfTwoPointDistributions) {
  // KL((0.5, 0.5) || (0.9, 0.1)) = 0.5 ln(0.5 / 0.9) + 0.5 ln(0.5 / 0.1).
  const ShadowComparison c = CompareDistributions(Log({0.5, 0.5}), Log({0.9, 0.1}));
  EXPECT_NEAR(c.kl, 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(5.0), 1e-6);
  EXPECT_NEAR(c.kl, 0.5108256, 1e-6);
  EXPECT_TRUE(c.top1_agree);  // a tie: both pick the lower id
  // The other direction differs: KL is not symmetric.
  EXPECT_NEAR(CompareDistributions(Log({0.9, 0.1}), Log({0.5, 0.5})).kl,
              0.9 * std::log(1.8) + 0.1 * std::log(0.2), 1e-6);
}

TEST(ShadowComparisonTest, EqualDistributionsHaveNoDivergence) {
  const std::vector<float> p = Log({0.7, 0.2, 0.1});
  const ShadowComparison c = CompareDistributions(p, p);
  EXPECT_EQ(c.kl, 0.0);
  EXPECT_TRUE(c.top1_agree);
}

TEST(ShadowComparisonTest, TopOneDisagreementAndZeroMass) {
  // Exact puts no mass on token 2 (log 0 = -inf): that term is 0, not NaN.
  std::vector<float> exact = Log({0.6, 0.4, 1.0});
  exact[2] = -INFINITY;
  const ShadowComparison c = CompareDistributions(exact, Log({0.3, 0.5, 0.2}));
  EXPECT_NEAR(c.kl, 0.6 * std::log(2.0) + 0.4 * std::log(0.8), 1e-6);
  EXPECT_FALSE(c.top1_agree);
}

}  // namespace
}  // namespace ridgeserve
