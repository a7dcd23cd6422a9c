// UcxWorker: the UCP half of a UcxLink (ucx_link.h) -- one context, one worker, this side's
// registered memory (control arena, exported region), one endpoint to the peer and the peer's
// unpacked remote keys. It moves bytes by remote virtual address; ucx_link.cc maps MemDescs
// onto it, and the TCP rendezvous (ucx_handshake.h) creates it only once the peer has proved
// the cluster secret.
//
// What travels to the peer (packed(), filled by create()):
//   worker address (ucp_worker_get_address) | arena rkey | region rkey (empty: none)
//
// Operation completion: every nbx request that does not complete at once is kept in
// outstanding_; flush() adds a ucp_worker_flush_nbx request (remote completion of everything
// issued before it) and progresses until all of them completed, the deadline passed or `alive`
// says the peer is gone; a request that completed with an error fails the flush.
//
// Thread-safety: the worker is created in UCS_THREAD_MODE_MULTI (UCX serialises calls on it);
// every method may be called from any thread after connect().
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"

namespace xds::xccl {

// A side's memory as the peer sees it: base address, size, remote key.
struct UcxRemoteMemory {
  uint64_t base = 0;
  uint64_t bytes = 0;
  std::vector<uint8_t> rkey;  // packed (ucp_rkey_pack); empty: no such memory
};

struct UcxPacked {
  std::vector<uint8_t> worker_address;
  UcxRemoteMemory arena;
  UcxRemoteMemory region;
};

// Which of the peer's memories an operation addresses.
enum class UcxMemory : uint8_t { kArena = 0, kRegion = 1 };

class UcxWorker {
 public:
  // Context (UCX_TLS = tls unless empty, then each name = value of `config`), worker, registration
  // of arena and exported (may be empty). Errors name the UCX call and its status.
  static Result<std::unique_ptr<UcxWorker>> create(
      const std::string& tls, const std::vector<std::pair<std::string, std::string>>& config,
      std::span<std::byte> arena, std::span<std::byte> exported);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  const UcxPacked& packed() const { return packed_; }
  // Creates the endpoint to the peer's worker and unpacks its keys. `peer_name` is used in
  // errors.
  Status connect(const UcxPacked& peer, const std::string& peer_name);
  // Starts a thread that progresses the worker (sleeping on its event fd when idle).
  void start_progress_thread();

  // The peer's memory (bytes == 0: none); bounds checks are the caller's (ucx_link.cc).
  const UcxRemoteMemory& peer(UcxMemory m) const {
    return m == UcxMemory::kArena ? peer_arena_ : peer_region_;
  }
  // false on an immediate failure; otherwise in progress until flush().
  bool put(UcxMemory m, uint64_t remote_addr, const void* src, uint64_t n);
  bool get(void* dst, UcxMemory m, uint64_t remote_addr, uint64_t n);
  // Orders what was issued before it before what is issued after it (ucp_worker_fence).
  bool fence();
  // put of an 8-byte value kept alive here until the next successful flush.
  bool put_word(UcxMemory m, uint64_t remote_addr, uint64_t value);
  // Waits for everything issued before it. `alive` is asked every ~10 ms; false fails.
  Status flush(int64_t deadline_ns, const std::function<bool()>& alive);
  void progress();
  // True once UCX reported an error on the endpoint (e.g. the peer died).
  bool endpoint_failed() const { return ep_failed_.load(std::memory_order_acquire); }
  bool has_progress_thread() const { return progress_thread_.joinable(); }

 private:
  UcxWorker() = default;
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  bool track(ucs_status_ptr_t r);
  Status flush_wait(int64_t deadline_ns, const std::function<bool()>& alive);
  void progress_loop();
  void close_endpoint();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_mem_h arena_mem_ = nullptr;
  ucp_mem_h region_mem_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h peer_arena_rkey_ = nullptr;
  ucp_rkey_h peer_region_rkey_ = nullptr;
  UcxPacked packed_;
  UcxRemoteMemory peer_arena_;
  UcxRemoteMemory peer_region_;
  int event_fd_ = -1;

  std::atomic<bool> ep_failed_{false};
  std::atomic<uint64_t> failed_ops_{0};  // operations that failed when issued
  std::atomic<bool> stop_{false};
  std::atomic<int> flushing_{0};  // flushes under way: the progress thread rests, they progress
  std::thread progress_thread_;
  std::mutex mu_;                   // guards the two lists below
  std::vector<void*> outstanding_;  // requests issued and not yet seen complete by a flush
  std::deque<uint64_t> words_;      // put_word sources, stable until the flush that covers them
};

}  // namespace xds::xccl
