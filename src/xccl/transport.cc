// Transport table and the shared-memory transport (copies + release/acquire stores).
#include "xccl/transport.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace xds::xccl {

std::string_view op_state_name(OpState s) {
  switch (s) {
    case OpState::kInProgress:
      return "in_progress";
    case OpState::kDone:
      return "done";
    case OpState::kFailed:
      return "failed";
    case OpState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

// Why not plain memcpy for mid sizes: glibc 2.36 copies 2 KB .. ~1 MB with `rep movsb`, which on
// some CPUs runs an order of magnitude slower when (dst - src) mod 4096 is 16 (docs/
// benchmarks.md, "XCCL copies"): exactly the case of a heap buffer (malloc's 16-byte header
// after a page-aligned mmap) pulling from page-aligned staging. An AVX2 loop with unaligned
// loads and 64-byte aligned stores does not care about the distance and is as fast as the
// good-alignment memcpy from 16 KB to 4 MB. Small copies and >= 1 MB (where glibc uses its
// vector loop or non-temporal stores, not rep movsb) stay with memcpy.
void copy_bytes(void* dst, const void* src, uint64_t n) {
  if (n == 0) return;
#if defined(__AVX2__)
  constexpr uint64_t kLoopFloor = 2048, kLoopCeil = uint64_t(1) << 20;
  if (n >= kLoopFloor && n < kLoopCeil) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    // Head: up to the next 64-byte boundary of dst (one unaligned 64-byte copy covers it).
    const uint64_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
    {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 32), b);
    }
    uint64_t i = head;
    for (; i + 128 <= n; i += 128) {
      const auto* p = reinterpret_cast<const __m256i*>(s + i);
      const __m256i a = _mm256_loadu_si256(p), b = _mm256_loadu_si256(p + 1);
      const __m256i c = _mm256_loadu_si256(p + 2), e = _mm256_loadu_si256(p + 3);
      auto* q = reinterpret_cast<__m256i*>(d + i);
      _mm256_store_si256(q, a);
      _mm256_store_si256(q + 1, b);
      _mm256_store_si256(q + 2, c);
      _mm256_store_si256(q + 3, e);
    }
    // Tail: the last 128 bytes, unaligned (may overlap bytes already written with equal ones).
    const auto* p = reinterpret_cast<const __m256i*>(s + n - 128);
    const __m256i a = _mm256_loadu_si256(p), b = _mm256_loadu_si256(p + 1);
    const __m256i c = _mm256_loadu_si256(p + 2), e = _mm256_loadu_si256(p + 3);
    auto* q = reinterpret_cast<__m256i*>(d + n - 128);
    _mm256_storeu_si256(q, a);
    _mm256_storeu_si256(q + 1, b);
    _mm256_storeu_si256(q + 2, c);
    _mm256_storeu_si256(q + 3, e);
    return;
  }
#endif
  std::memcpy(dst, src, n);  // glibc switches to non-temporal stores for huge copies
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

namespace {

constexpr uint64_t kNonTemporalFloor = 256 * 1024;

// Shared memory: every arena is mapped, so put/get are memcpy and a signal is a release store
// into the owner's arena (seq_cst where the asymmetric fence is missing: Fabric, "Lost
// wake-ups"), followed by the waiter-flag check of Fabric::ring.
class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(Fabric& f) : f_(f) {}
  std::string_view name() const override { return "shm"; }
  TransportCaps caps() const override {
    return {.load_store = true, .async_completion = false, .non_temporal = true};
  }

  Result<MemDesc> register_memory(const void* ptr, uint64_t bytes) override {
    auto* p = static_cast<const std::byte*>(ptr);
    const std::byte* base = f_.local();
    if (p < base || p + bytes > base + f_.layout().total)
      return invalid_argument("register_memory: [{}, +{}) is outside rank {}'s arena [{}, +{})",
                              ptr, bytes, f_.rank(), static_cast<const void*>(base),
                              f_.layout().total);
    return MemDesc{f_.rank(), static_cast<uint64_t>(p - base), bytes};
  }

  OpState put(const MemDesc& dst, uint64_t off, const void* src, uint64_t n) override {
    XDS_DCHECK(off + n <= dst.bytes, "put past descriptor: {} + {} > {}", off, n, dst.bytes);
    copy_bytes(base(dst) + dst.offset + off, src, n);
    return OpState::kDone;
  }

  OpState get(void* dst, const MemDesc& src, uint64_t off, uint64_t n) override {
    XDS_DCHECK(off + n <= src.bytes, "get past descriptor: {} + {} > {}", off, n, src.bytes);
    copy_bytes(dst, base(src) + src.offset + off, n);
    return OpState::kDone;
  }

  OpState put_with_signal(const MemDesc& dst, uint64_t off, const void* src, uint64_t n,
                          const SignalRef& sig, uint64_t value) override {
    if (n != 0) {
      put(dst, off, src, n);
      // glibc's memcpy uses non-temporal stores only far above this size; order them before
      // the signal. Smaller copies are ordinary stores, ordered by the release store below.
      if (n >= kNonTemporalFloor) store_fence();
    }
    word(sig).store(value, f_.publish_order());
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the store stays before ring's load
    f_.ring(sig.rank);
    return OpState::kDone;
  }

  OpState test_signal(const SignalRef& sig, uint64_t value) override {
    return word(sig).load(std::memory_order_acquire) >= value ? OpState::kDone
                                                              : OpState::kInProgress;
  }

  OpState flush() override {
    store_fence();
    return OpState::kDone;
  }

 private:
  std::byte* base(const MemDesc& d) const {
    if (d.region == kArenaRegion) return f_.arena(d.rank);
    const Fabric::Region& r = f_.region(d.rank);
    XDS_DCHECK(d.region == kExportRegion && r.base != nullptr && d.offset + d.bytes <= r.bytes,
               "descriptor outside rank {}'s exported region ({} bytes)", d.rank, r.bytes);
    return r.base;
  }
  std::atomic<uint64_t>& word(const SignalRef& s) const {
    return *reinterpret_cast<std::atomic<uint64_t>*>(f_.arena(s.rank) + s.offset);
  }
  Fabric& f_;
};

std::unique_ptr<Transport> make_shm(Fabric& f) {
  return std::make_unique<ShmTransport>(f);
}

constexpr TransportEntry kTransports[] = {
    {"shm", "shared memory between the devices of one host (memfd or heap arenas)", &make_shm},
    // "ucx" has no Fabric to be made over: it comes with its link (UcxLink::transport(),
    // ucx_link.h). "cuda_ipc" registers here later.
};

}  // namespace

std::span<const TransportEntry> transport_table() {
  return kTransports;
}

Result<std::unique_ptr<Transport>> make_transport(std::string_view name, Fabric& fabric) {
  std::string known;
  for (const auto& e : kTransports) {
    if (e.name == name) return e.make(fabric);
    known += known.empty() ? "" : ", ";
    known += e.name;
  }
  return not_found("xccl transport '{}' is not in this build (known: {})", name, known);
}

}  // namespace xds::xccl
