// The instance's shell (P055): places each request once on a DP group and carries no
// per-token traffic. It keeps a load table fed by the groups' kLoad messages, applies the
// placement rule (serve/placement.h) and otherwise only relays control messages:
//
//   gateway ──kRequest──▶ shell ──kRequest──▶ group k, then kWake(seq) to every group
//           ──kCancel───▶       ──kCancel───▶ every group
//           ──kPing─────▶       ──kPing─────▶ every group; kPong back once all answered
//           ◀─kRejected──       (no group fits now: the gateway keeps it queued)
//           ◀─kLoad──────       (every group's load, at most every load_period_ms)
//   output processes ──kCancel (a stop string matched)──▶ shell ──▶ every group
//           ◀─kFailed────       (a device process died: every gateway fails its requests)
//   a sleeping group that holds work ──kWake──▶ shell ──kWake(new seq)──▶ every group
//   each group ──kBlocks (prefix-cache block-hash events)──▶ shell ──▶ every gateway
//           ──kAdmin─────▶ (GET /admin/eplb, POST /admin/eplb/rebalance) ─▶ kAdmin answer
//           ◀─kAdmin──────  (no request id: EPLB metrics, about once a second)
//   EPLB (serve/eplb_control.h): ──kEplb command──▶ every group (then a kWake);
//                                ◀─kEplb report─── each group
//
// Sockets: ROUTER bound on `listen` (gateways), one PUSH per group bound on
// group_inputs[k], one PULL bound on `shell_input` (groups and output processes).
//
// Thread-safety: run() owns every socket; stop() may be called from a signal handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/request.h"
#include "serve/eplb_control.h"
#include "serve/placement.h"

namespace xds::serve {

// kRejected's text starts with this when the request can never be placed (larger than any
// group's KV): the gateway answers 400 instead of queueing it.
inline constexpr const char* kRejectNever = "never: ";

struct ShellOptions {
  std::string listen;                     // e.g. tcp://127.0.0.1:8100
  std::string role = "colocated";         // colocated | prefill | decode (sent with loads)
  // Cooperative prefill (engine/cooperative_prefill.h): a placeable request goes to every
  // group, numbered, and the groups assign it among themselves.
  bool cooperative = false;
  std::vector<std::string> group_inputs;  // [n_groups] addresses the shell binds PUSH on
  std::string shell_input;                // address the shell binds PULL on
  int32_t max_num_seqs = 256;             // per DP group
  int64_t kv_blocks_per_group = 0;        // until the first kLoad arrives
  int64_t block_size = 16;
  int64_t load_period_ms = 50;
  PlacementPolicy placement;
  // Polled every loop: empty while every process of the instance lives, else what died. A
  // death ends run() with that error after kFailed to every gateway (no failover yet).
  std::function<std::string()> process_failure;
  EplbControlOptions eplb;  // n_groups is filled from group_inputs
};

// The decision log of run(), for tests and /metrics.
struct ShellStats {
  int64_t placed = 0, rejected = 0, cancels = 0;
  std::vector<int64_t> placed_per_group;
};

class Shell {
 public:
  explicit Shell(ShellOptions options);
  // Serves until a gateway sends kShutdown or stop() is called, then tells every group to
  // drain (kShutdown) and returns. Errors: a socket that cannot bind; a process that died
  // (process_failure).
  Status run();
  // Async-signal-safe.
  void stop() { stop_.store(true, std::memory_order_relaxed); }
  const ShellStats& stats() const { return stats_; }

 private:
  ShellOptions options_;
  std::atomic<bool> stop_{false};
  ShellStats stats_;
};

}  // namespace xds::serve
