// Point-to-point send/recv over the per-pair rings (P036), plus zero-copy put and pull-style get.
//
// Protocol for one message from S to R (rings live in R's arena, layout.h):
//   1. S splits the message into chunks (plan_chunks), chunk c goes to lane c % lanes_used.
//   2. Per lane, S waits for a free slot (seq - head < ring_slots), writes SlotHeader + payload
//      into slot(S, lane, seq) of R's arena, then publishes tail(S, lane) = seq + 1 (release,
//      after a store fence). One tail per lane: one lane's release never publishes another's
//      writes.
//   3. R reads lane 0's first header (total size, lanes used, event id), assigns every lane its
//      sequence range, and per lane waits tail > seq (acquire), copies out and publishes
//      head(R, lane) = seq + 1 into S's arena: the ACK that frees the slot.
//   4. A send is done when every lane's head has reached its last seq + 1.
// Messages on a pair are delivered in posting order (per lane FIFO); the receiver checks the
// event id and fails the pair's epoch (out of step) when it differs. Several sends and recvs may
// be in flight per pair; ops on the same pair progress in posting order.
//
// Synchronous one-chunk messages with nothing else in flight take a fast path: the slot's
// sequence word is stored last (release) in the header line, which for <= 24 B also carries
// the data; the receiver polls that line only, copies out and ACKs; the sender waits for the
// ACK (briefly spinning, then through the generic engine). Same wire format, so either side
// may use either path.
//
// Forms: send/recv (synchronous; lanes run in parallel on the caller's ThreadPool), *_async
// (returns a handle; poll() progresses on the caller's thread), background (a DMA-analogue
// thread of this P2p progresses it; the caller only polls the state), put (zero-copy into a
// registered buffer of the peer + signal), get (pull from a registered buffer of the peer).
//
// Thread-safety: one P2p per device. Its methods may be called from several threads (an internal
// mutex serializes progress); the pool passed in must not be used by others during a sync call.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "xccl/fabric.h"
#include "xccl/transport.h"
#include "xccl/wait.h"

namespace xds::xccl {

// How a message is cut into chunks (pure).
struct ChunkPlan {
  uint64_t chunk_bytes = 0;  // bytes per chunk, the last one may be shorter
  uint64_t n_chunks = 1;     // >= 1 (a 0-byte message is one empty chunk)
  int lanes_used = 1;        // min(lanes, n_chunks)
};
ChunkPlan plan_chunks(uint64_t total_bytes, int lanes, uint64_t slot_bytes);
// Chunks of `plan` that travel on lane l (chunk c on lane c % lanes_used).
uint64_t lane_chunk_count(const ChunkPlan& plan, int lane);

struct P2pOptions {
  int lanes = 1;                // lanes per message, <= the arena's lanes
  ThreadPool* pool = nullptr;   // copy lanes for synchronous calls; nullptr: the caller's thread
  int64_t timeout_ms = 30'000;  // deadline of every operation, from its posting
  BackoffPolicy backoff{};
};

enum class Progress : uint8_t { kCaller, kBackground };

struct P2pOp;  // defined in p2p.cc
using P2pHandle = std::shared_ptr<P2pOp>;

class P2p {
 public:
  P2p(Fabric& fabric, Transport& transport, const P2pOptions& opts);
  ~P2p();
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  // Synchronous: returns once the receiver has copied everything out (ACKed).
  Status send(int peer, uint64_t event, std::span<const std::byte> src);
  // Synchronous: returns the message size; InvalidArgument (after draining) if dst is too small.
  Result<uint64_t> recv(int peer, uint64_t event, std::span<std::byte> dst);

  Result<P2pHandle> send_async(int peer, uint64_t event, std::span<const std::byte> src,
                               Progress mode = Progress::kCaller);
  Result<P2pHandle> recv_async(int peer, uint64_t event, std::span<std::byte> dst,
                               Progress mode = Progress::kCaller);
  // Progresses caller-driven work; returns h's state.
  OpState poll(const P2pHandle& h);
  // Until h is done, failed or cancelled; returns its status.
  Status wait(const P2pHandle& h);
  // Cancels h if no chunk of it has moved yet (then kCancelled); otherwise FailedPrecondition.
  Status cancel(const P2pHandle& h);
  // h's state without progressing anything (for background ops).
  OpState state(const P2pHandle& h) const;
  // Final status of h (ok while in progress), bytes moved so far.
  Status status(const P2pHandle& h) const;
  uint64_t bytes(const P2pHandle& h) const;

  // Zero-copy: copies src into the peer's registered buffer at off, then stores `value` into
  // signal `index` of the peer (written by us).
  Status put(const MemDesc& dst, uint64_t off, std::span<const std::byte> src, int index,
             uint64_t value);
  // Waits until signal `index` written by `from` holds >= value.
  Status wait_signal(int from, int index, uint64_t value);
  // Pull: copies from a peer's registered buffer.
  Status get(std::span<std::byte> dst, const MemDesc& src, uint64_t off);
  // The whole application area of rank r as a descriptor.
  MemDesc app_desc(int r) const;

  Fabric& fabric() { return f_; }

 private:
  Result<P2pHandle> post(bool is_send, int peer, uint64_t event, std::byte* buf, uint64_t len,
                         Progress mode);
  // Fast path of a lone synchronous one-chunk message (one slot on lane 0; <= kInlineBytes ride
  // in the header line): no op, no queue scan; the receiver polls the slot's seq word only.
  // Spins at most backoff.spin_ns under the mutex; std::nullopt = not taken, nothing done (the
  // send may also hand its published chunk to the generic engine to await the ACK).
  std::optional<Status> send_small(int peer, uint64_t event, std::span<const std::byte> src);
  std::optional<Result<uint64_t>> recv_small(int peer, uint64_t event, std::span<std::byte> dst);
  bool idle_locked() const;  // no queued op, no background op
  template <typename Probe>
  bool spin_until(Probe&& probe) const;
  // Lock held. Progresses every queued op once; returns whether anything moved.
  bool progress_locked();
  Status wait_locked(const P2pHandle& h, std::unique_lock<std::mutex>& lock);
  void background_loop();

  Fabric& f_;
  Transport& t_;
  P2pOptions opts_;
  mutable std::mutex mu_;
  std::vector<std::deque<P2pHandle>> send_q_, recv_q_;  // [peer], posting order
  std::vector<uint64_t> send_next_, recv_next_;         // [peer * L + lane] next seq to assign
  std::vector<uint64_t> known_head_;  // [peer * L + lane] lower bound of the peer's ACK (send side)
  size_t head_index(int peer, int lane) const {
    return size_t(peer) * size_t(f_.layout().cfg.lanes) + size_t(lane);
  }
  uint64_t progress_calls_ = 0;  // guarded by mu_
  int background_ops_ = 0;       // guarded by mu_
  bool stop_ = false;
  std::condition_variable bg_cv_;
  std::thread bg_;  // started by the first background op
};

}  // namespace xds::xccl
