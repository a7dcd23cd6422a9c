#include "xccl/mailbox.h"

#include <cstring>

#include "base/log.h"

namespace xds::xccl {

Mailbox::Mailbox(Fabric& f, Transport& t) : f_(f), t_(t) {
  const size_t n = size_t(kMailboxChannels) * size_t(f.world_size());
  sent_.assign(n, 0);
  seen_.assign(n, 0);
  // Continue from what this device already published (it is the only writer of those lines).
  for (int c = 0; c < kMailboxChannels; ++c)
    for (int p = 0; p < f.world_size(); ++p)
      sent_[size_t(c * f.world_size() + p)] =
          line(p, static_cast<Channel>(c), f.rank()).seq.load(std::memory_order_acquire);
}

MailboxLine& Mailbox::line(int owner, Channel ch, int writer) const {
  return *reinterpret_cast<MailboxLine*>(f_.arena(owner) + f_.layout().mailbox_off(ch, writer));
}

OpState Mailbox::post(int to, Channel ch, uint64_t key, const MailWords& words) {
  const uint64_t seq = ++sent_[size_t(static_cast<int>(ch) * f_.world_size() + to)];
  struct {
    uint64_t key;
    MailWords words;
  } payload{key, words};
  static_assert(sizeof(payload) == kLine - 8);
  const uint64_t off = f_.layout().mailbox_off(ch, f_.rank());
  return t_.put_with_signal(MemDesc{to, off, kLine}, 8, &payload, sizeof(payload),
                            SignalRef{to, off}, seq);
}

int Mailbox::abandoned_by() const {
  for (int p = 0; p < f_.world_size(); ++p)
    if (p != f_.rank() &&
        (line(f_.rank(), Channel::kAbandon, p).seq.load(std::memory_order_acquire) >> 1) == watch_)
      return p;
  return -1;
}

Status Mailbox::mark_abandon(uint64_t value, const WaitCtx& ctx) {
  const int W = f_.world_size(), me = f_.rank();
  const uint64_t mine = f_.layout().mailbox_off(Channel::kAbandon, me);
  for (int p = 0; p < W; ++p) {
    if (p == me) continue;
    const OpState s = t_.put_with_signal(MemDesc{}, 0, nullptr, 0, SignalRef{p, mine}, value);
    if (op_failed(s)) {
      XDS_LOG_ERROR("xccl rank {}: abort marker {:#x} to rank {}: {}", me, value, p,
                    op_state_name(s));
      return f_.poison({f_.epoch(), p, PoisonReason::kTransport, ctx.op, me});
    }
  }
  const uint64_t base = f_.layout().mailbox_off(Channel::kAbandon, 0);
  return wait_until(f_, ctx, [&] {
    for (int p = 0; p < W; ++p)
      if (p != me &&
          t_.test_signal(SignalRef{me, base + kLine * uint64_t(p)}, value) != OpState::kDone)
        return p;
    return kReady;
  });
}

Status Mailbox::abandon(uint64_t tag, const WaitCtx& ctx) {
  XDS_CHECK(tag != 0 && tag < (uint64_t(1) << 63), "Mailbox::abandon: attempt tag {:#x}", tag);
  watch_ = 0;
  // 1. Stopped: after every message of the attempt this device posted (release); then every
  //    peer's, so nobody posts anything of the attempt any more.
  XDS_RETURN_IF_ERROR(mark_abandon(tag << 1, ctx));
  // 2. Sequence numbers from the lines: what reached each peer, what each peer published
  //    here (the messages of the attempt nobody read are skipped).
  const int W = f_.world_size(), me = f_.rank();
  for (int c = 0; c < kMailboxChannels; ++c) {
    if (static_cast<Channel>(c) == Channel::kAbandon) continue;
    for (int p = 0; p < W; ++p) {
      if (p == me) continue;
      const size_t i = size_t(c * W + p);
      sent_[i] = line(p, static_cast<Channel>(c), me).seq.load(std::memory_order_acquire);
      seen_[i] = line(me, static_cast<Channel>(c), p).seq.load(std::memory_order_acquire);
    }
  }
  barriers_ = 0;
  // 3. Re-read: only once every device has may anyone post the next attempt's messages
  //    (one posted earlier would be counted as read by a device still re-reading).
  return mark_abandon((tag << 1) | 1, ctx);
}

Status Mailbox::wait_all(std::span<const int> from, Channel ch, uint64_t key, const WaitCtx& ctx,
                         std::span<MailWords> words_out) {
  const int W = f_.world_size();
  const uint64_t base = f_.layout().mailbox_off(ch, 0);
  size_t done = 0;  // from[0, done) have arrived
  int abandoned = -1;
  XDS_RETURN_IF_ERROR(wait_until(f_, ctx, [&] {
    if (watch_ != 0 && (abandoned = abandoned_by()) >= 0) return kReady;
    for (; done < from.size(); ++done) {
      const int p = from[done];
      const uint64_t want = seen_[size_t(static_cast<int>(ch) * W + p)] + 1;
      if (t_.test_signal(SignalRef{f_.rank(), base + kLine * uint64_t(p)}, want) != OpState::kDone)
        return p;
    }
    return kReady;
  }));
  if (abandoned >= 0)
    return xds::abandoned(
        "xccl rank {}: step attempt {:#x} abandoned (marker of rank {}) during {}", f_.rank(),
        watch_, abandoned, op_kind_name(ctx.op));
  for (size_t i = 0; i < from.size(); ++i) {
    const int p = from[i];
    uint64_t& seen = seen_[size_t(static_cast<int>(ch) * W + p)];
    ++seen;
    const MailboxLine& l = line(f_.rank(), ch, p);
    const uint64_t seq = l.seq.load(std::memory_order_acquire);
    if (seq != seen || l.key != key) {
      // The detail goes to the log; the returned status is the shared poison message.
      XDS_LOG_ERROR(
          "xccl rank {}: channel {} expected seq {} key {:#x}, peer {} sent seq {} key {:#x}",
          f_.rank(), static_cast<int>(ch), seen, key, p, seq, l.key);
      return f_.poison({f_.epoch(), p, PoisonReason::kProtocol, ctx.op, f_.rank()});
    }
    if (!words_out.empty()) std::memcpy(words_out[i].data(), l.words, sizeof(MailWords));
  }
  return Status::ok_status();
}

Status barrier(Mailbox& mb, std::span<const int> peers, uint64_t key, const WaitCtx& ctx) {
  return allgather_words(mb, peers, key, MailWords{}, ctx, {});
}

Status allgather_words(Mailbox& mb, std::span<const int> peers, uint64_t key, const MailWords& mine,
                       const WaitCtx& ctx, std::span<MailWords> out) {
  const Channel ch = mb.next_barrier_channel();
  Fabric& f = mb.fabric();
  for (int p : peers) {
    const OpState s = mb.post(p, ch, key, mine);
    if (op_failed(s)) {
      XDS_LOG_ERROR("xccl rank {}: barrier post to rank {}: {}", f.rank(), p, op_state_name(s));
      return f.poison({f.epoch(), p, PoisonReason::kTransport, ctx.op, f.rank()});
    }
  }
  return mb.wait_all(peers, ch, key, ctx, out);
}

}  // namespace xds::xccl
