// The gateway's per-group rollback counter: xdeepserve_step_rollbacks_total{group} follows
// each group's cumulative count from its loads (hand-derived values across renders), and a
// group that starts again from 0 is counted on, never back.
#include "serve/gateway_metrics.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace xds::serve
