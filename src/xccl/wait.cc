#include "xccl/wait.h"

#include <linux/futex.h>

#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace xds::xccl {

BackoffPhase backoff_phase(int64_t elapsed_ns, const BackoffPolicy& p) {
  if (elapsed_ns < p.spin_ns) return BackoffPhase::kSpin;
  if (elapsed_ns < p.yield_ns) return BackoffPhase::kYield;
  return BackoffPhase::kSleep;
}

Status check_poison(const Fabric& f) {
  uint64_t w = f.poison_word();
  if (w != 0) [[unlikely]]
    return poison_status(decode_poison(w));
  return Status::ok_status();
}

namespace detail {

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

namespace {
constexpr int64_t kLivenessPeriodNs = 1'000'000;
}

WaitLoop::WaitLoop(Fabric& f, const WaitCtx& ctx)
    : f_(f), ctx_(ctx), start_ns_(now_ns()), last_live_check_ns_(start_ns_) {}

WaitLoop::~WaitLoop() {
  if (registered_) f_.header(f_.rank()).bell.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void WaitLoop::progressed() {
  if (registered_) f_.header(f_.rank()).bell.waiters.fetch_sub(1, std::memory_order_seq_cst);
  registered_ = false;
  spinning_ = true;
  start_ns_ = now_ns();
}

Status WaitLoop::idle(int blocking) {
  XDS_RETURN_IF_ERROR(check_poison(f_));
  // Spin phase: read the clock only every 32nd call (it costs as much as the probe).
  if (spinning_ && (++iter_ & 31) != 0) {
    cpu_relax();
    return Status::ok_status();
  }
  const int64_t now = now_ns();
  PoisonRecord rec{f_.epoch(), blocking, PoisonReason::kSilent, ctx_.op, f_.rank()};
  if (now > ctx_.deadline_ns) return f_.poison(rec);
  const BackoffPhase phase = backoff_phase(now - start_ns_, ctx_.backoff);
  spinning_ = phase == BackoffPhase::kSpin;
  if (spinning_) {
    if ((iter_ & 1023) == 0) sched_yield();  // a spinning waiter never starves its peer for long
    cpu_relax();
    return Status::ok_status();
  }
  if (now - last_live_check_ns_ >= kLivenessPeriodNs || phase == BackoffPhase::kSleep) {
    last_live_check_ns_ = now;
    if (blocking >= 0 && blocking != f_.rank() && !f_.peer_alive(blocking)) {
      rec.reason = PoisonReason::kDead;
      return f_.poison(rec);
    }
  }
  f_.wait_hook(blocking, now);
  if (phase == BackoffPhase::kYield) {
    sched_yield();
    return Status::ok_status();
  }
  auto& bell = f_.header(f_.rank()).bell;
  if (!registered_) {
    // Register first, then let the caller re-probe before the first nap (no lost wake-up).
    bell.waiters.fetch_add(1, std::memory_order_seq_cst);
    asymmetric_fence();  // writers publish with a plain release store (Fabric, "Lost wake-ups")
    registered_ = true;
    seen_bell_ = bell.doorbell.load(std::memory_order_seq_cst);
    return Status::ok_status();
  }
  int64_t nap = std::min(ctx_.backoff.sleep_ns, std::max<int64_t>(ctx_.deadline_ns - now, 0) + 1);
  timespec ts{static_cast<time_t>(nap / 1'000'000'000), static_cast<long>(nap % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell.doorbell), FUTEX_WAIT, seen_bell_, &ts,
          nullptr, 0);
  seen_bell_ = bell.doorbell.load(std::memory_order_seq_cst);
  return Status::ok_status();
}

}  // namespace detail
}  // namespace xds::xccl
