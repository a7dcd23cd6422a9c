// Arena layout: the shared-memory image every device exposes to its peers (P035, P039).
//
// One arena per device (rank r). It is a memfd segment (process fabric) or a heap block
// (thread fabric); every device maps every arena, so a load/store into a peer's arena is the
// one-sided primitive. Rule: a device only ever WAITS on lines of its OWN arena; everything a
// peer must notice is pushed into that peer's arena. Every 64-byte line has exactly one writer.
//
// clang-format off
//   offset                          size  line           writer / reader
//   ──────────────────────────────────────────────────────────────────────────────────────
//   0                               64    IdentityLine   launcher / all (read-only)
//   64                              64    PoisonLine     any device (CAS 0 -> record) / all;
//                                                        rank 0's is the authoritative one
//   128                             64    DoorbellLine   waiters: owner; doorbell: any writer
//   [192, 4096)                           pad
//   ── metadata area ── meta = 4096
//   tail(p, l) = meta + 64*(p*L + l)          TailLine     sender p / owner
//   head(p, l) = tail(W, 0) + 64*(p*L + l)    HeadLine     receiver p (ACK of the owner's
//                                                          sends to p) / owner
//   sig(p, k)  = head(W, 0) + 64*(p*K + k)    SignalLine   p / owner
//   box(c, p)  = sig(W, 0) + 64*(c*W + p)     MailboxLine  p / owner
//   ── managed data area ── managed = align4096(box(C, 0))
//   slot(p, l, s) = managed + (p*L*S + l*S + s) * (64 + B)
//                                             SlotHeader + B payload bytes (<= 24 B ride
//                                             inline in the header line, whose seq word is
//                                             stored last); sender p / owner
//   staging = align4096(slot(W, 0, 0))        G bytes; owner / peers pull
//   ── application area ── app = align4096(staging + G)
//                                             A bytes, registered by the engine (KV blocks)
//   total = align4096(app + A)
// clang-format on
//
// W = world_size, L = lanes, S = ring_slots, B = slot_bytes, K = signals_per_peer,
// C = kMailboxChannels, G = staging_bytes, A = app_bytes. The (p == owner) entries exist but
// are never used (a device never sends to itself through the fabric); keeping them makes every
// index a plain product.
//
// Ring protocol on (sender p -> owner, lane l): sequence numbers are 64-bit and never wrap.
// The sender owns tail(p,l) in the receiver's arena, the receiver owns head(owner,l) in the
// sender's arena, so head and tail sit in different arenas and on different cache lines.
// slot index = seq % S; the sender may write slot seq only when seq - head < S.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace xds::xccl {

inline constexpr uint64_t kArenaMagic = 0x4c43435853445821ull;  // "!XDSXCCL"
// 3: Channel::kAbandon. 4: Channel::kAeStep.
inline constexpr uint32_t kLayoutVersion = 4;
inline constexpr size_t kLine = 64;
inline constexpr size_t kPage = 4096;
inline constexpr int kMaxWorld = 4096;  // poison word stores ranks in 12 bits

inline constexpr uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}
inline constexpr uint64_t align_line(uint64_t x) {
  return align_up(x, kLine);
}

// Mailbox channels (one line per (channel, writer) in the reader's arena).
enum class Channel : uint32_t {
  kDispatchMeta = 0,   // sender -> receiver: counts of a dispatch
  kDispatchDone,       // receiver -> sender: "I have pulled your rows" (sender may reuse)
  kCombineReady,       // expert side -> source: pre-summed vectors ready
  kCombineDone,        // source -> expert side: pulled (expert side may reuse)
  kA2eToTrampoline,    // attention -> trampoline
  kA2eTrampolineDone,  // trampoline -> attention: rows pulled
  kA2eForward,         // trampoline -> expert devices
  kA2eForwardDone,     // expert -> trampoline: rows pulled
  kE2aToTrampoline,    // expert -> trampoline: pre-sums ready
  kE2aTrampolineDone,  // trampoline -> expert: pulled
  kE2aToAttention,     // trampoline -> attention: result ready
  kE2aAttentionDone,   // attention -> trampoline: pulled
  kBarrier,            // barriers / step headers with an even index
  kBarrierOdd,         // ... odd index (double-buffered: a peer may run one barrier ahead)
  kAbandon,            // writer -> reader: not a message; the line's seq word is the writer's
                       // marker of the newest step attempt it abandoned (Mailbox::abandon)
  kAeStep,             // attention leader -> expert devices: the next step of an A/E instance
  kCount,
};
inline constexpr int kMailboxChannels = static_cast<int>(Channel::kCount);

// Sizing of one arena; every device of a fabric uses the same config.
struct ArenaConfig {
  int world_size = 2;
  int lanes = 2;                     // L: copy lanes (AIV analogue) per pair
  int ring_slots = 4;                // S: slots per (pair, lane) ring
  uint64_t slot_bytes = 64 * 1024;   // B: payload bytes per slot, multiple of 64
  int signals_per_peer = 8;          // K: put_with_signal targets per writer
  uint64_t staging_bytes = 1 << 20;  // G: collective staging (managed data area)
  uint64_t app_bytes = 1 << 20;      // A: application area
};

// Checks ranges; error names the field, what was expected and what was found.
Status validate(const ArenaConfig& c);

// Byte offsets of every region; computed by arena_layout(), a pure function of the config.
struct ArenaLayout {
  ArenaConfig cfg;
  uint64_t meta = 0;       // TailLine[W][L]
  uint64_t heads = 0;      // HeadLine[W][L]
  uint64_t signals = 0;    // SignalLine[W][K]
  uint64_t mailboxes = 0;  // MailboxLine[C][W]
  uint64_t managed = 0;    // slots[W][L][S]
  uint64_t staging = 0;
  uint64_t app = 0;
  uint64_t total = 0;

  uint64_t slot_stride() const { return kLine + cfg.slot_bytes; }
  uint64_t tail_off(int p, int l) const { return meta + kLine * (uint64_t(p) * cfg.lanes + l); }
  uint64_t head_off(int p, int l) const { return heads + kLine * (uint64_t(p) * cfg.lanes + l); }
  uint64_t signal_off(int p, int k) const {
    return signals + kLine * (uint64_t(p) * cfg.signals_per_peer + k);
  }
  uint64_t mailbox_off(Channel c, int p) const {
    return mailboxes + kLine * (uint64_t(static_cast<uint32_t>(c)) * cfg.world_size + p);
  }
  uint64_t slot_off(int p, int l, uint64_t seq) const {
    uint64_t s = seq % uint64_t(cfg.ring_slots);
    return managed + slot_stride() * ((uint64_t(p) * cfg.lanes + l) * cfg.ring_slots + s);
  }
};

ArenaLayout arena_layout(const ArenaConfig& c);

// ---- line formats. All atomics are lock-free 64/32-bit words usable across processes. ----

struct alignas(kLine) IdentityLine {
  uint64_t magic;
  uint32_t layout_version;
  int32_t rank;
  int32_t world_size;
  uint32_t epoch;
  uint64_t total_bytes;
};

struct alignas(kLine) PoisonLine {
  std::atomic<uint64_t> word;  // 0 = clean, else encode_poison(); CAS 0 -> value only
};

struct alignas(kLine) DoorbellLine {
  std::atomic<uint32_t> doorbell;  // futex word; any writer increments it when waiters > 0
  std::atomic<uint32_t> waiters;   // owner increments around a futex sleep
};

struct alignas(kLine) ArenaHeader {
  IdentityLine id;
  PoisonLine poison;
  DoorbellLine bell;
};

struct alignas(kLine) TailLine {
  std::atomic<uint64_t> tail;  // chunks published by the sender on this lane (release)
};

struct alignas(kLine) HeadLine {
  std::atomic<uint64_t> head;  // chunks consumed by the receiver on this lane (release) = ACK
};

struct alignas(kLine) SignalLine {
  std::atomic<uint64_t> value;  // put_with_signal: stored with release after the data
};

struct alignas(kLine) MailboxLine {
  std::atomic<uint64_t> seq;  // published last (release); reader waits seq >= expected
  uint64_t key;               // collective key (epoch, step, layer, phase), checked by reader
  uint64_t words[6];          // payload (counts, offsets, flags), written before seq
};

// Written by the sender into the slot before publishing the tail. `seq` (ring sequence + 1) is
// stored last, with release, after every other byte of the slot: a receiver expecting a small
// message polls this one line (header + inline payload + sequence) instead of tail + slot.
// Every other field is written with plain stores before, never while a reader may look.
struct alignas(kLine) SlotHeader {
  uint64_t event_id;     // user event id, checked by the receiver
  uint64_t total_bytes;  // size of the whole message
  uint64_t seq;          // ring sequence + 1 of this slot's current chunk (atomic, release)
  uint32_t chunk_bytes;  // payload bytes per chunk of this message (last may be shorter)
  uint32_t chunk_id;     // index of this chunk in the message
  uint32_t lanes_used;   // lanes this message is spread over
  uint32_t epoch;
  uint8_t inline_data[24];  // a chunk of <= kInlineBytes travels here, in the header's line
};
inline constexpr uint64_t kInlineBytes = 24;
inline constexpr uint64_t kSlotSeqOffset = 16;  // offsetof(SlotHeader, seq)

static_assert(sizeof(IdentityLine) == kLine);
static_assert(sizeof(PoisonLine) == kLine);
static_assert(sizeof(DoorbellLine) == kLine);
static_assert(sizeof(ArenaHeader) == 3 * kLine);
static_assert(sizeof(TailLine) == kLine && sizeof(HeadLine) == kLine);
static_assert(sizeof(SignalLine) == kLine && sizeof(MailboxLine) == kLine);
static_assert(sizeof(SlotHeader) == kLine);
static_assert(offsetof(SlotHeader, seq) == kSlotSeqOffset);
static_assert(offsetof(SlotHeader, inline_data) == kLine - kInlineBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Writes the identity line and zeroes the control lines of a fresh arena.
void init_arena(void* base, const ArenaLayout& layout, int rank, uint32_t epoch);
// Checks magic, version, rank and size of a mapped arena.
Status check_arena(const void* base, const ArenaLayout& layout, int rank);

}  // namespace xds::xccl
