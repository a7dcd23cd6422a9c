#include "xccl/fabric.h"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace xds::xccl {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kNone:
      return "none";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kGet:
      return "get";
    case OpKind::kPut:
      return "put";
    case OpKind::kWaitSignal:
      return "wait_signal";
    case OpKind::kDispatch:
      return "dispatch";
    case OpKind::kCombine:
      return "combine";
    case OpKind::kA2e:
      return "a2e";
    case OpKind::kE2a:
      return "e2a";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

namespace {
std::string_view reason_text(PoisonReason r) {
  switch (r) {
    case PoisonReason::kNone:
      return "ok";
    case PoisonReason::kDead:
      return "is dead";
    case PoisonReason::kSilent:
      return "was silent past the deadline";
    case PoisonReason::kProtocol:
      return "is out of step (protocol mismatch)";
    case PoisonReason::kAborted:
      return "aborted";
    case PoisonReason::kTransport:
      return "could not be reached (a transport operation failed)";
  }
  return "unknown";
}
}  // namespace

uint64_t encode_poison(const PoisonRecord& r) {
  return (1ull << 63) | (uint64_t(r.epoch & 0xFFFFF) << 40) | (uint64_t(r.peer & 0xFFF) << 28) |
         (uint64_t(r.detector & 0xFFF) << 16) | (uint64_t(static_cast<uint8_t>(r.op)) << 8) |
         uint64_t(static_cast<uint8_t>(r.reason));
}

PoisonRecord decode_poison(uint64_t w) {
  PoisonRecord r;
  r.epoch = uint32_t((w >> 40) & 0xFFFFF);
  r.peer = int((w >> 28) & 0xFFF);
  r.detector = int((w >> 16) & 0xFFF);
  r.op = static_cast<OpKind>((w >> 8) & 0xFF);
  r.reason = static_cast<PoisonReason>(w & 0xFF);
  return r;
}

Status poison_status(const PoisonRecord& r) {
  return aborted("xccl epoch {} poisoned: peer {} {} during {} (first noticed by rank {})", r.epoch,
                 r.peer, reason_text(r.reason), op_kind_name(r.op), r.detector);
}

Status Fabric::poison(const PoisonRecord& rec) {
  uint64_t expected = 0;
  uint64_t mine = encode_poison(rec);
  auto& word = header(0).poison.word;
  if (!word.compare_exchange_strong(expected, mine, std::memory_order_acq_rel)) mine = expected;
  ring_all();
  return poison_status(decode_poison(mine));
}

namespace {
long futex_wake(std::atomic<uint32_t>* addr) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr,
                 nullptr, 0);
}
}  // namespace

namespace {
bool membarrier_supported() {
  static const bool ok = [] {
    const long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    return q >= 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0 &&
           (q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0;
  }();
  return ok;
}
}  // namespace

bool register_asymmetric_fence() {
  // Not cached: registration belongs to the process (mm), and a forked device must register.
  return membarrier_supported() &&
         syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
}

void asymmetric_fence() {
  static std::atomic<uint32_t> full_barrier{0};  // a locked RMW: full barrier, TSan-friendly
  full_barrier.fetch_add(0, std::memory_order_seq_cst);
  if (membarrier_supported()) syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0);
}

void Fabric::ring(int r) const {
  auto& bell = header(r).bell;
  if (bell.waiters.load(std::memory_order_seq_cst) > 0) {
    bell.doorbell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&bell.doorbell);
  }
}

void Fabric::ring_all() const {
  for (int r = 0; r < world_size(); ++r) {
    auto& bell = header(r).bell;
    bell.doorbell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&bell.doorbell);
  }
}

}  // namespace xds::xccl
