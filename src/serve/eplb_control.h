// EplbControl: the shell's side of EPLB (P066–P079). It keeps the collect windows the DP
// groups report (the last `slices` of them, each summed over groups), runs the planner
// (eplb/planner.h) on demand or every `interval_s`, and drives the four-phase reconfiguration
// (engine/eplb_agent.h) by broadcasting kEplb commands:
//
//   idle ──rebalance──▶ preparing (kPrepare sent) ──every group kPrepared──▶ committed
//     ▲                     │ any kFailed: kAbort sent, the old map stays      │ (kCommit sent)
//     └─────────────────────┴────────────────────── every group kSwitched ◀────┘
//
// Slices: group g's k-th window (GroupLoad::window_seq = k) goes into slice k; a slice is
// complete when every group has reported its k-th window (groups step together, so their
// windows close within a step of each other). Device load of a layer in a slice: the token-
// expert pairs each device's slots computed (GroupLoad::window_slot_tokens).
//
// Thread-safety: not thread-safe; the shell's loop owns it. Pure apart from the clock values
// passed in.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "eplb/planner.h"
#include "protocol/payloads.h"

namespace xds::serve {

struct EplbControlOptions {
  int n_groups = 1;         // N devices
  int redundant_slots = 0;  // S
  int slices = 8;           // windows kept for the planner
  double interval_s = 0;    // 0: rebalance on demand only
};

// What a rebalance request gets: an HTTP status and a JSON body.
struct EplbAnswer {
  int status = 200;
  nlohmann::json body;
};

class EplbControl {
 public:
  explicit EplbControl(EplbControlOptions o);

  bool enabled() const { return o_.n_groups > 1 && o_.redundant_slots > 0; }
  void on_window(const protocol::GroupLoad& l);
  // Plans from the kept slices and, when it can start, the kPrepare command to broadcast.
  // 400 when EPLB is off, 409 while a reconfiguration runs or before any window closed.
  EplbAnswer rebalance(int64_t now_ns, std::optional<protocol::EplbCommand>& command);
  // --expert-backup: a reconfiguration to engine::backup_replicas (each group's experts copied
  // on the next group), so that a lost group can be left out (scale-down, P119). 409 before
  // the model's shape is known (the groups' first expert counts) or while one runs.
  EplbAnswer backup(int64_t now_ns, std::optional<protocol::EplbCommand>& command);
  // Whether every expert of every MoE layer keeps a copy on the DP groups `after`
  // (ascending) under the map in force: ok, or the error naming an expert without one.
  Status covers(const std::vector<int>& after) const;
  bool idle() const { return phase_ == Phase::kIdle; }
  // For good (the instance scaled down: the planner's shapes no longer hold): rebalances
  // answer 409 naming `why`, windows are ignored.
  void stop(std::string why);
  // Every group is back (rejoin): the identity map at `version` is in force; EPLB goes on.
  void rejoined(uint64_t version);
  // The interval elapsed and a rebalance may start.
  bool due(int64_t now_ns) const;
  // A group's report; the command to broadcast next (kCommit / kAbort), if any.
  std::optional<protocol::EplbCommand> on_report(const protocol::EplbReport& r);

  nlohmann::json state() const;      // GET /admin/eplb
  std::string metrics_text() const;  // Prometheus lines for /metrics
  uint64_t map_version() const { return version_; }

 private:
  struct Slice {
    int reported = 0;
    std::vector<double> experts;  // [rows, E] over groups
    std::vector<double> slots;    // [rows, N · spd] (device-major)
    uint64_t version = 0;         // the map in force when the window closed (min over groups)
    bool uniform = true;          // every group had that map for the whole window
  };
  bool shape_known() const { return n_experts_ > 0; }
  eplb::Shape shape() const { return {int(n_experts_), o_.n_groups, o_.redundant_slots}; }
  // Why a reconfiguration cannot start now (400 off, 409 stopped or busy), if it cannot.
  std::optional<EplbAnswer> refuse_start() const;
  // Starts the reconfiguration to pending_replicas_ (kPrepare into `command`).
  EplbAnswer start(std::optional<protocol::EplbCommand>& command);
  std::vector<double> layer_ratio_measured(bool after) const;  // [rows] max/mean of devices
  // [rows] max/mean the map in force predicts from the expert counts of the same windows as
  // layer_ratio_measured(true) (each expert's tokens split evenly over its copies).
  std::vector<double> layer_ratio_predicted_now() const;

  EplbControlOptions o_;
  // The model's shape, from the first window.
  std::vector<int64_t> moe_layers_;
  int64_t n_experts_ = 0, spd_ = 0;
  std::map<int64_t, Slice> open_;  // window seq -> slice being reported
  std::deque<Slice> done_;         // complete slices, oldest first (at most o_.slices)
  std::vector<double> expert_total_, slot_total_;  // cumulative over complete slices

  // The map in force and the reconfiguration in progress.
  uint64_t version_ = 1;
  std::vector<std::vector<std::vector<int32_t>>> replicas_;  // [rows][E] in force (empty: identity)
  enum class Phase { kIdle, kPreparing, kCommitted } phase_ = Phase::kIdle;
  uint64_t pending_version_ = 0;
  std::vector<std::vector<std::vector<int32_t>>> pending_replicas_;
  std::vector<int> prepared_, switched_;  // [groups] 0/1
  int64_t last_start_ns_ = 0;
  int64_t done_count_ = 0, failed_count_ = 0;
  std::string last_error_;
  bool stopped_ = false;
  std::string stopped_why_;
  // The last rebalance: per layer ratios before (counts it planned from, identity map) and
  // predicted; per device the steps it switched at.
  std::vector<double> before_, predicted_;
  std::vector<double> pending_before_, pending_predicted_;
  std::vector<int64_t> disable_steps_, switch_steps_, loaded_bytes_;
};

}  // namespace xds::serve
