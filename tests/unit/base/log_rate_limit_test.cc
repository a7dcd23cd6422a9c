// LogRateLimiter (base/log_rate_limit.h) as a pure policy, with the clock injected: counts
// printed and suppressed per call site against hand-derived values.
#include "base/log_rate_limit.h"

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

namespace xds {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr std::string_view kAccept = "http: accept failed: {}";
constexpr std::string_view kOther = "link {} refused";

using Summaries = std::vector<LogRateLimiter::Summary>;

TEST(LogRateLimiter, TheFirstNOfAWindowPrintAndTheRestAreCountedThenSummarisedOnce) {
  LogRateLimiter limiter(/*per_window=*/3, kSecond);
  Summaries out;
  int printed = 0;
  // 1,000 messages within the first 0.5 s: 3 print.
  for (int i = 0; i < 1000; ++i) printed += limiter.admit(kAccept, 2, i * 500'000, out);
  EXPECT_EQ(printed, 3);
  EXPECT_TRUE(out.empty());  // the window has not ended: nothing to report yet
  // Another key in the same window is not affected.
  EXPECT_TRUE(limiter.admit(kOther, 1, kSecond / 2, out));
  EXPECT_TRUE(out.empty());
  // The next message after the window: the summary of 997 first, then it prints.
  EXPECT_TRUE(limiter.admit(kAccept, 2, kSecond + 1, out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].format, kAccept);
  EXPECT_EQ(out[0].suppressed, 997u);
  EXPECT_EQ(out[0].tag, 2);
  out.clear();
  // Reported once only.
  limiter.flush(10 * kSecond, out);
  EXPECT_TRUE(out.empty());
}

TEST(LogRateLimiter, AnotherKeysMessageOrFlushReportsAnEndedWindow) {
  LogRateLimiter limiter(/*per_window=*/1, kSecond);
  Summaries out;
  EXPECT_TRUE(limiter.admit(kAccept, 3, 0, out));
  EXPECT_FALSE(limiter.admit(kAccept, 3, 1, out));
  EXPECT_FALSE(limiter.admit(kAccept, 3, 2, out));
  limiter.flush(kSecond - 1, out);  // not over yet
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(limiter.admit(kOther, 1, kSecond, out));  // a different site logs later
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].format, kAccept);
  EXPECT_EQ(out[0].suppressed, 2u);
  out.clear();
  EXPECT_FALSE(limiter.admit(kOther, 1, kSecond + 5, out));
  limiter.flush(2 * kSecond, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].format, kOther);
  EXPECT_EQ(out[0].suppressed, 1u);
}

// A steady flood of 1,000 messages a second for 10 s prints per_window a second: 10 windows.
TEST(LogRateLimiter, ASteadyFloodPrintsPerWindowEachSecond) {
  LogRateLimiter limiter(/*per_window=*/20, kSecond);
  Summaries out;
  int printed = 0;
  for (int64_t t = 0; t < 10 * kSecond; t += kSecond / 1000)
    printed += limiter.admit(kAccept, 2, t, out);
  EXPECT_EQ(printed, 10 * 20);
  ASSERT_EQ(out.size(), 9u);  // the tenth window's summary is still pending
  for (const auto& s : out) EXPECT_EQ(s.suppressed, 980u);
}

// Keys are call sites: the same text at another address is another key.
TEST(LogRateLimiter, KeysAreTheFormatsAddress) {
  LogRateLimiter limiter(/*per_window=*/1, kSecond);
  Summaries out;
  const char a[] = "same text {}";
  const char b[] = "same text {}";
  EXPECT_TRUE(limiter.admit(std::string_view(a), 0, 0, out));
  EXPECT_TRUE(limiter.admit(std::string_view(b), 0, 0, out));
  EXPECT_FALSE(limiter.admit(std::string_view(a), 0, 0, out));
}

}  // namespace
}  // namespace xds
