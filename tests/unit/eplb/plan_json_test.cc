// The planner's JSON files: counts read with every shape error named by its field, and a
// plan written as the documented object (checked against JSON written out by hand here) and
// read back.
#include "eplb/plan_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace xds::eplb {
namespace {

void expect_counts_error(const std::string& text, const std::string& fragment) {
  auto r = parse_counts_json(text, "c.json");
  ASSERT_FALSE(r.ok()) << "accepted: " << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().rfind("c.json: ", 0), 0u) << r.status().message();
}

TEST(CountsJson, ReadsLayersAndSlices) {
  auto r = parse_counts_json(
      R"({"n_experts": 3, "layers": [{"layer": 4, "counts": [[1, 2, 3], [4.5, 0, 6]]},
                                     {"layer": 1, "counts": [[0, 0, 7]]}]})",
      "c.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_experts, 3);
  ASSERT_EQ(r->layers.size(), 2u);
  EXPECT_EQ(r->layers[0].layer, 4);
  EXPECT_EQ(r->layers[0].n_slices, 2);
  EXPECT_EQ(r->layers[0].counts, (std::vector<double>{1, 2, 3, 4.5, 0, 6}));
  EXPECT_EQ(r->layers[1].layer, 1);
  EXPECT_EQ(r->layers[1].counts, (std::vector<double>{0, 0, 7}));
}

TEST(CountsJson, ErrorsNameTheField) {
  expect_counts_error("{", "invalid JSON");
  expect_counts_error("[1]", "expected a JSON object");
  expect_counts_error(R"({"layers": []})", "field 'n_experts' is missing");
  expect_counts_error(R"({"n_experts": 0, "layers": []})",
                      "field 'n_experts' must be an integer >= 1, got 0");
  expect_counts_error(R"({"n_experts": 2.5, "layers": []})",
                      "field 'n_experts' must be an integer");
  expect_counts_error(R"({"n_experts": 2})", "field 'layers' is missing");
  expect_counts_error(R"({"n_experts": 2, "layers": {}})", "field 'layers' must be an array");
  expect_counts_error(R"({"n_experts": 2, "layers": [{"counts": [[1, 2]]}]})",
                      "field 'layers[0].layer' is missing");
  expect_counts_error(R"({"n_experts": 2, "layers": [{"layer": -1, "counts": [[1, 2]]}]})",
                      "field 'layers[0].layer' must be an integer >= 0, got -1");
  expect_counts_error(R"({"n_experts": 2, "layers": [{"layer": 0, "counts": []}]})",
                      "field 'layers[0].counts' has no time slices");
  // Ragged: the second slice has 3 values.
  expect_counts_error(
      R"({"n_experts": 2, "layers": [{"layer": 0, "counts": [[1, 2], [1, 2, 3]]}]})",
      "field 'layers[0].counts[1]' must be an array of n_experts = 2 numbers, got 3 values");
  expect_counts_error(
      R"({"n_experts": 2, "layers": [{"layer": 0, "counts": [5, 6]}]})",
      "field 'layers[0].counts[0]' must be an array of n_experts = 2 numbers, got 5");
  expect_counts_error(
      R"({"n_experts": 2, "layers": [{"layer": 0, "counts": [[1, 2]]}, {"layer": 3, "counts": [[1, -2]]}]})",
      "field 'layers[1].counts[0][1]' must be a number >= 0, got -2");
  expect_counts_error(R"({"n_experts": 2, "layers": [{"layer": 0, "counts": [[1, "7"]]}]})",
                      "field 'layers[0].counts[0][1]' must be a number >= 0, got \"7\"");
  expect_counts_error(
      R"({"n_experts": 2, "layers": [{"layer": 3, "counts": [[1, 2]]}, {"layer": 3, "counts": [[1, 2]]}]})",
      "field 'layers[1].layer': layer 3 appears more than once");
}

TEST(PlanJson, WritesTheDocumentedObjectAndReadsItBack) {
  Plan plan;
  LayerPlan a;
  a.layer = 2;
  a.replicas = {0, 1};
  a.placement = {{0, 1}};
  a.dropped = {1};
  a.tail_before = 5;
  a.tail_after = 2.5;
  LayerPlan b;
  b.layer = 9;
  b.tail_before = 0.1;
  b.tail_after = 0.1;
  plan.layers = {a, b};
  const std::string text = plan_to_json(plan);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const auto expected = nlohmann::json::parse(R"({"layers": [
      {"layer": 2, "replicas": [0, 1], "placement": [{"expert": 0, "device": 1}],
       "dropped": [1], "tail_before": 5.0, "tail_after": 2.5},
      {"layer": 9, "replicas": [], "placement": [], "dropped": [],
       "tail_before": 0.1, "tail_after": 0.1}]})");
  EXPECT_EQ(nlohmann::json::parse(text), expected) << text;

  auto back = parse_plan_json(text, "p.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->layers.size(), 2u);
  EXPECT_EQ(back->layers[0].layer, 2);
  EXPECT_EQ(back->layers[0].replicas, a.replicas);
  ASSERT_EQ(back->layers[0].placement.size(), 1u);
  EXPECT_EQ(back->layers[0].placement[0].expert, 0);
  EXPECT_EQ(back->layers[0].placement[0].device, 1);
  EXPECT_EQ(back->layers[0].dropped, a.dropped);
  EXPECT_EQ(back->layers[0].tail_after, 2.5);
  EXPECT_EQ(back->layers[1].tail_before, 0.1);  // doubles round-trip exactly

  EXPECT_EQ(nlohmann::json::parse(plan_to_json(Plan{})),
            nlohmann::json::parse(R"({"layers": []})"));
}

TEST(PlanJson, ReadErrorsNameTheField) {
  auto missing =
      parse_plan_json(R"({"layers": [{"layer": 0, "replicas": [], "dropped": []}]})", "p.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("field 'layers[0].placement' is missing"),
            std::string::npos)
      << missing.status().message();
  auto bad_device = parse_plan_json(
      R"({"layers": [{"layer": 0, "replicas": [1], "dropped": [], "placement": [{"expert": 1, "device": -2}],
          "tail_before": 1, "tail_after": 1}]})",
      "p.json");
  ASSERT_FALSE(bad_device.ok());
  EXPECT_NE(bad_device.status().message().find(
                "'layers[0].placement[0].device' must be an integer >= 0, got -2"),
            std::string::npos)
      << bad_device.status().message();
  auto no_tail = parse_plan_json(
      R"({"layers": [{"layer": 0, "replicas": [], "dropped": [], "placement": [], "tail_before": 1}]})",
      "p.json");
  ASSERT_FALSE(no_tail.ok());
  EXPECT_NE(no_tail.status().message().find("'layers[0].tail_after' must be a number, got nothing"),
            std::string::npos)
      << no_tail.status().message();
}

}  // namespace
}  // namespace xds::eplb
