// Waiting: every wait has a deadline, polls adaptively and fails alike on every survivor.
//
// Polling phases (pure policy, backoff_phase()): spin with a pause instruction for spin_ns,
// then sched_yield() until yield_ns, then sleep on the device's own futex doorbell with a
// waiter flag (no lost wake-ups, see Fabric::ring) for at most sleep_ns per nap. Eight device
// processes on two cores make progress because a waiter quickly stops burning its core.
//
// wait_until(f, ctx, probe): probe() returns kReady or the rank it is still waiting for. In the
// yield/sleep phases the waiter checks that rank's liveness; past the deadline the waiter
// poisons the epoch naming that rank ("silent"), a dead rank is named "dead". A poisoned epoch
// ends every wait with the poison status.
#pragma once

#include <cstdint>
#include <limits>

#include "base/clock.h"
#include "base/status.h"
#include "xccl/fabric.h"

namespace xds::xccl {

inline constexpr int kReady = -1;
inline constexpr int64_t kNoDeadline = std::numeric_limits<int64_t>::max();

// Deadline helper: now + timeout.
inline int64_t deadline_after_ms(int64_t ms) {
  return now_ns() + ms * 1'000'000;
}

struct BackoffPolicy {
  int64_t spin_ns = 20'000;      // busy poll this long first (latency path)
  int64_t yield_ns = 200'000;    // then yield the core until this much time has passed
  int64_t sleep_ns = 1'000'000;  // then futex naps of at most this long
};

enum class BackoffPhase : uint8_t { kSpin, kYield, kSleep };
// Pure: which phase a waiter that has waited `elapsed_ns` is in.
BackoffPhase backoff_phase(int64_t elapsed_ns, const BackoffPolicy& p);

struct WaitCtx {
  OpKind op = OpKind::kNone;
  int64_t deadline_ns = kNoDeadline;
  BackoffPolicy backoff{};
};

// Fails fast if the epoch is already poisoned.
Status check_poison(const Fabric& f);

namespace detail {
void cpu_relax();
class WaitLoop {
 public:
  WaitLoop(Fabric& f, const WaitCtx& ctx);
  // Called while the probe reports `blocking`; returns non-ok to stop waiting.
  Status idle(int blocking);
  // Something moved: restart from the spin phase (and leave the futex waiter set).
  void progressed();
  // Undo the waiter registration (if any) once the probe is ready.
  ~WaitLoop();

 private:
  Fabric& f_;
  const WaitCtx& ctx_;
  int64_t start_ns_;
  int64_t last_live_check_ns_;
  uint32_t iter_ = 0;
  bool spinning_ = true;     // in the spin phase: the clock is read every 32nd idle()
  bool registered_ = false;  // counted in our DoorbellLine::waiters
  uint32_t seen_bell_ = 0;   // doorbell value read before the last probe
};
}  // namespace detail

template <typename Probe>
Status wait_until(Fabric& f, const WaitCtx& ctx, Probe&& probe) {
  int blocking = probe();
  if (blocking == kReady) return check_poison(f);
  detail::WaitLoop loop(f, ctx);
  while (true) {
    XDS_RETURN_IF_ERROR(loop.idle(blocking));
    blocking = probe();
    if (blocking == kReady) return Status::ok_status();
  }
}

}  // namespace xds::xccl
