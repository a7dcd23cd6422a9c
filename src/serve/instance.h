// An instance (the paper's TE): a shell plus N device processes (one DP group each, experts
// spread over all of them) plus one output process per group, under a supervisor that
// restarts them all (restart the world, P118).
//
//   supervisor (xds-inst, no sockets)
//     └─ incarnation: the shell (xds-shell) ─┬─ DP group k (xds-dp<k>), XCCL epoch = start
//                                            └─ output process k (xds-out<k>)
//
// A process of the incarnation that dies (pidfd) or a group that stops answering the shell's
// heartbeat ends it: the shell tells the gateways (FailedMsg, recovering), every process of
// the incarnation is killed, and the supervisor starts a new one -- fresh fabric, new epoch,
// the weights mapped again from the page cache -- with a new incarnation number, from which
// the gateways learn to send their requests again (recomputed from the tokens they streamed).
// An incarnation killed as a whole (its shell) is restarted the same way. At most
// max_restarts within restart_window_s; one more failure and the instance stops with an error.
//
// Start order: the output processes and the device group are forked first (xccl::DeviceGroup:
// the devices share the XCCL fabric's memfd arenas and die with the shell through
// PR_SET_PDEATHSIG), then the shell opens its ZeroMQ sockets (no fork after a ZeroMQ context
// exists). Every ipc address lives in Linux's abstract namespace, so a SIGKILLed instance
// leaves no file and no shared-memory segment behind.
//
// Thread-safety: run_instance() is the process's main; it installs SIGTERM/SIGINT handlers.
#pragma once

#include <string>

#include "base/status.h"
#include "engine/dp_group.h"
#include "serve/eplb_control.h"
#include "serve/etcd_registration.h"
#include "serve/placement.h"

namespace xds::serve {

struct InstanceOptions {
  std::string listen = "tcp://127.0.0.1:8100";  // the shell's address for gateways
  // colocated: prefill and decode; prefill: prefill, stream the first token, hand the KV to
  // a decode instance (the groups export their KV: group.handoff.export_kv); decode: decode
  // handoffs (it also serves whole requests a gateway sends it).
  std::string role = "colocated";
  int dp = 1;
  engine::DpGroupOptions group;  // addresses are filled per group by run_instance
  int threads_per_device = 0;    // 0: the machine's cores / dp (at least 1)
  PlacementPolicy placement;
  EplbControlOptions eplb;  // the shell's EPLB (n_groups = dp)
  bool pin = true;          // pin device k's threads from core k * threads where cores allow
  // Where one machine runs several instances: this one's index, carried in its processes'
  // names ("xds-<i>-dp<r>", base/process_name.h); -1 where it runs one.
  int instance = -1;
  int max_restarts = 3;             // restarts allowed within restart_window_s
  int64_t restart_window_s = 600;
  int64_t group_heartbeat_interval_ms = 500;  // shell -> DP group pings
  int64_t group_timeout_ms = 3000;            // a group silent this long is hung
  bool fault_injection = false;               // POST /admin/faults reaches the groups
  // A lost DP group is left out where the others hold copies of its experts (scale-down,
  // ShellOptions::scale_down); group.scale_down is set alike.
  bool scale_down = true;
  bool expert_backup = false;  // ShellOptions::expert_backup
  // > 0: GET /health on this port, on the host of `listen`, answers 200 once the instance is
  // ready to serve and 503 before (serve/instance_health.h). 0: no such endpoint.
  int health_port = 0;
  // Membership in etcd (docs/design/membership.md): with etcd.endpoint set, each incarnation
  // registers the instance under etcd.prefix once every DP group is up, keeps the lease alive
  // while they answer their heartbeats, and revokes it on a clean shutdown.
  EtcdRegistrationOptions etcd;
  // The address published in etcd for gateways to reach the shell (empty: `listen`, which
  // then must not bind a wildcard host such as 0.0.0.0 or *).
  std::string advertise;
  // MoE/attention disaggregation (docs/design/ae_disaggregation.md): dp attention DP groups
  // (group.ae_mode, group.ae) plus group.ae.shape.experts expert devices
  // (engine/expert_device.h), forked as devices dp .. dp + X - 1 of the same fabric and
  // watched like the groups (one that dies restarts the instance).
  bool ae_mode = false;
};

// Runs until SIGTERM/SIGINT or a gateway's kShutdown: then drains (the groups finish their
// requests), stops every process and returns. Errors: the first start failed (bad options, a
// port in use), or the instance failed more often than max_restarts allows.
Status run_instance(const InstanceOptions& options);

}  // namespace xds::serve
