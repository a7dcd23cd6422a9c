// The DP group's handoffs between instances and groups, apart from its sockets:
//   DistFlow (engine/distflow.h) on the prefill side: a prefill-only request that sampled
//     its first token is parked (its KV kept, a transfer opened; the handoff rides on that
//     token's delta) until the decode side has pulled it or the transfer expires.
//   DistFlow on the decode side: the handoffs the step's plan admits (the backpressure rule
//     is the pure schedule()'s, engine/scheduler.h) are pulled into freshly reserved blocks
//     and start decoding once the pull completes.
//   The cooperative prefill pool (engine/cooperative_prefill.h): pooled requests reach every
//     group and are assigned together after each step header.
//   Link probing (P116, engine/distflow.h): a slow pull probes its prefill group; a link that
//     does not answer is failed, and its handoff is recomputed here from its tokens
//     (RequestTable::recompute_handoff) instead of ending. inject_link_fault() makes a
//     prefill group's links slow or dead, for tests and the admin fault endpoint.
//   Checksums (P120, engine/distflow.h): the prefill side hashes the blocks it parks; a pull
//     whose blocks differ retires those that went bad here and recomputes the handoff.
//
// Thread-safety: not thread-safe; the device's main thread owns it (KvPuller's own thread
// writes only the blocks it was given).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/distflow.h"
#include "engine/engine_core.h"
#include "protocol/payloads.h"
#include "engine/step_sync.h"

namespace xds::engine {

struct HandoffOptions {
  int rank = 0;  // the group (logs, the prefill group of a handoff)
  // Prefill side: export the KV planes under `link_name` (distflow_link_name).
  bool export_kv = false;
  std::string link_name;
  // This instance's host for KV transfers (empty: shared memory only); auto | shm | ucx.
  std::string kv_transfer_host;
  std::string kv_transfer_backend = "auto";
  // The cluster secret's bytes (protocol::ClusterSecret): UCX links prove it to each other
  // before the KV cache's keys are handed out. Required for UCX (either side); unused by
  // shared-memory links.
  std::optional<xccl::LinkSecret> link_secret;
  int64_t kv_transfer_timeout_ns = 60'000'000'000;  // a parked transfer nobody pulls is freed
  bool cooperative_prefill = false;
  // Decode side: when a pull is slow (probe the link) and when a slow link is failed.
  KvProbeOptions kv_probe;
};

struct HandoffStats {
  int64_t parked = 0;             // transfers open now
  int64_t transfers_done = 0;     // pulled by a decode group
  int64_t transfers_expired = 0;  // freed at the deadline
  int64_t pulled_bytes = 0;       // decode side
  // Decode side, cumulative: probes answered while a pull was slow (saturated), link failures
  // (one per pull that found its link failed; the pulls queued behind it fail with it without
  // counting again), and the handoffs recomputed here (those not cancelled meanwhile).
  int64_t probes_saturated = 0;
  int64_t links_failed = 0;
  int64_t handoffs_recomputed = 0;
  // Decode side, cumulative: pulls whose blocks did not match their checksums.
  int64_t checksum_mismatches = 0;
};

// A fault of a prefill group's KV links (every link of its KvSender), for tests and the admin
// fault endpoint (the DP group's FaultMsg handler):
//   kDelay: the links hold their transfers (a decode side waits before copying) while they
//           still answer probes and read completions: pulls are slow but alive, and the
//           decode side counts its answered probes as saturated.
//   kDrop:  the links hold their transfers and answer no probe and read no completion: the
//           decode side's probe goes unanswered, it declares the link failed, drops it and
//           recomputes the request. Transfers it abandoned stay parked here until their
//           deadline (the link that would have carried their completion is gone).
struct LinkFault {
  enum Kind : uint8_t { kDelay, kDrop };
  Kind kind = kDelay;
  int64_t duration_ms = 0;  // from now; 0 ends the fault in force
};

class HandoffStage {
 public:
  explicit HandoffStage(const HandoffOptions& options);
  ~HandoffStage();
  HandoffStage(const HandoffStage&) = delete;
  HandoffStage& operator=(const HandoffStage&) = delete;

  // The engine core's KV storage when exporting (the KvSender's region); null otherwise.
  KvStorageFactory storage_factory();
  // Binds the stage to `core` (which must outlive it): the puller, the parked transfers.
  Status attach(EngineCore& core);

  // Cooperative prefill: takes a pooled request (r.pool_number > 0 with the pool on); false
  // leaves r to the caller.
  bool pool(EngineRequest& r);
  // A cancel of a pooled request (it is dropped when assigned); false when not pooled.
  bool cancel_pooled(const std::string& id);
  bool pool_empty() const { return pool_.empty(); }
  // The pool state all-gathered after the step header, the same assignment on every group;
  // this group's requests go to `admit` (then `cancel` when cancelled while pooled). True when
  // some request was assigned anywhere.
  Result<bool> cooperate(StepSync& sync, const std::function<void(EngineRequest)>& admit,
                         const std::function<void(const std::string&)>& cancel);

  // Every loop: links of decode groups that connect, completed transfers (their parked
  // sequences freed), transfers past the deadline (freed), then the completed pulls (their
  // sequences start decoding, or end: a failed pull, a cancel meanwhile). *ended: some
  // transfer ended.
  Status service(bool* ended);
  // The plan's handoffs: pulls posted; the unfittable ones end ("abort").
  Status start_pulls(const StepPlan& plan);
  // After the step's commit: the table's handoffs are parked, their transfer on the delta.
  void park();
  // Prefill side: answers the decode groups' probes (service() does too; the DP group also
  // calls it between a long step's layers, so that a busy group is not a dead link).
  void answer_probes();
  // Prefill side: `f` for f.duration_ms on every link, replacing the fault in force (the
  // LinkFault comment); FailedPrecondition on a group that exports no KV.
  Status inject_link_fault(LinkFault f);
  // Decode side: the next pull lands with `blocks` of its blocks corrupted (one byte flipped
  // after the copy, as bad memory would): its checksums catch it, the bad blocks are retired and
  // the handoff recomputed. Fault injection only.
  void corrupt_next_pull(int64_t blocks) { puller_->corrupt_next_pull(blocks); }

  bool has_parked() const { return !parked_.empty(); }
  int listen_fd() const { return sender_ ? sender_->listen_fd() : -1; }
  int ucx_listen_fd() const { return sender_ ? sender_->ucx_listen_fd() : -1; }
  bool exporting() const { return sender_ != nullptr; }
  HandoffStats stats() const;

 private:
  HandoffOptions o_;
  EngineCore* core_ = nullptr;
  std::map<uint64_t, EngineRequest> pool_;  // cooperative prefill, by number
  uint64_t pool_highest_ = 0;
  std::vector<std::string> pool_cancelled_;  // ids cancelled while pooled
  std::unique_ptr<KvSender> sender_;         // prefill role (export_kv)
  std::unique_ptr<KvPuller> puller_;         // every group: decode phases
  std::vector<KvPuller::Done> pulled_;       // scratch
  struct Parked {
    int64_t seq = 0;
    int64_t deadline_ns = 0;
  };
  std::unordered_map<uint64_t, Parked> parked_;  // by transfer id
  std::vector<uint64_t> completed_;              // scratch
  int64_t transfers_done_ = 0, transfers_expired_ = 0;
  int64_t links_failed_ = 0, handoffs_recomputed_ = 0, checksum_mismatches_ = 0;
  // The injected link fault in force (prefill side), and when it ends.
  std::optional<LinkFault::Kind> fault_;
  int64_t fault_end_ns_ = 0;
  int64_t links_checked_ns_ = 0;  // the last KvSender::drop_failed_links
  // The prefill side's per-loop work on its links: faults ending, probes, completions, failed
  // links dropped; the ids completed are appended to completed_.
  void serve_links();
};

}  // namespace xds::engine
