#include "base/process_name.h"

#include <pthread.h>

#include <thread>

#include <gtest/gtest.h>

namespace xds {
namespace {

TEST(ProcessName, OneInstanceKeepsTheShortNames) {
  EXPECT_EQ(process_name("gateway"), "xds-gateway");
  EXPECT_EQ(process_name("shell"), "xds-shell");
  EXPECT_EQ(process_name("dp", -1, 0), "xds-dp0");
  EXPECT_EQ(process_name("out", -1, 3), "xds-out3");
}

TEST(ProcessName, SeveralInstancesCarryTheIndex) {
  EXPECT_EQ(process_name("dp", 1, 0), "xds-1-dp0");
  EXPECT_EQ(process_name("out", 12, 7), "xds-12-out7");
  EXPECT_EQ(process_name("shell", 3), "xds-3-shell");
}

TEST(ProcessName, CutToFifteenBytes) {
  // "xds-123-out1234" is exactly 15 bytes; one more digit is cut.
  EXPECT_EQ(process_name("out", 123, 1234), "xds-123-out1234");
  EXPECT_EQ(process_name("out", 123, 12345), "xds-123-out1234");
  EXPECT_EQ(process_name("gateway", 99999), "xds-99999-gatew");
}

TEST(ProcessName, SetNamesTheCallingThread) {
  std::thread t([] {
    set_process_name(process_name("dp", 2, 5));
    char buf[32] = {};
    ASSERT_EQ(pthread_getname_np(pthread_self(), buf, sizeof buf), 0);
    EXPECT_STREQ(buf, "xds-2-dp5");
  });
  t.join();
}

}  // namespace
}  // namespace xds
