// The /admin/faults schema: every kind parses into the spec written out by hand, every wrong
// field is refused naming it, and the fault log attributes what it sees to the faults of the
// instance it happened on.
#include "serve/fault_injection.h"

#include <gtest/gtest.h>

namespace xds::serve {
namespace {

using protocol::FaultKind;

TEST(FaultInjection, ParsesEveryKindWithItsFields) {
  auto k = parse_fault(R"({"kind": "kill", "instance": 1, "group": 2, "after_steps": 5})", 2);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(k->kind, FaultKind::kKill);
  EXPECT_EQ(k->instance, 1);
  EXPECT_EQ(k->group, 2);
  EXPECT_EQ(k->after_steps, 5);
  auto d = parse_fault(R"({"kind": "link_delay", "duration_ms": 700})", 1);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->kind, FaultKind::kLinkDelay);
  EXPECT_EQ(d->instance, 0);
  EXPECT_EQ(d->after_steps, 0);
  EXPECT_EQ(d->duration_ms, 700);
  auto r = parse_fault(R"({"kind": "retire_kv_blocks", "blocks": 3})", 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->blocks, 3);
  auto c = parse_fault(R"({"kind": "kv_corrupt", "group": 1})", 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->kind, FaultKind::kKvCorrupt);
  EXPECT_EQ(c->blocks, 1);  // the default
  EXPECT_EQ(fault_json(*c)["blocks"], 1);
  for (const char* kind : {"hang", "exchange_error", "link_drop", "kv_corrupt"}) {
    const std::string body = std::string(R"({"kind": ")") + kind + R"(", "duration_ms": 1})";
    auto f = parse_fault(body, 1);
    ASSERT_TRUE(f.ok()) << kind;
    EXPECT_STREQ(fault_kind_name(f->kind), kind);
  }
}

TEST(FaultInjection, RefusesWhatIsWrongNamingIt) {
  struct Case {
    const char* body;
    const char* names;
  } cases[] = {
      {"[1]", "JSON object"},
      {R"({"group": 1})", "'kind' is required"},
      {R"({"kind": "explode"})", "unknown kind 'explode'"},
      {R"({"kind": "kill", "instance": 2})", "'instance' 2 is out of range"},
      {R"({"kind": "kill", "group": -1})", "'group' must be at least 0"},
      {R"({"kind": "kill", "after_steps": "3"})", "'after_steps' must be an integer"},
      {R"({"kind": "link_drop"})", "link_drop needs 'duration_ms'"},
      {R"({"kind": "retire_kv_blocks", "blocks": 0})", "'blocks' must be at least 1"},
      {R"({"kind": "kill", "grop": 1})", "unknown field 'grop'"},
  };
  for (const Case& c : cases) {
    auto f = parse_fault(c.body, 2);
    ASSERT_FALSE(f.ok()) << c.body;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(c.names), std::string::npos)
        << c.body << " -> " << f.status().message();
  }
}

TEST(FaultInjection, TheLogAttributesEventsToTheFaultsOfTheirInstance) {
  FaultLog log;
  protocol::FaultSpec a;
  a.id = 1;
  a.instance = 0;
  protocol::FaultSpec b;
  b.id = 2;
  b.instance = 1;
  b.kind = FaultKind::kHang;
  log.accepted(a, 1'000'000'000);
  log.accepted(b, 2'000'000'000);
  log.observe(0, "failed", 1'500'000'000);
  const nlohmann::json j = log.to_json();
  ASSERT_EQ(j["faults"].size(), 2u);
  EXPECT_EQ(j["faults"][0]["id"], 1);
  EXPECT_EQ(j["faults"][0]["kind"], "kill");
  ASSERT_EQ(j["faults"][0]["after"].size(), 1u);
  EXPECT_DOUBLE_EQ(j["faults"][0]["after"][0]["s"].get<double>(), 0.5);
  EXPECT_EQ(j["faults"][0]["after"][0]["event"], "failed");
  EXPECT_EQ(j["faults"][1]["kind"], "hang");
  EXPECT_TRUE(j["faults"][1]["after"].empty());
}

}  // namespace
}  // namespace xds::serve
