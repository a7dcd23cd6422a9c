#include "xccl/layout.h"

#include <cstring>
#include <new>

namespace xds::xccl {

Status validate(const ArenaConfig& c) {
  if (c.world_size < 1 || c.world_size > kMaxWorld)
    return invalid_argument("arena config: world_size must be in [1, {}], got {}", kMaxWorld,
                            c.world_size);
  if (c.lanes < 1 || c.lanes > 64)
    return invalid_argument("arena config: lanes must be in [1, 64], got {}", c.lanes);
  if (c.ring_slots < 1 || c.ring_slots > 1024)
    return invalid_argument("arena config: ring_slots must be in [1, 1024], got {}", c.ring_slots);
  if (c.slot_bytes < kLine || c.slot_bytes % kLine != 0 || c.slot_bytes > (1ull << 30))
    return invalid_argument(
        "arena config: slot_bytes must be a multiple of 64 in [64, 1 GiB], got {}", c.slot_bytes);
  if (c.signals_per_peer < 1 || c.signals_per_peer > 4096)
    return invalid_argument("arena config: signals_per_peer must be in [1, 4096], got {}",
                            c.signals_per_peer);
  return Status::ok_status();
}

ArenaLayout arena_layout(const ArenaConfig& c) {
  ArenaLayout a;
  a.cfg = c;
  const uint64_t W = c.world_size, L = c.lanes, S = c.ring_slots, K = c.signals_per_peer;
  a.meta = kPage;
  a.heads = a.meta + kLine * W * L;
  a.signals = a.heads + kLine * W * L;
  a.mailboxes = a.signals + kLine * W * K;
  a.managed = align_up(a.mailboxes + kLine * kMailboxChannels * W, kPage);
  a.staging = align_up(a.managed + (kLine + c.slot_bytes) * W * L * S, kPage);
  a.app = align_up(a.staging + c.staging_bytes, kPage);
  a.total = align_up(a.app + c.app_bytes, kPage);
  return a;
}

void init_arena(void* base, const ArenaLayout& layout, int rank, uint32_t epoch) {
  // Control and metadata lines start at zero; fresh memfd/heap pages already are, but a reused
  // heap block is not, so clear the header and the metadata area explicitly.
  std::memset(base, 0, layout.managed);
  auto* h = new (base) ArenaHeader{};
  h->id.magic = kArenaMagic;
  h->id.layout_version = kLayoutVersion;
  h->id.rank = rank;
  h->id.world_size = layout.cfg.world_size;
  h->id.epoch = epoch;
  h->id.total_bytes = layout.total;
}

Status check_arena(const void* base, const ArenaLayout& layout, int rank) {
  const auto* h = static_cast<const ArenaHeader*>(base);
  if (h->id.magic != kArenaMagic)
    return data_loss("arena of rank {}: bad magic {:#x}, expected {:#x}", rank, h->id.magic,
                     kArenaMagic);
  if (h->id.layout_version != kLayoutVersion)
    return data_loss("arena of rank {}: layout version {}, expected {}", rank, h->id.layout_version,
                     kLayoutVersion);
  if (h->id.rank != rank || h->id.world_size != layout.cfg.world_size ||
      h->id.total_bytes != layout.total)
    return data_loss(
        "arena of rank {}: header says rank {} of {} with {} bytes, expected rank {} of {} "
        "with {} bytes",
        rank, h->id.rank, h->id.world_size, h->id.total_bytes, rank, layout.cfg.world_size,
        layout.total);
  return Status::ok_status();
}

}  // namespace xds::xccl
