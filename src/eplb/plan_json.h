// The EPLB planner's files, read and written as JSON.
//
// Counts (what a load collector writes; `xdeepserve eplb-plan --counts`):
//   {"n_experts": E,
//    "layers": [{"layer": l, "counts": [[tokens routed to expert e in slice t, e in 0..E)
//                                       for each time slice t]]}, ...]}
// Plan (what the planner writes; planner.h says what each field means):
//   {"layers": [{"layer": l, "replicas": [e, ...],
//                "placement": [{"expert": e, "device": d}, ...], "dropped": [e, ...],
//                "tail_before": x, "tail_after": y}, ...]}
//
// Errors name the source (a file name) and the field ("layers[1].counts[2][5]"), what was
// expected and what was found. Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "eplb/planner.h"

namespace xds::eplb {

struct CountsFile {
  int n_experts = 0;
  std::vector<LayerCounts> layers;  // in file order
};

// Parses and checks the shape: n_experts >= 1, every slice of every layer holds n_experts
// numbers >= 0, at least one slice per layer, distinct layer ids.
Result<CountsFile> parse_counts_json(std::string_view text, std::string_view source);

// The plan as one JSON object, one line per layer, ending in a newline.
std::string plan_to_json(const Plan& plan);

// Reads a plan back (field types only; plan_slots checks it against a Shape).
Result<Plan> parse_plan_json(std::string_view text, std::string_view source);

}  // namespace xds::eplb
