// The expert device of MoE/attention disaggregation (P106, P111;
// docs/design/ae_disaggregation.md): a device process that holds routed experts and serves
// every MoE layer of every step for the attention DP groups, as a persistent loop with no
// controller in it.
//
//   wait for the step notice from attention rank 0 (kAeStep; no deadline: an idle instance
//   sleeps in the fabric's back-off, spin -> yield -> futex naps)
//   for each turn (MoE layer, domain, microbatch) of ae_expert_turns (engine/ae_schedule.h):
//     for each round until no trampoline has more:
//       A2E receive (the trampolines forward, xccl/a2e.h) -> this device's slots compute
//       (GroupedExperts, the model's expert code) -> E2A send (pre-sums back to the
//       trampolines, which sum them for their attention group)
//
// Slots: ceil(E / X) per device and MoE layer; logical expert e lives on device
// e / ceil(E / X) (ExpertMap::identity), so X need not divide E (16 experts on 3 devices:
// 6, 6 and 4 experts, the last device's two tail slots empty).
//
// Counters and trace (written to <trace_dir>/expert<k>.json when the loop ends, k = expert
// index, if trace_dir is set): steps, turns, rows computed, busy_ns (time in the expert GEMMs)
// over wall_ns (since the first notice), controller_round_trips (requests this loop sent to
// anyone that it then waited on an answer for: the loop has none, so it stays 0 -- every
// wait is on data-plane messages of the exchange or on the one-way notice), and one trace
// entry per (step, domain, layer, microbatch) with its start and end.
//
// Thread-safety: run_expert_device() is the device process's main; one thread drives the
// A2e (the Mailbox is not thread-safe); the expert GEMMs use the model's pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/ae_moe_exchange.h"
#include "model/causal_lm.h"

namespace xds::xccl {
class Fabric;
}

namespace xds::engine {

struct ExpertDeviceOptions {
  std::string model_dir;
  ModelOptions model;  // compute dtype, threads
  AeOptions ae;
  int32_t cpu = -1;       // pin the device's threads from this core (-1: no)
  int32_t instance = -1;  // base/process_name.h
};

struct AeTraceEntry {
  uint64_t step = 0;
  int domain = 0;
  int64_t layer = 0;
  int microbatch = 0;
  int64_t rows = 0;                     // rows this device computed in the turn
  int64_t begin_ns = 0, end_ns = 0;     // since the loop started
};

struct ExpertLoopStats {
  int64_t steps = 0, turns = 0, rows = 0;
  int64_t busy_ns = 0;  // in the expert GEMMs
  int64_t wall_ns = 0;  // from the first notice to the last turn's end
  int64_t controller_round_trips = 0;
  std::vector<AeTraceEntry> trace;  // the latest kMaxTrace turns
  static constexpr size_t kMaxTrace = 1 << 16;
};

// JSON of the stats (what expert<k>.json holds).
std::string expert_stats_json(const ExpertLoopStats& s, int expert_index);

// The device process's main; returns the exit code (0: stopped by a notice).
int run_expert_device(xccl::Fabric& fabric, const ExpertDeviceOptions& options);

}  // namespace xds::engine
