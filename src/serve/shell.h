// The instance's shell (P055): places each request once on a DP group and carries no
// per-token traffic. It keeps a load table fed by the groups' loads, applies the placement
// rule (serve/placement.h) and otherwise only relays control messages (protocol/messages.h):
//
//   gateway ──Request──▶ shell ──Request──▶ group k, then Wake(seq) to every group
//           ──Cancel────▶       ──Cancel────▶ the group that holds the request
//           ──Ping──────▶       ──Ping──────▶ every group; Pong back once all answered
//           ◀─Rejected───       (no group fits now: the gateway keeps it queued)
//           ◀─Load───────       (every group's load, at most every load_period_ms)
//   output processes ──Cancel (a stop string matched)──▶ shell ──▶ the group that holds it
//   each group ──Ended (requests it released)──▶ shell (it forgets where they were placed)
//           ◀─Failed─────       (a process died or hangs: the instance restarts, or stops)
//           ◀─ScaledDown─       (a DP group was lost and left out: its requests to recompute)
//   scale-down: ──Reform(leave, reset, join)──▶ each group left ──Reformed──▶ shell
//           ──Ping(heartbeat)─▶ answered by the shell's own loop: Pong with the incarnation
//                               and whether every group is up
//   shell ──Ping──▶ each group every group_heartbeat_interval_ms; a group that is up and
//           has not answered for group_timeout_ms is hung (a pong from inside a collective
//           names the peer it waits on, which is blamed instead)
//           ──AdminRequest(faults)──▶ Fault ──▶ the group it strikes
//   a sleeping group that holds work ──Wake──▶ shell ──Wake(new seq)──▶ every group
//   each group ──Blocks (prefix-cache block-hash events)──▶ shell ──▶ every gateway
//           ──AdminRequest──▶ (GET /admin/eplb, POST /admin/eplb/rebalance) ─▶ AdminReply
//           ◀─EplbStatePush─  (EPLB metrics, about once a second)
//   EPLB (serve/eplb_control.h): ──EplbCommand──▶ every group (then a Wake);
//                                ◀─EplbReport─── each group
//
// A cooperative prefill instance sends every request (and so every cancel) to every group.
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
#include "protocol/payloads.h"
#include "serve/eplb_control.h"
#include "serve/placement.h"
#include "serve/process_watch.h"

namespace xds::serve {

// What the shell tells membership in etcd (serve/etcd_registration.h) about the instance, every
// loop: healthy while every serving DP group is up (loaded) and answers its heartbeat.
struct ShellHealth {
  bool healthy = false;
  std::vector<int32_t> groups;                      // the DP groups serving, ascending
  int64_t running = 0, waiting = 0;                 // requests, over the groups
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;  // over the groups
};

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
  // death, or a hung group, ends run() with that error after kFailed to every gateway.
  std::function<std::string()> process_failure;
  // The same, per process (ProcessWatch::dead), used instead of process_failure when set: a DP
  // group's death can then be answered by a scale-down.
  std::function<std::vector<ProcessDeath>()> process_deaths;
  // Scale-down (P119, docs/design/reliability.md): a DP group that dies or hangs is left out,
  // and the others go on without it, when every expert keeps a copy on them under EPLB's map
  // in force (else the instance starts again). kill_group(g) kills a hung one first.
  bool scale_down = false;
  std::function<void(int32_t group)> kill_group;
  // Rejoin: once the others go on, a lost group is started again (respawn_group: its new
  // pid) and, when it has loaded, joins them through the same three phases. group_pids: the
  // groups' current pids (sent with kJoin).
  std::function<Result<int32_t>(int32_t group)> respawn_group;
  std::function<std::vector<int32_t>()> group_pids;
  // Once every group is up, EPLB fills the redundant slots with copies of the next group's
  // experts (EplbControl::backup), so that any one group can be lost.
  bool expert_backup = false;
  // Whether the instance will start again after a failure (FailedMsg::recovering).
  bool will_restart = false;
  // Which start of the instance this is (PongMsg::incarnation); requests addressed to
  // another incarnation are refused.
  uint64_t incarnation = 0;
  // The shell <-> DP group heartbeat: a ping to every group this often; a group that is up (it
  // sent its first load) and answered none for group_timeout_ms is declared hung.
  int64_t group_heartbeat_interval_ms = 500;
  int64_t group_timeout_ms = 3000;
  bool fault_injection = false;  // POST /admin/faults is forwarded (else 404)
  EplbControlOptions eplb;  // n_groups is filled from group_inputs
  int32_t instance = -1;    // the instance's index where a machine runs several, -1: one
  // Not owned; when set, run() stores into it after every loop turn whether the instance is
  // ready to serve (every member DP group up, nothing fatal), and false once it stops. Read
  // by the readiness endpoint (serve/instance_health.h) from its own threads.
  std::atomic<bool>* ready = nullptr;
  // Called from the loop, about every load_period_ms (must not block): the instance's health
  // and load, for its entry in etcd. Empty: not called.
  std::function<void(const ShellHealth&)> on_health;
};

// The decision log of run(), for tests and /metrics.
struct ShellStats {
  int64_t placed = 0, rejected = 0, cancels = 0;
  int64_t cancels_dropped = 0;  // for requests no group holds (ended, or never placed)
  int64_t stale = 0;            // requests addressed to another incarnation, refused
  std::vector<int64_t> placed_per_group;
  std::vector<int32_t> lost_groups;  // left out by a scale-down (their exits are expected)
};

class Shell {
 public:
  explicit Shell(ShellOptions options);
  // Serves until a gateway sends Shutdown or stop() is called, then tells every group to
  // drain (Shutdown) and returns. Names the calling process `xds-shell`. Errors: kUnavailable
  // for a socket that cannot bind; kAborted for a process that died or a group that hangs
  // (after a FailedMsg to every gateway).
  Status run();
  // Async-signal-safe.
  void stop() { stop_.store(true, std::memory_order_relaxed); }
  const ShellStats& stats() const { return stats_; }

 private:
  class Loop;  // the sockets and the state of one run()
  ShellOptions options_;
  std::atomic<bool> stop_{false};
  ShellStats stats_;
};

}  // namespace xds::serve
