// RestartBudget: at most K restarts within any window of T, worked out by hand on a timeline.
#include "serve/restart_budget.h"

#include <gtest/gtest.h>

namespace xds::serve {
namespace {

constexpr int64_t kS = 1'000'000'000;

TEST(RestartBudget, AllowsKRestartsPerWindowAndForgetsOldOnes) {
  RestartBudget b(/*max_restarts=*/2, /*window_ns=*/60 * kS);
  EXPECT_TRUE(b.allows(0));
  b.restarted(10 * kS);
  EXPECT_TRUE(b.allows(11 * kS));
  b.restarted(20 * kS);
  EXPECT_FALSE(b.allows(21 * kS));  // two in the last minute
  EXPECT_FALSE(b.allows(69 * kS));  // the first is 59 s old
  EXPECT_TRUE(b.allows(70 * kS));   // the first is 60 s old: out of the window
  b.restarted(70 * kS);
  EXPECT_FALSE(b.allows(79 * kS));  // 20 s and 70 s
  EXPECT_TRUE(b.allows(80 * kS));
  EXPECT_EQ(b.total(), 3);
}

TEST(RestartBudget, ZeroRestartsNeverAllows) {
  RestartBudget b(0, 60 * kS);
  EXPECT_FALSE(b.allows(0));
  EXPECT_FALSE(b.allows(1000 * kS));
}

}  // namespace
}  // namespace xds::serve
