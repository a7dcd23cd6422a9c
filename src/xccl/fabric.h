// Fabric: the devices of one host and their arenas, plus the epoch they share.
//
// A Fabric is one device's view: its rank, the world size, the epoch and a mapping of every
// device's arena (layout.h). Two implementations:
//   - ProcessFabric (launcher.h): devices are processes, arenas are memfd segments passed over
//     a Unix socket; peer liveness comes from pidfds.
//   - ThreadFabric (thread_fabric.h): devices are threads of one process, arenas are heap
//     blocks; used to run the same protocol code under ThreadSanitizer.
// Everything above (transport, p2p, moe, a2e) sees only this interface.
//
// Poisoning: a dead or silent peer fails an operation; the detecting device CASes one
// PoisonRecord into rank 0's PoisonLine (the first record wins, even if rank 0 itself died:
// its arena stays mapped while anyone maps it) and rings every doorbell. Every wait checks
// that word, so every survivor fails with the same message. A new epoch is a new fabric.
//
// Thread-safety: the accessors are safe from any thread; peer_alive() too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "xccl/layout.h"

namespace xds::xccl {

// What a device was doing when an operation failed (named in errors and poison records).
enum class OpKind : uint8_t {
  kNone = 0,
  kSend,
  kRecv,
  kGet,
  kPut,
  kWaitSignal,
  kDispatch,
  kCombine,
  kA2e,
  kE2a,
  kBarrier,
};
std::string_view op_kind_name(OpKind k);

// kTransport: an operation towards the peer failed where no step attempt can be abandoned
// instead (a step header, the step-end barrier, an abort marker: Mailbox).
enum class PoisonReason : uint8_t { kNone = 0, kDead, kSilent, kProtocol, kAborted, kTransport };

struct PoisonRecord {
  uint32_t epoch = 0;  // low 20 bits are kept
  int peer = 0;        // the peer that failed (dead / silent / out of step)
  PoisonReason reason = PoisonReason::kNone;
  OpKind op = OpKind::kNone;
  int detector = 0;  // rank that noticed first
};
// Pure: bit 63 set | epoch:20 @40 | peer:12 @28 | detector:12 @16 | op:8 @8 | reason:8 @0.
uint64_t encode_poison(const PoisonRecord& r);
PoisonRecord decode_poison(uint64_t word);
// The one error every survivor returns: Aborted "xccl epoch E poisoned: peer P ... during OP".
Status poison_status(const PoisonRecord& r);

// Registers this process for MEMBARRIER_CMD_GLOBAL_EXPEDITED (every Fabric does, so that each
// forked device registers itself); false where the kernel lacks it.
bool register_asymmetric_fence();
// The sleeper's half of the lost-wake-up protocol (see Fabric): a full barrier on every CPU
// that runs a registered process (the writers), and on this one.
void asymmetric_fence();

class Fabric {
 public:
  virtual ~Fabric() = default;
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(arenas_.size()); }
  uint32_t epoch() const { return epoch_; }
  const ArenaLayout& layout() const { return layout_; }
  std::byte* arena(int r) const { return arenas_[static_cast<size_t>(r)]; }
  std::byte* local() const { return arenas_[static_cast<size_t>(rank_)]; }
  ArenaHeader& header(int r) const { return *reinterpret_cast<ArenaHeader*>(arena(r)); }

  // Rank r's exported region (SharedRegion passed over a link, link.h): where
  // MemDesc::region == kExportRegion points. {nullptr, 0} when r exports none; only links
  // carry regions.
  struct Region {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
  };
  const Region& region(int r) const { return regions_[static_cast<size_t>(r)]; }

  // False once peer r is known to be gone. Costs a syscall; call it only on slow paths.
  virtual bool peer_alive(int r) = 0;
  // Peer r was started again as process `pid` (a device that rejoins, launcher.h respawn):
  // its liveness is watched from now on. A fabric without processes has nothing to do.
  virtual Status watch_peer(int r, int pid) { return Status::ok_status(); }

  // Poison state (reads rank 0's PoisonLine; 0 = clean).
  uint64_t poison_word() const { return header(0).poison.word.load(std::memory_order_acquire); }
  // Records `rec` unless another record won first; wakes every device; returns the winner's
  // status (identical on every device).
  Status poison(const PoisonRecord& rec);

  // Wakes rank r if it sleeps on its doorbell. Call right after publishing into r's arena with
  // publish_order() (+ a compiler barrier), see "Lost wake-ups" below.
  void ring(int r) const;
  void ring_all() const;

  // Lost wake-ups. A writer stores a word (data published) and then loads r's waiter count; a
  // sleeper increments its waiter count and then re-loads the word. Either store must be seen
  // by the other side's load (Dekker). Two ways to order the writer's store-load pair:
  //   - light publish (this process registered for MEMBARRIER_CMD_GLOBAL_EXPEDITED): the hot
  //     path is a plain release store (a `mov` on x86, no `xchg` waiting for the line); the
  //     rare sleeper pays instead: after registering, asymmetric_fence() runs a membarrier
  //     that forces a full barrier on every CPU running a registered process.
  //   - otherwise: the writer stores with seq_cst.
  // The sleeper always calls asymmetric_fence() (it is a no-op where membarrier is missing), so
  // devices that disagree on the mode are still safe.
  std::memory_order publish_order() const {
    return light_publish_ ? std::memory_order_release : std::memory_order_seq_cst;
  }
  bool light_publish() const { return light_publish_; }

  // Called by every wait of this device that has left its spin phase, at most once per
  // kWaitHookPeriodNs, with the rank it waits for: the owner answers its heartbeat from inside
  // a collective there, naming that peer (engine/dp_group.cc). It must not wait on the fabric.
  void set_wait_hook(std::function<void(int blocking)> hook) { wait_hook_ = std::move(hook); }
  void wait_hook(int blocking, int64_t now_ns) {
    if (!wait_hook_ || now_ns - wait_hook_ns_ < kWaitHookPeriodNs) return;
    wait_hook_ns_ = now_ns;
    wait_hook_(blocking);
  }
  static constexpr int64_t kWaitHookPeriodNs = 10'000'000;

 protected:
  Fabric(int rank, uint32_t epoch, const ArenaLayout& layout, std::vector<std::byte*> arenas)
      : rank_(rank),
        epoch_(epoch),
        layout_(layout),
        arenas_(std::move(arenas)),
        regions_(arenas_.size()),
        light_publish_(register_asymmetric_fence()) {}
  void set_region(int r, Region region) { regions_[static_cast<size_t>(r)] = region; }

 private:
  int rank_;
  uint32_t epoch_;
  ArenaLayout layout_;
  std::vector<std::byte*> arenas_;  // [world_size] mapped bases, arenas_[rank_] is local
  std::vector<Region> regions_;     // [world_size] exported regions
  bool light_publish_;
  std::function<void(int)> wait_hook_;
  int64_t wait_hook_ns_ = 0;
};


}  // namespace xds::xccl
