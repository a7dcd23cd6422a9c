// The A/E schedules against hand-derived layouts (engine/ae_schedule.h).
#include "engine/ae_schedule.h"

#include <gtest/gtest.h>

namespace xds::engine {
namespace {

TEST(AeSchedule, ValidShapesAndTheirRefusals) {
  EXPECT_TRUE(validate_ae_shape({2, 3, 1, 1}).ok());
  EXPECT_TRUE(validate_ae_shape({4, 2, 2, 2}).ok());
  // 3 groups in one domain need 3 trampolines.
  const Status few = validate_ae_shape({3, 2, 1, 1});
  EXPECT_FALSE(few.ok());
  EXPECT_NE(few.message().find("--expert-devices is 2"), std::string::npos) << few.message();
  EXPECT_NE(validate_ae_shape({2, 2, 3, 1}).message().find("--dp-domains"), std::string::npos);
  EXPECT_NE(validate_ae_shape({2, 2, 1, 0}).message().find("--microbatches"), std::string::npos);
  EXPECT_NE(validate_ae_shape({2, 2, 1, 17}).message().find("--microbatches"), std::string::npos);
  EXPECT_NE(validate_ae_shape({0, 2, 1, 1}).message().find("--attention-dp"), std::string::npos);
  EXPECT_NE(validate_ae_shape({1, 0, 1, 1}).message().find("--expert-devices"), std::string::npos);
}

TEST(AeSchedule, DomainsAreConsecutiveRanksLargerFirst) {
  // 5 groups in 2 domains: {0, 1, 2} and {3, 4}; experts 5, 6, 7.
  const AeShape s{5, 3, 2, 1};
  EXPECT_EQ(ae_domain_starts(s), (std::vector<int>{0, 3, 5}));
  EXPECT_EQ(ae_world_size(s), 8);
  const int want_domain[] = {0, 0, 0, 1, 1, -1, -1, -1};
  const int want_tramp[] = {5, 6, 7, 5, 6, -1, -1, -1};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(ae_domain_of(s, r), want_domain[r]) << r;
    EXPECT_EQ(ae_trampoline_of(s, r), want_tramp[r]) << r;
    EXPECT_EQ(ae_is_expert_rank(s, r), r >= 5) << r;
  }
  const xccl::A2eTopology t = ae_topology(s);
  EXPECT_EQ(t.domains, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}}));
  EXPECT_EQ(t.experts, (std::vector<int>{5, 6, 7}));
  EXPECT_TRUE(xccl::validate(t, ae_world_size(s)).ok());
  // The trampoline a2e.h pairs with position i is experts[i]: the same as ae_trampoline_of.
  for (int r = 0; r < 5; ++r) {
    const xccl::AttentionPos p = xccl::attention_pos(t, r);
    EXPECT_EQ(t.experts[size_t(p.index)], ae_trampoline_of(s, r));
  }
}

TEST(AeSchedule, MicrobatchBoundsSplitEvenlyLargerFirst) {
  EXPECT_EQ(microbatch_bounds(10, 1), (std::vector<int64_t>{0, 10}));
  EXPECT_EQ(microbatch_bounds(10, 2), (std::vector<int64_t>{0, 5, 10}));
  EXPECT_EQ(microbatch_bounds(7, 2), (std::vector<int64_t>{0, 4, 7}));
  EXPECT_EQ(microbatch_bounds(7, 3), (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(microbatch_bounds(1, 2), (std::vector<int64_t>{0, 1, 1}));  // one empty turn
  EXPECT_EQ(microbatch_bounds(0, 2), (std::vector<int64_t>{0, 0, 0}));
}

TEST(AeSchedule, ExpertTurnsGoLayerThenDomainThenMicrobatch) {
  // P110's figure with 2 domains and 2 microbatches, over 2 MoE layers.
  const std::vector<AeTurn> t = ae_expert_turns(2, 2, 2);
  const std::vector<AeTurn> want = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                                    {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
  EXPECT_EQ(t, want);
  // One domain exchanges at a time: between two turns of domain d for layer l there is no
  // turn of another domain for the same layer.
  EXPECT_EQ(ae_expert_turns(3, 1, 1).size(), 3u);
  EXPECT_TRUE(ae_expert_turns(0, 2, 2).empty());
  EXPECT_EQ(ae_round_code(1, 2), 0x12);
  EXPECT_EQ(ae_round_code(0, 0), 0);
}

}  // namespace
}  // namespace xds::engine
