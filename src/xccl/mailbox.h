// Mailbox: small keyed messages between devices, one MailboxLine per (channel, writer) in the
// reader's arena (layout.h). post() writes key + payload, then publishes seq (release) and rings
// the reader; wait() acquires seq, checks the key and copies the payload.
//
// Sequence numbers are counted per (channel, peer) on both sides, so a Mailbox must live as
// long as the fabric: create one per device and hand it to every collective (Exchange, A2e).
// A key mismatch means the devices are out of step: the epoch is poisoned naming the peer.
//
// Abandoning a step attempt (a transient error: a transport operation failed, or a fault was
// injected) without poisoning the epoch; every device of the fabric takes part. The seq word
// of the kAbandon line that device p owns in each peer's arena is its marker (release
// stores, only ever growing): 2·tag once p stopped posting messages of attempt `tag`,
// 2·tag + 1 once p re-read its sequence numbers after it.
//   1. The device that cannot go on calls abandon(tag): it stores 2·tag into every peer's
//      arena -- "I gave this attempt up and post nothing more of it".
//   2. A peer whose wait_all() runs under watch(tag) ends that wait with Abandoned as soon as
//      some peer's marker names tag (not at its deadline), and calls abandon(tag) as well.
//   3. abandon() waits for every peer's 2·tag: nobody posts messages of the attempt any
//      more. It re-reads its sequence numbers from the lines (sent_ from its lines in the
//      peers' arenas: a failed post left one out; seen_ from the lines in its own arena: every
//      message of the attempt nobody read is skipped), restarts the barrier parity, stops
//      watching, stores 2·tag + 1 and waits for every peer's: nobody posts the next
//      attempt's messages before every device re-read. The next attempt starts clean, and its
//      keys differ (a stale message that slipped through would poison as out of step, never
//      be taken).
// An attempt's tag (attempt_tag) orders like (step, attempt). A failure inside abandon()
// itself (a marker that cannot be written, a peer that never answers) poisons the epoch, as
// does a failed post of a barrier: those have no attempt to give up.
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

  // The transport's state of the write (kFailed: nothing of it reached `to`).
  OpState post(int to, Channel ch, uint64_t key, const MailWords& words);
  // Waits for the next message from every rank in `from` (self excluded by the caller);
  // words_out[i] receives from[i]'s payload (may be empty when not needed). Under watch(tag),
  // Abandoned once some peer abandoned attempt `tag` (see above).
  Status wait_all(std::span<const int> from, Channel ch, uint64_t key, const WaitCtx& ctx,
                  std::span<MailWords> words_out = {});

  // The step attempt this device is in (0: none): wait_all() ends when a peer abandons it.
  void watch(uint64_t tag) { watch_ = tag; }
  uint64_t watched() const { return watch_; }
  // Gives attempt `tag` up together with every peer (steps 1 and 3 above); ok once every
  // device stopped, the sequence numbers are in step again and nothing is watched. A poison
  // status when a marker cannot be written or a peer does not answer by ctx's deadline.
  Status abandon(uint64_t tag, const WaitCtx& ctx);

  Fabric& fabric() { return f_; }
  Transport& transport() { return t_; }
  // kBarrier / kBarrierOdd alternately; every device runs the same sequence of barriers.
  Channel next_barrier_channel() {
    return (barriers_++ & 1) ? Channel::kBarrierOdd : Channel::kBarrier;
  }

 private:
  MailboxLine& line(int owner, Channel ch, int writer) const;
  // The first peer whose marker in this arena names watch_, or -1.
  int abandoned_by() const;
  // Stores `value` into this device's marker in every peer's arena, then waits until every
  // peer's marker here is >= value.
  Status mark_abandon(uint64_t value, const WaitCtx& ctx);
  Fabric& f_;
  Transport& t_;
  std::vector<uint64_t> sent_;  // [channel * W + to]
  std::vector<uint64_t> seen_;  // [channel * W + from]
  uint64_t barriers_ = 0;
  uint64_t watch_ = 0;  // attempt tag, 0: none
};

// Every rank in `peers` (self excluded) posts to every other and waits for all (kBarrier).
// A post that fails poisons the epoch (kTransport).
Status barrier(Mailbox& mb, std::span<const int> peers, uint64_t key, const WaitCtx& ctx);
// The step header exchange of "devices step together": every device posts `mine` (epoch-local
// step, tokens, MoE passes, map version, abort flag, ... as the caller defines) and receives
// every peer's; out[i] is peers[i]'s words. Barriers alternate between two channels: a peer
// that left barrier k may post k+1 before everyone read k, but cannot reach k+2.
Status allgather_words(Mailbox& mb, std::span<const int> peers, uint64_t key, const MailWords& mine,
                       const WaitCtx& ctx, std::span<MailWords> out);

// A step attempt as abandon() names it: ordered like (step, attempt), never 0.
inline uint64_t attempt_tag(uint64_t step, uint32_t attempt) {
  return ((step << 16) | (attempt & 0xFFFF)) + 1;
}

// Collective key (epoch, step, layer, phase): every device must present the same one.
inline uint64_t collective_key(uint32_t epoch, uint32_t step, uint16_t layer, uint16_t phase) {
  return (uint64_t(epoch & 0xFFFF) << 48) | (uint64_t(step & 0xFFFFFF) << 24) |
         (uint64_t(layer & 0xFFF) << 12) | uint64_t(phase & 0xFFF);
}

}  // namespace xds::xccl
