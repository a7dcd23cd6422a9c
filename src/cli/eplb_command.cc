// `xdeepserve eplb-plan`: expert load counts -> a replica plan (eplb/planner.h, the rules;
// eplb/plan_json.h, the files).
//
//   xdeepserve eplb-plan --counts FILE --devices N --redundant-slots S [--budget R] [--out FILE]
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "base/atomic_file.h"
#include "base/read_file.h"
#include "cli/commands.h"
#include "eplb/plan_json.h"
#include "eplb/planner.h"

namespace xds::cli {
namespace {

struct EplbPlanArgs {
  std::string counts, out;
  int devices = 0;
  int redundant_slots = 0;
  std::optional<int64_t> budget;
};

Status run_eplb_plan(const EplbPlanArgs& a) {
  XDS_ASSIGN_OR_RETURN(std::string text, read_whole_file(a.counts));
  XDS_ASSIGN_OR_RETURN(eplb::CountsFile counts, eplb::parse_counts_json(text, a.counts));
  eplb::PlanParams params;
  params.shape = {counts.n_experts, a.devices, a.redundant_slots};
  params.budget = a.budget;
  XDS_ASSIGN_OR_RETURN(eplb::Plan plan, eplb::plan_layers(params, counts.layers));
  const std::string out = eplb::plan_to_json(plan);
  if (a.out.empty()) {
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(a.out));
    XDS_RETURN_IF_ERROR(f.write(out));
    XDS_RETURN_IF_ERROR(f.commit());
  }
  size_t placed = 0, dropped = 0;
  double before = 0, after = 0;
  for (const eplb::LayerPlan& l : plan.layers) {
    placed += l.placement.size();
    dropped += l.dropped.size();
    before += l.tail_before;
    after += l.tail_after;
  }
  std::fprintf(stderr,
               "eplb-plan: %zu layers, %zu replicas placed, %zu dropped; tail (sum over "
               "layers) %.6g -> %.6g\n",
               plan.layers.size(), placed, dropped, before, after);
  return {};
}

}  // namespace

void add_eplb_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<EplbPlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "eplb-plan", "Plan redundant expert copies and their devices from expert load counts (JSON)");
  cmd->add_option("--counts", args->counts,
                  "JSON {n_experts, layers: [{layer, counts: [[tokens per expert] per slice]}]}")
      ->required();
  cmd->add_option("--devices", args->devices,
                  "Expert-parallel devices N (n_experts divisible by N)")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--redundant-slots", args->redundant_slots,
                  "Redundant expert slots S per device per layer")
      ->required()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option_function<int64_t>(
         "--budget", [args](int64_t r) { args->budget = r; },
         "Replicas per layer R <= N·S (default N·S)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", args->out, "Write the plan here (default: stdout)");
  cmd->callback([args, exit_code] {
    const Status s = run_eplb_plan(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace xds::cli
