#include "loadgen/server_metrics.h"

#include <gtest/gtest.h>

namespace xds::loadgen {
namespace {

constexpr const char* kText =
    "# HELP xdeepserve_steps_total Forward steps run.\n"
    "xdeepserve_steps_total{group=\"0\"} 142\n"
    "xdeepserve_spec_decode_verify_steps_total 10\n"
    "xdeepserve_spec_decode_step_tokens_total 23\n"
    "xdeepserve_spec_decode_tokens_per_step 2.3\n"
    "xdeepserve_spec_decode_draft_tokens_total{position=\"2\"} 9\n"
    "xdeepserve_spec_decode_draft_tokens_total{position=\"1\"} 10\n"
    "xdeepserve_spec_decode_accepted_tokens_total{position=\"1\"} 8\n"
    "xdeepserve_spec_decode_accepted_tokens_total{position=\"2\"} 5\n"
    "xdeepserve_spec_decode_acceptance_rate{position=\"1\"} 0.8\n";

TEST(ServerMetrics, ReadsTheSpecCountersByPosition) {
  const auto c = parse_spec_counters(kText);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->present());
  EXPECT_EQ(c->verify_steps, 10);
  EXPECT_EQ(c->step_tokens, 23);
  EXPECT_EQ(c->drafted, (std::vector<double>{10, 9}));
  EXPECT_EQ(c->accepted, (std::vector<double>{8, 5}));
}

TEST(ServerMetrics, NoSpecCountersWhenTheServerDoesNotSpeculate) {
  const auto c = parse_spec_counters("xdeepserve_steps_total{group=\"0\"} 142\n");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->present());
}

TEST(ServerMetrics, AMalformedSampleIsAnErrorNamingTheLine) {
  const auto bad = parse_spec_counters("xdeepserve_spec_decode_verify_steps_total ten\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("verify_steps_total ten"), std::string::npos);
  EXPECT_FALSE(
      parse_spec_counters("xdeepserve_spec_decode_draft_tokens_total{position=\"0\"} 1\n").ok());
}

TEST(ServerMetrics, TheRunsDifferenceGivesAcceptanceAndTokensPerStep) {
  SpecCounters before;
  before.verify_steps = 4;
  before.step_tokens = 8;
  before.drafted = {4, 4};
  before.accepted = {3, 1};
  const SpecCounters d = spec_difference(parse_spec_counters(kText).value(), before);
  EXPECT_EQ(d.verify_steps, 6);
  EXPECT_EQ(d.drafted, (std::vector<double>{6, 5}));
  EXPECT_EQ(d.accepted, (std::vector<double>{5, 4}));
  const nlohmann::json j = spec_json(d);
  EXPECT_DOUBLE_EQ(j["tokens_per_step"].get<double>(), 15.0 / 6.0);  // (23 - 8) / (10 - 4)
  EXPECT_DOUBLE_EQ(j["acceptance"][0].get<double>(), 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(j["acceptance"][1].get<double>(), 4.0 / 5.0);
  EXPECT_EQ(spec_line(d),
            "speculative  6 verify steps, 2.500 tokens/step, acceptance by position 0.833 0.800\n");
}

}  // namespace
}  // namespace xds::loadgen
