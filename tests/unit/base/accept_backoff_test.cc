// next_accept_delay_ms (base/accept_backoff.h) against the hand-written schedule: 10 ms (or
// the caller's first delay), doubling, capped at 1 s, reset by a success; per-connection
// errors never wait.
#include "base/accept_backoff.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

namespace xds {
namespace {

TEST(AcceptBackoff, ShortagesBackOffTenMillisecondsDoublingToOneSecond) {
  for (int error : {EMFILE, ENFILE, ENOBUFS, ENOMEM}) {
    std::vector<int> delays;
    int d = 0;
    for (int i = 0; i < 10; ++i) delays.push_back(d = next_accept_delay_ms(d, error));
    const std::vector<int> want = {10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000};
    EXPECT_EQ(delays, want) << "errno " << error;
    EXPECT_EQ(next_accept_delay_ms(d, 0), 0);  // a success resets
    EXPECT_EQ(next_accept_delay_ms(0, error), 10);
  }
}

TEST(AcceptBackoff, TheFirstDelayIsTheCallersToo) {
  std::vector<int> delays;
  int d = 0;
  for (int i = 0; i < 6; ++i) delays.push_back(d = next_accept_delay_ms(d, EMFILE, 100));
  const std::vector<int> want = {100, 200, 400, 800, 1000, 1000};
  EXPECT_EQ(delays, want);
  EXPECT_EQ(next_accept_delay_ms(d, 0, 100), 0);
  EXPECT_EQ(next_accept_delay_ms(0, ECONNABORTED, 100), 0);
}

TEST(AcceptBackoff, ErrorsOfOneConnectionRetryAtOnce) {
  for (int error : {0, ECONNABORTED, EINTR, EPROTO, EPERM}) {
    EXPECT_EQ(next_accept_delay_ms(0, error), 0) << error;
    EXPECT_EQ(next_accept_delay_ms(640, error), 0) << error;
  }
}

}  // namespace
}  // namespace xds
