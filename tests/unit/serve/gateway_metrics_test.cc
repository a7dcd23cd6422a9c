// The gateway's /metrics: the per-group counters (xdeepserve_step_rollbacks_total{group},
// xdeepserve_steps_total{group}, ...) follow each group's cumulative count from its loads
// (hand-derived values across renders), and a group that starts again from 0 is counted on,
// never back; every family typed counter ends in _total and no gauge does; rejected requests
// are counted by reason.
#include "serve/gateway_metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace xds::serve {
namespace {

engine::GroupLoad load(int32_t group, int64_t rollbacks) {
  engine::GroupLoad l;
  l.group = group;
  l.rollbacks = rollbacks;
  return l;
}

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(GatewayMetrics, StepRollbacksArePerGroupCounters) {
  GatewayMetrics m;
  std::vector<engine::GroupLoad> loads = {load(0, 0), load(1, 2)};
  std::string t = m.render(loads);
  EXPECT_TRUE(has_line(t, "# TYPE xdeepserve_step_rollbacks_total counter")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_step_rollbacks_total{group=\"0\"} 0")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_step_rollbacks_total{group=\"1\"} 2")) << t;
  // The same loads again: nothing new.
  t = m.render(loads);
  EXPECT_TRUE(has_line(t, "xdeepserve_step_rollbacks_total{group=\"1\"} 2")) << t;
  // Group 0 rolls a step back; group 1 restarted (its count from 0) and rolled one back.
  loads = {load(0, 1), load(1, 1)};
  t = m.render(loads);
  EXPECT_TRUE(has_line(t, "xdeepserve_step_rollbacks_total{group=\"0\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_step_rollbacks_total{group=\"1\"} 3")) << t;
  loads = {load(0, 1), load(1, 4)};
  t = m.render(loads);
  EXPECT_TRUE(has_line(t, "xdeepserve_step_rollbacks_total{group=\"1\"} 6")) << t;
}

// A load with every cumulative field set, so that each family is rendered.
engine::GroupLoad full_load(int32_t group, int64_t base) {
  engine::GroupLoad l = load(group, base);
  l.running = 2;
  l.waiting = 1;
  l.kv_blocks_used = 3;
  l.kv_blocks_total = 12;
  l.last_batch_size = 2;
  l.prefix_hits = base;
  l.prefix_queries = 2 * base;
  l.preemptions = base;
  l.kv_blocks_retired = base;
  l.steps = 10 * base;
  l.moe_ns = base * 1'000'000'000;
  l.kv_parked = 1;
  l.kv_transfers_done = base;
  l.kv_transfers_expired = base;
  l.kv_pulled_bytes = 4096 * base;
  l.kv_probes_saturated = base;
  l.kv_links_failed = base;
  l.kv_handoffs_recomputed = base;
  l.kv_checksum_mismatches = base;
  l.moe_layers = {1, 2};
  l.n_experts = 2;
  l.expert_tokens = {base, 2 * base, 3 * base, 4 * base};  // [moe_layers, n_experts]
  l.spec_steps = base;
  l.spec_tokens = 2 * base;
  l.spec_drafted = {base};
  l.spec_accepted = {base};
  return l;
}

// family -> type, from the "# TYPE" lines.
std::map<std::string, std::string> types(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string hash, kw, name, type;
    words >> hash >> kw >> name >> type;
    if (hash == "#" && kw == "TYPE") out[name] = type;
  }
  return out;
}

TEST(GatewayMetrics, CumulativeValuesAreCountersEndingInTotal) {
  GatewayMetrics m;
  m.set_instances_state(0, std::vector<size_t>{4});
  std::vector<engine::GroupLoad> loads = {full_load(0, 1), full_load(1, 2)};
  const std::string t = m.render(loads);
  const auto typed = types(t);
  // Each cumulative value of a GroupLoad, by the name a Prometheus user expects.
  for (const char* name : {"xdeepserve_steps_total",
                           "xdeepserve_preemptions_total",
                           "xdeepserve_prefix_cache_hit_blocks_total",
                           "xdeepserve_prefix_cache_query_blocks_total",
                           "xdeepserve_kv_blocks_retired_total",
                           "xdeepserve_moe_seconds_total",
                           "xdeepserve_kv_transfers_completed_total",
                           "xdeepserve_kv_transfers_expired_total",
                           "xdeepserve_kv_pulled_bytes_total",
                           "xdeepserve_kv_probes_saturated_total",
                           "xdeepserve_kv_links_failed_total",
                           "xdeepserve_kv_handoffs_recomputed_total",
                           "xdeepserve_kv_checksum_mismatches_total",
                           "xdeepserve_kv_handoffs_deferred_total",
                           "xdeepserve_expert_routed_tokens_total",
                           "xdeepserve_spec_decode_verify_steps_total",
                           "xdeepserve_spec_decode_step_tokens_total",
                           "xdeepserve_spec_decode_draft_tokens_total",
                           "xdeepserve_spec_decode_accepted_tokens_total",
                           "xdeepserve_requests_rejected_total"}) {
    ASSERT_TRUE(typed.count(name)) << name << " missing in\n" << t;
    EXPECT_EQ(typed.at(name), "counter") << name;
  }
  for (const auto& [name, type] : typed) {
    const bool total = name.ends_with("_total");
    if (type == "counter") {
      EXPECT_TRUE(total) << name << " is a counter without _total";
    } else {
      EXPECT_FALSE(total) << name << " is a " << type << " named _total";
    }
  }
  // Summed over the two groups: 1 + 2, expert (layer 2, expert 1): 4 + 8.
  EXPECT_TRUE(has_line(t, "xdeepserve_steps_total{group=\"1\"} 20")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_moe_seconds_total{group=\"0\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_expert_routed_tokens_total{layer=\"2\",expert=\"1\"} 12"))
      << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_spec_decode_verify_steps_total 3")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_spec_decode_tokens_per_step 2")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_kv_cache_usage_ratio{group=\"0\"} 0.25")) << t;
}

TEST(GatewayMetrics, SummedCountersFollowEachGroupAcrossARestart) {
  GatewayMetrics m;
  std::vector<engine::GroupLoad> loads = {full_load(0, 5), full_load(1, 2)};
  std::string t = m.render(loads);
  EXPECT_TRUE(has_line(t, "xdeepserve_expert_routed_tokens_total{layer=\"1\",expert=\"0\"} 7"))
      << t;
  // Group 0 started again and counted 1; group 1 went on to 3: 7 + 1 + 1.
  loads = {full_load(0, 1), full_load(1, 3)};
  t = m.render(loads);
  EXPECT_TRUE(has_line(t, "xdeepserve_expert_routed_tokens_total{layer=\"1\",expert=\"0\"} 9"))
      << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_steps_total{group=\"0\"} 60")) << t;  // 50, then +10
  EXPECT_TRUE(has_line(t, "xdeepserve_steps_total{group=\"1\"} 30")) << t;
}

TEST(GatewayMetrics, RejectionsAreCountedByReason) {
  EXPECT_EQ(rejection_reason(invalid_api_key()), "unauthorized");
  EXPECT_EQ(rejection_reason(queue_full(1)), "queue_full");
  EXPECT_EQ(rejection_reason(context_length_exceeded("max_tokens", 10, 10, 16)), "context_length");
  EXPECT_EQ(rejection_reason(api_error(400, "bad", "invalid_request_error", "invalid_value")),
            "bad_request");
  EXPECT_EQ(
      rejection_reason(api_error(404, "no such model", "invalid_request_error", "model_not_found")),
      "bad_request");
  EXPECT_EQ(rejection_reason(api_error(503, "stopping", "server_error", "shutting_down")),
            "unavailable");

  GatewayMetrics m;
  std::string t = m.render({});
  // Listed from the first scrape, at 0.
  EXPECT_TRUE(has_line(t, "xdeepserve_requests_rejected_total{reason=\"bad_request\"} 0")) << t;
  m.count_rejected("bad_request");
  m.count_rejected("bad_request");
  m.count_rejected("queue_full");
  m.count_outcome("success");
  t = m.render({});
  EXPECT_TRUE(has_line(t, "xdeepserve_requests_rejected_total{reason=\"bad_request\"} 2")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_requests_rejected_total{reason=\"queue_full\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_requests_total{outcome=\"rejected\"} 3")) << t;
  EXPECT_TRUE(has_line(t, "xdeepserve_requests_total{outcome=\"success\"} 1")) << t;
}

}  // namespace
}  // namespace xds::serve
