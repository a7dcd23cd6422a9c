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

void Mailbox::post(int to, Channel ch, uint64_t key, const MailWords& words) {
  const uint64_t seq = ++sent_[size_t(static_cast<int>(ch) * f_.world_size() + to)];
  struct {
    uint64_t key;
    MailWords words;
  } payload{key, words};
  static_assert(sizeof(payload) == kLine - 8);
  const uint64_t off = f_.layout().mailbox_off(ch, f_.rank());
  t_.put_with_signal(MemDesc{to, off, kLine}, 8, &payload, sizeof(payload), SignalRef{to, off},
                     seq);
}

Status Mailbox::wait_all(std::span<const int> from, Channel ch, uint64_t key, const WaitCtx& ctx,
                         std::span<MailWords> words_out) {
  const int W = f_.world_size();
  const uint64_t base = f_.layout().mailbox_off(ch, 0);
  size_t done = 0;  // from[0, done) have arrived
  XDS_RETURN_IF_ERROR(wait_until(f_, ctx, [&] {
    for (; done < from.size(); ++done) {
      const int p = from[done];
      const uint64_t want = seen_[size_t(static_cast<int>(ch) * W + p)] + 1;
      if (t_.test_signal(SignalRef{f_.rank(), base + kLine * uint64_t(p)}, want) != OpState::kDone)
        return p;
    }
    return kReady;
  }));
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
  for (int p : peers) mb.post(p, ch, key, mine);
  return mb.wait_all(peers, ch, key, ctx, out);
}

}  // namespace xds::xccl
