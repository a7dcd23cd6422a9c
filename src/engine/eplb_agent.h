// EplbAgent: one device's side of EPLB (P066–P079): its redundant expert slots, the four-phase
// reconfiguration (P077) driven by the shell's kEplb commands and the step headers, and the
// collect windows it reports.
//
// Versions: the exchange starts on the identity map, version 1. A plan of version v comes
// with the map in force v - 2; v - 1 is the same assignment with every redundant slot
// disabled (each expert on its primary slot only).
//
//   shell                         device (this agent)                 step header
//   kPrepare(v, maps) ──────────▶ phase 1: new replicas' weights
//                                 → staging memory (ReplicaLoader)
//                     ◀────────── kPrepared / kFailed(error)
//   all prepared: kCommit(v) ───▶ advertise v - 1 (needs no weights)  map_version = v - 1
//   any failed:   kAbort(v) ────▶ staging dropped, map v - 2 stays
//                                 every device advertises v - 1 → min = v - 1 at step k:
//                                 phase 2: switch to map v - 1 before step k's forward;
//                                 phase 3: staging → slots (no map in force uses them),
//                                 advertise v                          map_version = v
//                                 min = v at step k' > k: phase 4: switch to map v
//                     ◀────────── kSwitched(v, k, k')
// Every device takes the same decision from the same headers (engine/step_sync.h), so every
// device switches at the same step boundary; a sender still routing with another version is
// caught by the receivers' dispatch metadata check, which poisons the epoch. While a
// reconfiguration is committed the agent is busy(): the header exchange never sleeps then.
//
// Collect windows: every `window_ns` the agent reports the tokens this group routed to each
// logical expert (CausalLm::routed_token_counts, differences of the cumulative counts) and
// the token-expert pairs this device's slots computed (EpMoeExchange::slot_rows), per MoE
// layer, in GroupLoad's window fields. No allocation per step; nothing is synchronised.
//
// Thread-safety: not thread-safe; the device's main thread (its collective thread) owns it.
// The exchange and model must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/status.h"
#include "engine/ep_moe_exchange.h"
#include "engine/expert_slots.h"
#include "protocol/payloads.h"
#include "model/causal_lm.h"

namespace xds::engine {

struct EplbAgentSetup {
  CausalLm* model = nullptr;
  EpMoeExchange* exchange = nullptr;
  int redundant_slots = 0;                // S
  int64_t window_ns = 60'000'000'000;     // collect window
  std::unique_ptr<ReplicaLoader> loader;  // null: CopyReplicaLoader
};

class EplbAgent {
 public:
  // Reserves the slot memory (ExpertSlotStore) and declares every redundant slot empty.
  static Result<std::unique_ptr<EplbAgent>> create(EplbAgentSetup setup);

  int64_t reserved_bytes() const { return store_->bytes(); }
  // The newest map version this device has fully loaded (the step header's map_version).
  uint64_t loaded_version() const { return loaded_; }
  uint64_t map_version() const { return ex_->map_version(); }
  // A committed reconfiguration needs more header exchanges (do not sleep).
  bool busy() const { return phase_ == Phase::kCommitted || phase_ == Phase::kLoaded; }

  // A kEplb command from the shell; the report to send back, if any.
  std::optional<EplbReport> on_command(const EplbCommand& c, int32_t group);
  // After every agreed step header (any decision but abort), before the step's forward:
  // `agreed` = the minimum loaded version over devices, `step` the agreed step. Switches maps
  // when allowed; returns kSwitched's report once the new map is in force.
  Result<std::optional<EplbReport>> at_step_boundary(uint64_t agreed, uint64_t step, int32_t group);

  // After EpMoeExchange::reform (scale-down or rejoin): the device count and version of the
  // maps now in force; a reconfiguration in progress is dropped (the shell starts none while
  // the instance is scaled down).
  void reformed();

  // Fills l's window fields when a window has closed at `now_ns` (or `force`).
  void fill_window(int64_t now_ns, bool force, GroupLoad& l);

 private:
  enum class Phase { kIdle, kPrepared, kCommitted, kLoaded };
  EplbAgent() = default;
  void drop_pending();

  CausalLm* model_ = nullptr;
  EpMoeExchange* ex_ = nullptr;
  std::unique_ptr<ReplicaLoader> loader_;
  std::unique_ptr<ExpertSlotStore> store_;
  int slots_ = 0;    // S
  int primary_ = 0;  // E / N
  int rank_ = 0, n_devices_ = 1;
  uint64_t loaded_ = 0;
  Phase phase_ = Phase::kIdle;
  uint64_t version_ = 0;                           // of the pending reconfiguration
  std::vector<xccl::ExpertMap> disabled_, final_;  // [n_layers] each
  std::vector<std::vector<int32_t>> want_;         // [moe rows][S] expert per redundant slot
  uint64_t disable_step_ = 0;
  int64_t loaded_bytes_ = 0;

  // Collect windows.
  int64_t window_ns_ = 0, window_start_ns_ = -1, window_seq_ = 0;
  uint64_t window_open_version_ = 0;
  bool close_window_ = false;  // a new map took effect: close the window at the next report
  std::vector<int64_t> last_experts_, last_slots_;  // cumulative counts at the window's start
};

}  // namespace xds::engine
