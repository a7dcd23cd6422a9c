// Mailbox: small keyed messages between devices, one MailboxLine per (channel, writer) in the
// reader's arena (layout.h). post() writes key + payload, then publishes seq (release) and rings
// the reader; wait() acquires seq, checks the key and copies the payload.
//
// Sequence numbers are counted per (channel, peer) on both sides, so a Mailbox must live as
// long as the fabric: create one per device and hand it to every collective (Exchange, A2e).
// A key mismatch means the devices are out of step: the epoch is poisoned naming the peer.
//
// Thread-safety: not thread-safe; one thread per device drives collectives.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "xccl/fabric.h"
#include "xccl/transport.h"
#include "xccl/wait.h"

namespace xds::xccl {

using MailWords = std::array<uint64_t, 6>;

class Mailbox {
 public:
  Mailbox(Fabric& f, Transport& t);

  void post(int to, Channel ch, uint64_t key, const MailWords& words);
  // Waits for the next message from every rank in `from` (self excluded by the caller);
  // words_out[i] receives from[i]'s payload (may be empty when not needed).
  Status wait_all(std::span<const int> from, Channel ch, uint64_t key, const WaitCtx& ctx,
                  std::span<MailWords> words_out = {});

  Fabric& fabric() { return f_; }
  Transport& transport() { return t_; }
  // kBarrier / kBarrierOdd alternately; every device runs the same sequence of barriers.
  Channel next_barrier_channel() {
    return (barriers_++ & 1) ? Channel::kBarrierOdd : Channel::kBarrier;
  }

 private:
  MailboxLine& line(int owner, Channel ch, int writer) const;
  Fabric& f_;
  Transport& t_;
  std::vector<uint64_t> sent_;  // [channel * W + to]
  std::vector<uint64_t> seen_;  // [channel * W + from]
  uint64_t barriers_ = 0;
};

// Every rank in `peers` (self excluded) posts to every other and waits for all (kBarrier).
Status barrier(Mailbox& mb, std::span<const int> peers, uint64_t key, const WaitCtx& ctx);
// The step header exchange of "devices step together": every device posts `mine` (epoch-local
// step, tokens, MoE passes, map version, abort flag, ... as the caller defines) and receives
// every peer's; out[i] is peers[i]'s words. Barriers alternate between two channels: a peer
// that left barrier k may post k+1 before everyone read k, but cannot reach k+2.
Status allgather_words(Mailbox& mb, std::span<const int> peers, uint64_t key, const MailWords& mine,
                       const WaitCtx& ctx, std::span<MailWords> out);

// Collective key (epoch, step, layer, phase): every device must present the same one.
inline uint64_t collective_key(uint32_t epoch, uint32_t step, uint16_t layer, uint16_t phase) {
  return (uint64_t(epoch & 0xFFFF) << 48) | (uint64_t(step & 0xFFFFFF) << 24) |
         (uint64_t(layer & 0xFFF) << 12) | uint64_t(phase & 0xFFF);
}

}  // namespace xds::xccl
