// Transport: the one-sided primitives everything else in XCCL is written against.
//
// A MemDesc names bytes of some device's arena or exported region (rank, offset, length); register_memory() makes
// one for local memory so that peers can address it. A SignalRef names a 64-bit word in some
// arena. Each primitive returns an OpState: the shared-memory transport completes put/get at
// once (kDone); a transport with asynchronous completion (UCX, CUDA IPC) may return
// kInProgress and complete on flush(). test_signal() is the non-blocking half of
// wait_signal(); blocking (deadline, back-off, poison) lives in wait.h, shared by all
// transports.
//
// Transports are registered in one table (transport_table()); make_transport() picks by name.
// Thread-safety: a Transport is stateless over the fabric's memory; all calls may be made from
// any thread (the copy lanes call put/get concurrently on disjoint ranges).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "base/status.h"
#include "xccl/fabric.h"

namespace xds::xccl {

// State of asynchronous work (P2P handles, transport operations).
enum class OpState : uint8_t { kInProgress, kDone, kFailed, kCancelled };
std::string_view op_state_name(OpState s);
// kFailed or kCancelled: the operation did not happen (kInProgress completes on flush()).
inline bool op_failed(OpState s) {
  return s == OpState::kFailed || s == OpState::kCancelled;
}

// Which memory of a rank a MemDesc points into: its arena, or the region it exports over a
// link (Fabric::region, e.g. a prefill DP group's KV cache).
inline constexpr uint32_t kArenaRegion = 0;
inline constexpr uint32_t kExportRegion = 1;

struct MemDesc {
  int32_t rank = -1;
  uint64_t offset = 0;  // from the start of rank's arena (or exported region)
  uint64_t bytes = 0;
  uint32_t region = kArenaRegion;
};

struct SignalRef {
  int32_t rank = -1;    // whose arena holds the word
  uint64_t offset = 0;  // 8-byte aligned, inside a line that only the signalling side writes
};

struct TransportCaps {
  bool load_store = false;        // peers' memory is directly addressable (shared memory)
  bool async_completion = false;  // put/get may return kInProgress until flush()
  bool non_temporal = false;      // large copies bypass caches (flush() fences them)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  virtual TransportCaps caps() const = 0;

  // Describes [ptr, ptr + bytes) of the local arena; error if the range leaves it.
  virtual Result<MemDesc> register_memory(const void* ptr, uint64_t bytes) = 0;
  // Copies n bytes from local src to dst + off (dst on any rank).
  virtual OpState put(const MemDesc& dst, uint64_t off, const void* src, uint64_t n) = 0;
  // Copies n bytes from src + off (any rank) to local dst.
  virtual OpState get(void* dst, const MemDesc& src, uint64_t off, uint64_t n) = 0;
  // put, then stores `value` into `sig` with release ordering (the data is visible to whoever
  // acquires the signal), then wakes the signal's owner.
  virtual OpState put_with_signal(const MemDesc& dst, uint64_t off, const void* src, uint64_t n,
                                  const SignalRef& sig, uint64_t value) = 0;
  // kDone when the local word `sig` holds >= value (acquire), else kInProgress.
  virtual OpState test_signal(const SignalRef& sig, uint64_t value) = 0;
  // Completes outstanding puts (store fence after non-temporal copies).
  virtual OpState flush() = 0;
};

struct TransportEntry {
  std::string_view name;
  std::string_view what;
  std::unique_ptr<Transport> (*make)(Fabric& fabric);
};

// Every transport this build has, in one table.
std::span<const TransportEntry> transport_table();
// Creates the named transport over `fabric`; NotFound lists the known names.
Result<std::unique_ptr<Transport>> make_transport(std::string_view name, Fabric& fabric);

// Copies n bytes; above a threshold uses non-temporal stores (then callers must flush()).
// Mid sizes (2 KB .. 1 MB) use an AVX2 loop whose speed does not depend on the distance between
// dst and src (glibc's rep movsb slows by an order of magnitude at some distances; transport.cc).
// Pure memory helper shared by the shared-memory transport and the P2P lanes.
void copy_bytes(void* dst, const void* src, uint64_t n);
// Store fence that makes non-temporal stores of this thread visible before a release.
void store_fence();

}  // namespace xds::xccl
