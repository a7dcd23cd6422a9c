#include "xccl/p2p.h"

#include <algorithm>
#include <atomic>

namespace xds::xccl {

ChunkPlan plan_chunks(uint64_t total, int lanes, uint64_t slot_bytes) {
  if (total == 0) return {0, 1, 1};
  const uint64_t L = static_cast<uint64_t>(std::max(lanes, 1));
  uint64_t per_lane = (total + L - 1) / L;
  per_lane = (per_lane + kLine - 1) / kLine * kLine;
  ChunkPlan p;
  p.chunk_bytes = std::min(slot_bytes, per_lane);
  p.n_chunks = (total + p.chunk_bytes - 1) / p.chunk_bytes;
  p.lanes_used = static_cast<int>(std::min<uint64_t>(L, p.n_chunks));
  return p;
}

uint64_t lane_chunk_count(const ChunkPlan& p, int lane) {
  const uint64_t l = static_cast<uint64_t>(lane), L = static_cast<uint64_t>(p.lanes_used);
  if (lane >= p.lanes_used || l >= p.n_chunks) return 0;
  return (p.n_chunks - l + L - 1) / L;
}

struct LaneCursor {
  uint64_t seq0 = 0;   // first ring sequence number of this op on the lane
  uint64_t count = 0;  // chunks of this op on the lane
  uint64_t next = 0;   // chunks already published (send) / consumed (recv)
  bool acked = false;  // send: the receiver consumed all of them
};

struct P2pOp {
  bool is_send = false;
  int peer = -1;
  uint64_t event = 0;
  std::byte* buf = nullptr;
  uint64_t len = 0;  // send: message size; recv: capacity
  Progress mode = Progress::kCaller;
  int64_t deadline_ns = 0;
  bool assigned = false;  // lanes have sequence ranges (recv: the header has been read)
  ChunkPlan plan;
  uint64_t total = 0;
  bool too_small = false;
  std::vector<LaneCursor> lanes;
  std::atomic<OpState> state{OpState::kInProgress};
  Status status;  // written before `state` leaves kInProgress (release)
  std::atomic<uint64_t> moved{0};
};

namespace {

bool lanes_finished(const P2pOp& op) {
  for (int l = 0; l < op.plan.lanes_used; ++l) {
    const LaneCursor& c = op.lanes[static_cast<size_t>(l)];
    if (c.next < c.count || (op.is_send && !c.acked)) return false;
  }
  return true;
}

}  // namespace

P2p::P2p(Fabric& fabric, Transport& transport, const P2pOptions& opts)
    : f_(fabric), t_(transport), opts_(opts) {
  XDS_CHECK(opts_.lanes >= 1 && opts_.lanes <= f_.layout().cfg.lanes,
            "P2p lanes {} outside [1, {}]", opts_.lanes, f_.layout().cfg.lanes);
  const size_t W = static_cast<size_t>(f_.world_size());
  send_q_.resize(W);
  recv_q_.resize(W);
  // Ring positions continue from the lines only this device writes, so a new P2p on a fabric
  // whose previous P2p finished its traffic picks up where that one stopped.
  const int L = f_.layout().cfg.lanes;
  send_next_.assign(W * static_cast<size_t>(L), 0);
  recv_next_.assign(W * static_cast<size_t>(L), 0);
  const ArenaLayout& lay = f_.layout();
  for (int p = 0; p < f_.world_size(); ++p)
    for (int l = 0; l < L; ++l) {
      auto word = [&](uint64_t off) {
        return reinterpret_cast<std::atomic<uint64_t>*>(f_.arena(p) + off)
            ->load(std::memory_order_acquire);
      };
      send_next_[size_t(p * L + l)] = word(lay.tail_off(f_.rank(), l));
      known_head_.push_back(0);
      recv_next_[size_t(p * L + l)] = word(lay.head_off(f_.rank(), l));
    }
}

P2p::~P2p() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  bg_cv_.notify_all();
  if (bg_.joinable()) bg_.join();
}

MemDesc P2p::app_desc(int r) const {
  return MemDesc{r, f_.layout().app, f_.layout().cfg.app_bytes};
}

Result<P2pHandle> P2p::post(bool is_send, int peer, uint64_t event, std::byte* buf, uint64_t len,
                            Progress mode) {
  if (peer < 0 || peer >= f_.world_size() || peer == f_.rank())
    return invalid_argument("xccl {}: peer {} must be another rank in [0, {})",
                            is_send ? "send" : "recv", peer, f_.world_size());
  XDS_RETURN_IF_ERROR(check_poison(f_));
  auto op = std::make_shared<P2pOp>();
  op->is_send = is_send;
  op->peer = peer;
  op->event = event;
  op->buf = buf;
  op->len = len;
  op->mode = mode;
  op->deadline_ns = deadline_after_ms(opts_.timeout_ms);
  op->lanes.resize(static_cast<size_t>(f_.layout().cfg.lanes));
  {
    std::lock_guard<std::mutex> lock(mu_);
    (is_send ? send_q_ : recv_q_)[static_cast<size_t>(peer)].push_back(op);
    if (mode == Progress::kBackground) {
      ++background_ops_;
      if (!bg_.joinable()) bg_ = std::thread([this] { background_loop(); });  // first use
    }
  }
  if (mode == Progress::kBackground) bg_cv_.notify_one();
  return op;
}

Result<P2pHandle> P2p::send_async(int peer, uint64_t event, std::span<const std::byte> src,
                                  Progress mode) {
  return post(true, peer, event, const_cast<std::byte*>(src.data()), src.size(), mode);
}

Result<P2pHandle> P2p::recv_async(int peer, uint64_t event, std::span<std::byte> dst,
                                  Progress mode) {
  return post(false, peer, event, dst.data(), dst.size(), mode);
}

namespace {

struct ChunkHeader {
  uint64_t event = 0, total = 0, chunk_bytes = 0, chunk = 0;
  int lanes_used = 1;
};

// Writes chunk `seq` of lane l into slot(me, l, seq) of `peer`'s arena: header fields and the
// payload with plain stores, then the slot's seq word (release: a receiver may poll that line
// alone), then tail(me, l) (release: the generic receiver polls the tail).
void publish_chunk(Fabric& f, Transport& t, int peer, int l, uint64_t seq, const ChunkHeader& c,
                   const std::byte* data, uint64_t n) {
  const ArenaLayout& lay = f.layout();
  const int me = f.rank();
  SlotHeader h{};
  h.event_id = c.event;
  h.total_bytes = c.total;
  h.chunk_bytes = static_cast<uint32_t>(c.chunk_bytes);
  h.chunk_id = static_cast<uint32_t>(c.chunk);
  h.lanes_used = static_cast<uint32_t>(c.lanes_used);
  h.epoch = f.epoch();
  const auto* hb = reinterpret_cast<const std::byte*>(&h);
  const MemDesc slot{peer, lay.slot_off(me, l, seq), lay.slot_stride()};
  const SignalRef seq_word{peer, slot.offset + kSlotSeqOffset};
  constexpr uint64_t kAfterSeq = kSlotSeqOffset + 8;
  t.put(slot, 0, hb, kSlotSeqOffset);  // never the seq word itself with a plain store
  if (n <= kInlineBytes) {             // small: one cache line carries header, data and seq
    copy_bytes(h.inline_data, data, n);
    t.put_with_signal(slot, kAfterSeq, hb + kAfterSeq, kLine - kAfterSeq, seq_word, seq + 1);
  } else {
    t.put(slot, kAfterSeq, hb + kAfterSeq, kLine - kAfterSeq - kInlineBytes);
    t.put_with_signal(slot, kLine, data, n, seq_word, seq + 1);
  }
  t.put_with_signal(MemDesc{}, 0, nullptr, 0, SignalRef{peer, lay.tail_off(me, l)}, seq + 1);
}

struct LaneStep {
  bool moved = false;
  Status error;
};

// Sends what the ring allows on one lane. Safe concurrently for different lanes of one op.
// known_head: a lower bound of head(peer, l) seen earlier, so that a send into a ring with room
// does not reload the ACK line the receiver just wrote (a cache miss on the latency path).
LaneStep send_lane(Fabric& f, Transport& t, P2pOp& op, int l, uint64_t& known_head) {
  LaneStep r;
  LaneCursor& c = op.lanes[static_cast<size_t>(l)];
  const ArenaLayout& lay = f.layout();
  const uint64_t S = static_cast<uint64_t>(lay.cfg.ring_slots);
  const int me = f.rank();
  const SignalRef head{me, lay.head_off(op.peer, l)};
  while (c.next < c.count) {
    const uint64_t seq = c.seq0 + c.next;
    if (seq >= S && known_head < seq - S + 1) {
      if (t.test_signal(head, seq - S + 1) != OpState::kDone) break;  // ring full
      known_head = seq - S + 1;
    }
    const uint64_t chunk = c.next * static_cast<uint64_t>(op.plan.lanes_used) + l;
    const uint64_t off = chunk * op.plan.chunk_bytes;
    const uint64_t n = std::min(op.plan.chunk_bytes, op.total - std::min(off, op.total));
    publish_chunk(f, t, op.peer, l, seq,
                  ChunkHeader{op.event, op.total, op.plan.chunk_bytes, chunk, op.plan.lanes_used},
                  op.buf + off, n);
    ++c.next;
    op.moved.fetch_add(n, std::memory_order_relaxed);
    r.moved = true;
  }
  if (c.next == c.count && !c.acked && t.test_signal(head, c.seq0 + c.count) == OpState::kDone) {
    c.acked = true;
    known_head = std::max(known_head, c.seq0 + c.count);
    r.moved = true;
  }
  return r;
}

// Copies out what has arrived on one lane and ACKs it.
LaneStep recv_lane(Fabric& f, Transport& t, P2pOp& op, int l) {
  LaneStep r;
  LaneCursor& c = op.lanes[static_cast<size_t>(l)];
  const ArenaLayout& lay = f.layout();
  const int me = f.rank();
  const SignalRef tail{me, lay.tail_off(op.peer, l)};
  while (c.next < c.count) {
    const uint64_t seq = c.seq0 + c.next;
    if (t.test_signal(tail, seq + 1) != OpState::kDone) break;
    const MemDesc slot{me, lay.slot_off(op.peer, l, seq), lay.slot_stride()};
    SlotHeader h;
    t.get(&h, slot, 0, sizeof(h));
    const uint64_t chunk = c.next * static_cast<uint64_t>(op.plan.lanes_used) + l;
    if (h.event_id != op.event || h.chunk_id != chunk || h.total_bytes != op.total) {
      r.error = f.poison({f.epoch(), op.peer, PoisonReason::kProtocol, OpKind::kRecv, me});
      return r;
    }
    const uint64_t off = chunk * op.plan.chunk_bytes;
    const uint64_t n = std::min(op.plan.chunk_bytes, op.total - std::min(off, op.total));
    if (!op.too_small) {
      if (n <= kInlineBytes)
        copy_bytes(op.buf + off, h.inline_data, n);
      else
        t.get(op.buf + off, slot, kLine, n);
    }
    t.put_with_signal(MemDesc{}, 0, nullptr, 0, SignalRef{op.peer, lay.head_off(me, l)}, seq + 1);
    ++c.next;
    op.moved.fetch_add(n, std::memory_order_relaxed);
    r.moved = true;
  }
  return r;
}

// Reads the first header of the next message on lane 0 and assigns the recv its lanes.
// Returns false if the message has not arrived yet.
Result<bool> plan_recv(Fabric& f, Transport& t, P2pOp& op, std::vector<uint64_t>& next) {
  const ArenaLayout& lay = f.layout();
  const int me = f.rank();
  const size_t L = static_cast<size_t>(lay.cfg.lanes);
  const size_t base = static_cast<size_t>(op.peer) * L;
  const uint64_t seq = next[base];
  if (t.test_signal(SignalRef{me, lay.tail_off(op.peer, 0)}, seq + 1) != OpState::kDone)
    return false;
  SlotHeader h;
  t.get(&h, MemDesc{me, lay.slot_off(op.peer, 0, seq), lay.slot_stride()}, 0, sizeof(h));
  const ChunkPlan expect = plan_chunks(h.total_bytes, static_cast<int>(h.lanes_used),
                                       h.chunk_bytes ? h.chunk_bytes : kLine);
  if (h.event_id != op.event || h.chunk_id != 0 || h.lanes_used < 1 ||
      h.lanes_used > static_cast<uint32_t>(lay.cfg.lanes) || h.chunk_bytes > lay.cfg.slot_bytes ||
      (h.total_bytes != 0 && expect.chunk_bytes != h.chunk_bytes)) {
    return f.poison({f.epoch(), op.peer, PoisonReason::kProtocol, OpKind::kRecv, me});
  }
  op.total = h.total_bytes;
  op.too_small = op.total > op.len;
  op.plan.chunk_bytes = h.chunk_bytes;
  op.plan.n_chunks = op.total == 0 ? 1 : (op.total + h.chunk_bytes - 1) / h.chunk_bytes;
  op.plan.lanes_used = static_cast<int>(h.lanes_used);
  for (int l = 0; l < op.plan.lanes_used; ++l) {
    LaneCursor& c = op.lanes[static_cast<size_t>(l)];
    c.seq0 = next[base + static_cast<size_t>(l)];
    c.count = lane_chunk_count(op.plan, l);
    next[base + static_cast<size_t>(l)] += c.count;
  }
  op.assigned = true;
  return true;
}

void assign_send(const ArenaLayout& lay, P2pOp& op, int lanes, std::vector<uint64_t>& next) {
  op.total = op.len;
  op.plan = plan_chunks(op.total, lanes, lay.cfg.slot_bytes);
  const size_t base = static_cast<size_t>(op.peer) * static_cast<size_t>(lay.cfg.lanes);
  for (int l = 0; l < op.plan.lanes_used; ++l) {
    LaneCursor& c = op.lanes[static_cast<size_t>(l)];
    c.seq0 = next[base + static_cast<size_t>(l)];
    c.count = lane_chunk_count(op.plan, l);
    next[base + static_cast<size_t>(l)] += c.count;
  }
  op.assigned = true;
}

void finish(P2pOp& op, Status st, OpState state) {
  op.status = std::move(st);
  op.state.store(state, std::memory_order_release);
}

}  // namespace

bool P2p::progress_locked() {
  bool moved = false;
  Status failure;
  // Deadlines of poll()-driven ops are checked every 64th pass (waits check their own).
  const int64_t now = (++progress_calls_ & 63) == 0 ? now_ns() : 0;
  for (int p = 0; p < f_.world_size() && failure.ok(); ++p) {
    for (int dir = 0; dir < 2 && failure.ok(); ++dir) {
      auto& q = (dir == 0 ? send_q_ : recv_q_)[static_cast<size_t>(p)];
      uint64_t blocked = 0;  // lanes on which an earlier op still has chunks to move
      bool unplanned_before = false;
      for (auto& h : q) {
        P2pOp& op = *h;
        if (!op.assigned) {
          if (unplanned_before) break;
          if (op.is_send) {
            assign_send(f_.layout(), op, opts_.lanes, send_next_);
          } else {
            Result<bool> planned = plan_recv(f_, t_, op, recv_next_);
            if (!planned.ok()) {
              failure = planned.status();
              break;
            }
            if (!*planned) {
              unplanned_before = true;
              continue;
            }
          }
          moved = true;
        }
        for (int l = 0; l < op.plan.lanes_used; ++l) {
          if (blocked & (1ull << l)) continue;
          LaneStep s = op.is_send ? send_lane(f_, t_, op, l, known_head_[head_index(op.peer, l)])
                                  : recv_lane(f_, t_, op, l);
          if (!s.error.ok()) {
            failure = s.error;
            break;
          }
          moved |= s.moved;
          const LaneCursor& c = op.lanes[static_cast<size_t>(l)];
          if (c.next < c.count) blocked |= 1ull << l;
        }
        if (!failure.ok()) break;
        if (lanes_finished(op)) {
          Status st = op.too_small ? invalid_argument(
                                         "xccl recv from peer {} event {}: message of {} bytes "
                                         "does not fit the {}-byte buffer (drained)",
                                         op.peer, op.event, op.total, op.len)
                                   : Status::ok_status();
          if (op.mode == Progress::kBackground) --background_ops_;
          finish(op, std::move(st), OpState::kDone);
        } else if (now != 0 && now > op.deadline_ns) {
          failure = f_.poison({f_.epoch(), op.peer, PoisonReason::kSilent,
                               op.is_send ? OpKind::kSend : OpKind::kRecv, f_.rank()});
          break;
        }
      }
      std::erase_if(q, [](const P2pHandle& h) {
        return h->state.load(std::memory_order_relaxed) != OpState::kInProgress;
      });
    }
  }
  if (failure.ok() && f_.poison_word() != 0) failure = check_poison(f_);
  if (!failure.ok()) {
    for (auto* qs : {&send_q_, &recv_q_})
      for (auto& q : *qs) {
        for (auto& h : q) finish(*h, failure, OpState::kFailed);
        q.clear();
      }
    background_ops_ = 0;
  }
  return moved;
}

OpState P2p::poll(const P2pHandle& h) {
  OpState s = h->state.load(std::memory_order_acquire);
  if (s != OpState::kInProgress) return s;
  std::lock_guard<std::mutex> lock(mu_);
  progress_locked();
  return h->state.load(std::memory_order_acquire);
}

Status P2p::status(const P2pHandle& h) const {
  if (h->state.load(std::memory_order_acquire) == OpState::kInProgress) return Status::ok_status();
  return h->status;
}

OpState P2p::state(const P2pHandle& h) const {
  return h->state.load(std::memory_order_acquire);
}

uint64_t P2p::bytes(const P2pHandle& h) const {
  return h->moved.load(std::memory_order_relaxed);
}

Status P2p::cancel(const P2pHandle& h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (h->state.load(std::memory_order_acquire) != OpState::kInProgress)
    return failed_precondition("xccl cancel: operation is already {}",
                               op_state_name(h->state.load()));
  if (h->assigned)
    return failed_precondition("xccl cancel: {} with peer {} event {} has started moving data",
                               h->is_send ? "send" : "recv", h->peer, h->event);
  auto& q = (h->is_send ? send_q_ : recv_q_)[static_cast<size_t>(h->peer)];
  std::erase(q, h);
  if (h->mode == Progress::kBackground) --background_ops_;
  finish(*h,
         cancelled("xccl {} with peer {} event {} cancelled", h->is_send ? "send" : "recv", h->peer,
                   h->event),
         OpState::kCancelled);
  return Status::ok_status();
}

Status P2p::wait(const P2pHandle& h) {
  std::unique_lock<std::mutex> lock(mu_);
  return wait_locked(h, lock);
}

Status P2p::wait_locked(const P2pHandle& h, std::unique_lock<std::mutex>& lock) {
  WaitCtx ctx{h->is_send ? OpKind::kSend : OpKind::kRecv, h->deadline_ns, opts_.backoff};
  auto& q = (h->is_send ? send_q_ : recv_q_)[static_cast<size_t>(h->peer)];
  // Parallel lanes on the pool when h is alone on its pair (the common synchronous case).
  size_t pending = 0;
  for (auto* qs : {&send_q_, &recv_q_})
    for (auto& other : *qs) pending += other.size();
  if (opts_.pool != nullptr && opts_.pool->num_threads() > 1 && pending == 1 && q.front() == h &&
      h->state.load() == OpState::kInProgress) {
    if (!h->assigned) {
      if (h->is_send) {
        assign_send(f_.layout(), *h, opts_.lanes, send_next_);
      } else {
        detail::WaitLoop loop(f_, ctx);
        while (true) {
          Result<bool> planned = plan_recv(f_, t_, *h, recv_next_);
          Status st = planned.ok() ? Status::ok_status() : planned.status();
          if (st.ok() && *planned) break;
          if (st.ok()) st = loop.idle(h->peer);
          if (!st.ok()) {
            progress_locked();
            return st;
          }
        }
      }
    }
    if (h->plan.lanes_used > 1) {
      const int T = opts_.pool->num_threads();
      std::vector<Status> errs(static_cast<size_t>(T));
      P2pOp& op = *h;
      opts_.pool->run_on_all([&](int ti) {
        for (int l = ti; l < op.plan.lanes_used; l += T) {
          detail::WaitLoop loop(f_, ctx);
          const LaneCursor& c = op.lanes[static_cast<size_t>(l)];
          while (c.next < c.count || (op.is_send && !c.acked)) {
            LaneStep s = op.is_send ? send_lane(f_, t_, op, l, known_head_[head_index(op.peer, l)])
                                    : recv_lane(f_, t_, op, l);
            Status st =
                s.error.ok() ? (s.moved ? Status::ok_status() : loop.idle(op.peer)) : s.error;
            if (!st.ok()) {
              errs[static_cast<size_t>(ti)] = st;
              return;
            }
            if (s.moved) loop.progressed();
          }
        }
      });
      for (auto& e : errs)
        if (!e.ok()) {
          progress_locked();
          return h->state.load() == OpState::kInProgress ? e : h->status;
        }
    }
  }
  detail::WaitLoop loop(f_, ctx);
  while (true) {
    bool moved = progress_locked();
    if (h->state.load(std::memory_order_acquire) != OpState::kInProgress) return h->status;
    if (moved) {
      loop.progressed();
      continue;
    }
    lock.unlock();
    Status st = loop.idle(h->peer);
    lock.lock();
    if (!st.ok()) {
      progress_locked();  // fails every queued op with the poison status
      if (h->state.load() == OpState::kInProgress) finish(*h, st, OpState::kFailed);
      return h->status;
    }
  }
}

void P2p::background_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    bg_cv_.wait(lock, [&] { return stop_ || background_ops_ > 0; });
    if (stop_) return;
    WaitCtx ctx{OpKind::kSend, kNoDeadline, opts_.backoff};
    detail::WaitLoop loop(f_, ctx);
    while (!stop_ && background_ops_ > 0) {
      if (progress_locked()) {
        loop.progressed();
        continue;
      }
      lock.unlock();
      // Deadlines of the ops themselves are checked in progress_locked(); the loop only naps.
      Status st = loop.idle(-1);
      lock.lock();
      if (!st.ok()) progress_locked();
    }
  }
}

bool P2p::idle_locked() const {
  if (background_ops_ != 0) return false;
  for (const auto* qs : {&send_q_, &recv_q_})
    for (const auto& q : *qs)
      if (!q.empty()) return false;
  return true;
}

template <typename Probe>
bool P2p::spin_until(Probe&& probe) const {
  if (probe()) return true;
  const int64_t start = now_ns();
  for (uint32_t i = 1;; ++i) {
    detail::cpu_relax();
    if (probe()) return true;
    if ((i & 63) == 0 &&
        (f_.poison_word() != 0 || now_ns() - start > opts_.backoff.spin_ns))
      return false;  // the generic path takes over (deadline, yield, futex, poison)
  }
}

std::optional<Status> P2p::send_small(int peer, uint64_t event, std::span<const std::byte> src) {
  if (peer < 0 || peer >= f_.world_size() || peer == f_.rank()) return std::nullopt;
  const ArenaLayout& lay = f_.layout();
  const ChunkPlan plan = plan_chunks(src.size(), opts_.lanes, lay.cfg.slot_bytes);
  if (plan.n_chunks != 1) return std::nullopt;
  std::unique_lock<std::mutex> lock(mu_);
  if (!idle_locked()) return std::nullopt;
  if (f_.poison_word() != 0) return check_poison(f_);
  const uint64_t S = static_cast<uint64_t>(lay.cfg.ring_slots);
  const size_t idx = head_index(peer, 0);
  const uint64_t seq = send_next_[idx];
  const SignalRef head{f_.rank(), lay.head_off(peer, 0)};
  if (seq >= S && known_head_[idx] < seq - S + 1) {
    if (t_.test_signal(head, seq - S + 1) != OpState::kDone) return std::nullopt;  // ring full
    known_head_[idx] = seq - S + 1;
  }
  publish_chunk(f_, t_, peer, 0, seq, ChunkHeader{event, src.size(), plan.chunk_bytes, 0, 1},
                src.data(), src.size());
  send_next_[idx] = seq + 1;
  if (spin_until([&] { return t_.test_signal(head, seq + 1) == OpState::kDone; })) {
    known_head_[idx] = seq + 1;
    return Status::ok_status();
  }
  // No ACK yet: hand over to the generic engine as an op whose only chunk is published.
  auto op = std::make_shared<P2pOp>();
  op->is_send = true;
  op->peer = peer;
  op->event = event;
  op->len = op->total = src.size();
  op->deadline_ns = deadline_after_ms(opts_.timeout_ms);
  op->plan = plan;
  op->lanes.resize(static_cast<size_t>(lay.cfg.lanes));
  op->lanes[0] = LaneCursor{seq, 1, 1, false};
  op->assigned = true;
  op->moved.store(src.size(), std::memory_order_relaxed);
  send_q_[static_cast<size_t>(peer)].push_back(op);
  return wait_locked(op, lock);
}

std::optional<Result<uint64_t>> P2p::recv_small(int peer, uint64_t event,
                                                std::span<std::byte> dst) {
  if (peer < 0 || peer >= f_.world_size() || peer == f_.rank()) return std::nullopt;
  std::unique_lock<std::mutex> lock(mu_);
  if (!idle_locked()) return std::nullopt;
  if (f_.poison_word() != 0) return check_poison(f_);
  const ArenaLayout& lay = f_.layout();
  const int me = f_.rank();
  const size_t idx = head_index(peer, 0);
  const uint64_t seq = recv_next_[idx];
  const MemDesc slot{me, lay.slot_off(peer, 0, seq), lay.slot_stride()};
  const SignalRef seq_word{me, slot.offset + kSlotSeqOffset};
  if (!spin_until([&] { return t_.test_signal(seq_word, seq + 1) == OpState::kDone; }))
    return std::nullopt;
  SlotHeader h;
  t_.get(&h, slot, 0, sizeof(h));
  // Anything but a whole one-chunk message for this recv goes the generic way (which checks,
  // drains or poisons); nothing has been consumed yet.
  const uint64_t n = h.total_bytes;
  if (h.event_id != event || h.chunk_id != 0 || h.lanes_used != 1 || n > dst.size() ||
      h.chunk_bytes > lay.cfg.slot_bytes || n > std::max<uint64_t>(h.chunk_bytes, 0) ||
      plan_chunks(n, 1, h.chunk_bytes ? h.chunk_bytes : kLine).chunk_bytes != h.chunk_bytes)
    return std::nullopt;
  if (n <= kInlineBytes)
    copy_bytes(dst.data(), h.inline_data, n);
  else
    t_.get(dst.data(), slot, kLine, n);
  t_.put_with_signal(MemDesc{}, 0, nullptr, 0, SignalRef{peer, lay.head_off(me, 0)}, seq + 1);
  recv_next_[idx] = seq + 1;
  return n;
}

Status P2p::send(int peer, uint64_t event, std::span<const std::byte> src) {
  if (auto fast = send_small(peer, event, src)) return *fast;
  XDS_ASSIGN_OR_RETURN(P2pHandle h, send_async(peer, event, src));
  return wait(h);
}

Result<uint64_t> P2p::recv(int peer, uint64_t event, std::span<std::byte> dst) {
  if (auto fast = recv_small(peer, event, dst)) return *fast;
  XDS_ASSIGN_OR_RETURN(P2pHandle h, recv_async(peer, event, dst));
  XDS_RETURN_IF_ERROR(wait(h));
  return h->total;
}

Status P2p::put(const MemDesc& dst, uint64_t off, std::span<const std::byte> src, int index,
                uint64_t value) {
  XDS_RETURN_IF_ERROR(check_poison(f_));
  if (dst.rank < 0 || dst.rank >= f_.world_size() || off + src.size() > dst.bytes)
    return invalid_argument("xccl put: {} bytes at offset {} do not fit rank {}'s {}-byte buffer",
                            src.size(), off, dst.rank, dst.bytes);
  if (index < 0 || index >= f_.layout().cfg.signals_per_peer)
    return invalid_argument("xccl put: signal index {} outside [0, {})", index,
                            f_.layout().cfg.signals_per_peer);
  t_.put_with_signal(dst, off, src.data(), src.size(),
                     SignalRef{dst.rank, f_.layout().signal_off(f_.rank(), index)}, value);
  return Status::ok_status();
}

Status P2p::wait_signal(int from, int index, uint64_t value) {
  if (from < 0 || from >= f_.world_size() || index < 0 || index >= f_.layout().cfg.signals_per_peer)
    return invalid_argument("xccl wait_signal: peer {} / index {} out of range", from, index);
  const SignalRef sig{f_.rank(), f_.layout().signal_off(from, index)};
  WaitCtx ctx{OpKind::kWaitSignal, deadline_after_ms(opts_.timeout_ms), opts_.backoff};
  return wait_until(f_, ctx,
                    [&] { return t_.test_signal(sig, value) == OpState::kDone ? kReady : from; });
}

Status P2p::get(std::span<std::byte> dst, const MemDesc& src, uint64_t off) {
  XDS_RETURN_IF_ERROR(check_poison(f_));
  if (src.rank < 0 || src.rank >= f_.world_size() || off + dst.size() > src.bytes)
    return invalid_argument("xccl get: {} bytes at offset {} exceed rank {}'s {}-byte buffer",
                            dst.size(), off, src.rank, src.bytes);
  t_.get(dst.data(), src, off, dst.size());
  return Status::ok_status();
}

}  // namespace xds::xccl
