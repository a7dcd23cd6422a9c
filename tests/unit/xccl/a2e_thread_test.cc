// A2E/E2A with trampolines over the thread-backed fabric (label tsan): 2 DP domains of 3
// attention devices and 5 expert devices, checked against a plain reference.
#include <gtest/gtest.h>

#include <cstring>

#include "a2e_reference.h"
#include "xccl/thread_fabric.h"

namespace xds::xccl {
namespace {

TEST(XcclA2eThread, TrampolineThreeAttentionFiveExpertsTwoDomains) {
  for (bool int8 : {false, true}) {
    testing::A2eCase c = testing::a2e_case(int8);
    auto tf = ThreadFabric::create(testing::a2e_arena(c), 4);
    ASSERT_TRUE(tf.ok()) << tf.status().to_string();
    auto st = (*tf)->run([&](Fabric& f) { return testing::run_a2e_device(f, c, nullptr); });
    for (size_t r = 0; r < st.size(); ++r)
      EXPECT_TRUE(st[r].ok()) << "int8 " << int8 << " rank " << r << ": " << st[r].to_string();
  }
}

TEST(XcclA2eThread, PureTopologyChecks) {
  A2eTopology t{{{0, 1}, {2}}, {3, 4}};
  EXPECT_TRUE(validate(t, 5).ok());
  EXPECT_EQ(attention_pos(t, 2).domain, 1);
  EXPECT_EQ(attention_pos(t, 1).index, 1);
  EXPECT_EQ(attention_pos(t, 4).domain, -1);
  A2eTopology too_big{{{0, 1, 2}}, {3, 4}};
  EXPECT_NE(validate(too_big, 5).message().find("domain 0 has 3 attention devices"),
            std::string::npos);
  A2eTopology dup{{{0, 1}}, {1, 2}};
  EXPECT_NE(validate(dup, 5).message().find("rank 1 appears twice"), std::string::npos);
  EXPECT_NE(a2e_key(1, 2, 3, 0, 1), a2e_key(1, 2, 3, 1, 1));
}

}  // namespace
}  // namespace xds::xccl
