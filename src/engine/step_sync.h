// Devices step together (docs/design/architecture.md): before every forward step each device of an
// instance posts a small header, every device receives every header, and one pure function
// turns the headers into the step's decision. Every device merges the same headers, so every
// device takes the same decision: run (the same number of MoE passes, with the same expert-map
// version), skip, sleep until woken, stop, or abort.
//
// Wire format: a StepHeader packs into one xccl::MailWords (6 x u64), exchanged with
// xccl::allgather_words on the mailbox's barrier channels:
//   w0  bits 48-63 kStepHeaderMagic · bits 40-47 format version · bits 32-39 flags
//       (bit 0 abort, bit 1 busy, bit 2 stop) · bits 0-31 epoch
//   w1  step (epoch-local step counter)
//   w2  bits 0-31 tokens · bits 32-47 moe_passes · bits 48-55 attempt · bits 56-63 zero
//   w3  expert-map version (the newest this device has fully loaded)
//   w4  bits 0-31 requests (running + waiting) · bits 32-63 abort code
//   w5  wake_seq: the highest kWake sequence number this device has received
// pack() and unpack() are pure; unpack() rejects a word set without the magic, of another
// format version, or with reserved bits set.
//
// Decision rules (merge_step_headers, pure; headers in rank order, the device's own included):
//   1. abort: any header with the abort flag (the lowest such rank is named, with its code);
//      else any header whose epoch, step or attempt differs from rank 0's (named: out of
//      step).
//   2. run:   some device has tokens > 0. moe_passes = the maximum over devices (at least 1):
//      a device with fewer (or no) tokens joins every pass's dispatch and combine with zero
//      tokens. map_version = the minimum over devices (the newest every device has loaded).
//   3. skip:  nobody has tokens but some device is busy (work in flight that needs no
//      forward, e.g. a KV transfer): no forward, no sleep; the next header exchange follows.
//   4. stop:  nobody has tokens, nobody is busy and every device asked to stop.
//   5. sleep: otherwise (all idle): each device sleeps on its control socket until a kWake
//      newer than wake_seq (the maximum over devices) arrives. The shell sends every kWake
//      to every device, so a wake any device sees later reaches all of them, and a wake some
//      device already consumed before sleeping cannot wake one device alone.
// A step that is not run does not advance the step counter (StepDecision::next_step).
//
// Attempts: a step whose exchange every device abandoned together (a transient error,
// engine/ep_moe_exchange.h) is rolled back everywhere and run again as the same step with
// attempt + 1, in the header and in the exchange's keys; StepAttempts counts them and gives
// up after kMaxStepAttempts (the error is then returned as before: the group exits).
//
// Thread-safety: StepSync is driven by the device's one collective thread (it uses the
// device's Mailbox, which is not thread-safe); the pure functions are safe anywhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "xccl/mailbox.h"

namespace xds::engine {

inline constexpr uint64_t kStepHeaderMagic = 0x5354;  // "ST"
// 2: the attempt in word 2.
inline constexpr uint64_t kStepHeaderVersion = 2;
// The collective key's layer field for step headers (MoE layers use 0 .. 4094).
inline constexpr uint16_t kStepHeaderLayer = 0xFFF;

struct StepHeader {
  uint32_t epoch = 0;
  uint64_t step = 0;          // epoch-local step counter; equal on every device
  uint32_t tokens = 0;        // tokens this device runs through the main model this step
  uint16_t moe_passes = 0;    // passes through MoE layers: 1 main forward + MTP draft passes
  uint64_t map_version = 0;   // newest expert-map version this device has fully loaded
  bool abort = false;         // this device cannot go on (the epoch ends for everyone)
  bool busy = false;          // work in flight that needs no forward (do not sleep)
  bool stop = false;          // drained, wants to stop
  uint32_t requests = 0;      // running + waiting requests (reported, not decided on)
  uint32_t abort_code = 0;    // the engine's reason code when abort is set
  uint64_t wake_seq = 0;      // highest kWake sequence number received
  uint32_t attempt = 0;       // of this step (< 256): 0, then + 1 per rollback
};

xccl::MailWords pack_step_header(const StepHeader& h);
// DataLoss naming the word and what was found when `w` is not a step header.
Result<StepHeader> unpack_step_header(const xccl::MailWords& w);

enum class StepAction : uint8_t { kRun, kSkip, kSleep, kStop, kAbort };
const char* step_action_name(StepAction a);

enum class AbortCause : uint8_t {
  kNone,
  kRequested,
  kEpochMismatch,
  kStepMismatch,
  kAttemptMismatch,
};

struct StepDecision {
  StepAction action = StepAction::kSleep;
  uint32_t epoch = 0;         // rank 0's
  uint64_t step = 0;          // rank 0's: the step the keys of this step's collectives use
  uint32_t attempt = 0;       // rank 0's (equal everywhere unless kAbort)
  uint64_t next_step = 0;     // step + 1 when run, else step
  int moe_passes = 0;         // kRun: passes every device runs (max over devices, >= 1)
  uint64_t map_version = 0;   // the minimum version every device has loaded
  uint64_t total_tokens = 0;  // over devices
  uint32_t max_tokens = 0;    // the largest device's tokens
  int idle_devices = 0;       // devices with zero tokens this step
  uint64_t requests = 0;      // over devices
  uint64_t wake_seq = 0;      // the maximum over devices (kSleep: sleep until a newer one)
  // kAbort only:
  AbortCause cause = AbortCause::kNone;
  int abort_rank = -1;  // the device that asked (kRequested) or that is out of step
  uint32_t abort_code = 0;
};

// Pure: the decision every device takes from the same headers (rank order). An empty span is
// a caller error (InvalidArgument).
Result<StepDecision> merge_step_headers(std::span<const StepHeader> headers);

// How many times one step is tried before its error stands (attempts 0 .. kMax - 1; the
// exchange's keys tell at most 4 apart, EpMoeExchange::collective_key).
inline constexpr uint32_t kMaxStepAttempts = 3;

// Pure: whether a step attempt that failed with `st` is run again: a transient error
// (Abandoned: every device gave the attempt up together and rolled it back) below
// kMaxStepAttempts attempts of the step. Anything else ends the group, as before.
bool retry_step(const Status& st, uint32_t attempt);

// The attempts of the step in flight and the rollbacks so far, for the DP group's loop.
// Not thread-safe (the loop's thread).
class StepAttempts {
 public:
  uint32_t attempt() const { return attempt_; }
  int64_t rollbacks() const { return rollbacks_; }  // cumulative
  // After the step ran with `executed`: ok -> the next step starts at attempt 0 (true); a
  // retried error (retry_step) -> attempt + 1, one more rollback (true: run the step again);
  // otherwise false (the caller returns the error).
  bool after_execute(const Status& executed);
  // A new fabric (scale-down): its first step starts at attempt 0; the count stays.
  void restart_attempts() { attempt_ = 0; }

 private:
  uint32_t attempt_ = 0;
  int64_t rollbacks_ = 0;
};

// One device's side of the header exchange. Holds a reference to the device's Mailbox (which
// must outlive it) and reusable storage (no allocation per step once constructed).
class StepSync {
 public:
  // ranks: every device of the instance, in rank order (this one included).
  StepSync(xccl::Mailbox& mb, std::vector<int> ranks, int64_t timeout_ms = 30'000);

  // Posts `mine`, waits for every other device's header (deadline: timeout_ms; a dead or
  // silent peer poisons the epoch and every device gets the same Aborted status), merges.
  Result<StepDecision> exchange(const StepHeader& mine);

  // Another all-gather right after a header exchange (every device makes the same calls):
  // `mine` out, every device's words back in rank order (this one's included).
  // Keyed as the headers with `phase` (> 0) apart (e.g. engine/cooperative_prefill.h's pool
  // state).
  Result<std::span<const xccl::MailWords>> exchange_words(uint16_t phase,
                                                          const xccl::MailWords& mine);

  // Headers of the last exchange, rank order.
  std::span<const StepHeader> headers() const { return headers_; }

 private:
  xccl::Mailbox& mb_;
  std::vector<int> ranks_, peers_;  // peers_: ranks_ without this device
  int64_t timeout_ms_;
  int me_ = -1;                           // position of this device in ranks_
  std::vector<xccl::MailWords> words_;    // [peers]
  std::vector<StepHeader> headers_;       // [ranks]
  std::vector<xccl::MailWords> all_words_;  // [ranks] (exchange_words)
};

}  // namespace xds::engine
