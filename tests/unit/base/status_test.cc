#include "base/status.h"

#include <gtest/gtest.h>

namespace xds {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value must be > 0, got {}", v);
  return v;
}

Result<int> doubled(int v) {
  XDS_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = not_found("tensor '{}' missing", "a.b");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "NotFound: tensor 'a.b' missing");
  EXPECT_EQ(s.with_context("model.safetensors").message(),
            "model.safetensors: tensor 'a.b' missing");
}

// A step attempt every device gave up (retry it) is not a poisoned epoch (Aborted).
TEST(Status, AbandonedIsItsOwnCode) {
  const Status s = abandoned("step {} attempt {} abandoned", 4, 0);
  EXPECT_EQ(s.code(), StatusCode::kAbandoned);
  EXPECT_NE(s.code(), aborted("x").code());
  EXPECT_EQ(s.to_string(), "Abandoned: step 4 attempt 0 abandoned");
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(doubled(4).value(), 8);
  auto r = doubled(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "value must be > 0, got -1");
}

}  // namespace
}  // namespace xds
