#include "xccl/ucx_worker.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "base/clock.h"

namespace xds::xccl {
namespace {

Status ucx_error(const char* call, ucs_status_t s) {
  return internal_error("xccl ucx: {} failed: {}", call, ucs_status_string(s));
}

// Registers [base, base + bytes) and packs its remote key.
Status map_memory(ucp_context_h ctx, std::span<std::byte> mem, ucp_mem_h& memh,
                  UcxRemoteMemory& out) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = mem.data();
  mp.length = mem.size();
  ucs_status_t s = ucp_mem_map(ctx, &mp, &memh);
  if (s != UCS_OK) return ucx_error("ucp_mem_map", s);
  void* buf = nullptr;
  size_t len = 0;
  s = ucp_rkey_pack(ctx, memh, &buf, &len);
  if (s != UCS_OK) return ucx_error("ucp_rkey_pack", s);
  const auto* b = static_cast<const uint8_t*>(buf);
  out.rkey.assign(b, b + len);
  ucp_rkey_buffer_release(buf);
  out.base = reinterpret_cast<uint64_t>(mem.data());
  out.bytes = mem.size();
  return {};
}

}  // namespace

Result<std::unique_ptr<UcxWorker>> UcxWorker::create(
    const std::string& tls, const std::vector<std::pair<std::string, std::string>>& settings,
    std::span<std::byte> arena, std::span<std::byte> exported) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return ucx_error("ucp_config_read", s);
  if (!tls.empty()) {
    s = ucp_config_modify(config, "TLS", tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("xccl ucx: UCX rejects TLS='{}': {}", tls, ucs_status_string(s));
    }
  }
  for (const auto& [name, value] : settings) {
    s = ucp_config_modify(config, name.c_str(), value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("xccl ucx: UCX rejects {}='{}': {}", name, value,
                              ucs_status_string(s));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return unavailable("xccl ucx: ucp_init (TLS='{}') failed: {}", tls, ucs_status_string(s));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  s = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (s != UCS_OK) return ucx_error("ucp_worker_create", s);
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  s = ucp_worker_query(w->worker_, &attr);
  if (s != UCS_OK) return ucx_error("ucp_worker_query", s);
  if (attr.thread_mode != UCS_THREAD_MODE_MULTI) {
    return failed_precondition("xccl ucx: this libucx has no multi-threaded workers");
  }
  s = ucp_worker_get_efd(w->worker_, &w->event_fd_);
  if (s != UCS_OK) return ucx_error("ucp_worker_get_efd", s);
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(w->worker_, &addr, &addr_len);
  if (s != UCS_OK) return ucx_error("ucp_worker_get_address", s);
  const auto* a = reinterpret_cast<const uint8_t*>(addr);
  w->packed_.worker_address.assign(a, a + addr_len);
  ucp_worker_release_address(w->worker_, addr);
  XDS_RETURN_IF_ERROR(map_memory(w->context_, arena, w->arena_mem_, w->packed_.arena));
  if (!exported.empty()) {
    XDS_RETURN_IF_ERROR(map_memory(w->context_, exported, w->region_mem_, w->packed_.region));
  }
  return w;
}

void UcxWorker::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t /*status*/) {
  static_cast<UcxWorker*>(arg)->ep_failed_.store(true, std::memory_order_release);
}

Status UcxWorker::connect(const UcxPacked& peer, const std::string& peer_name) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer.worker_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxWorker::on_ep_error;
  ep.err_handler.arg = this;
  ucs_status_t s = ucp_ep_create(worker_, &ep, &ep_);
  if (s != UCS_OK) {
    ep_ = nullptr;
    return unavailable("xccl ucx: cannot reach the worker of the peer at {}: {}", peer_name,
                       ucs_status_string(s));
  }
  s = ucp_ep_rkey_unpack(ep_, peer.arena.rkey.data(), &peer_arena_rkey_);
  if (s != UCS_OK) return ucx_error("ucp_ep_rkey_unpack(peer arena)", s);
  if (!peer.region.rkey.empty()) {
    s = ucp_ep_rkey_unpack(ep_, peer.region.rkey.data(), &peer_region_rkey_);
    if (s != UCS_OK) return ucx_error("ucp_ep_rkey_unpack(peer region)", s);
  }
  peer_arena_ = peer.arena;
  peer_region_ = peer.region;
  return {};
}

void UcxWorker::start_progress_thread() {
  progress_thread_ = std::thread([this] { progress_loop(); });
}

void UcxWorker::progress_loop() {
  while (!stop_.load(std::memory_order_acquire)) {
    if (flushing_.load(std::memory_order_acquire) > 0) {  // the flusher progresses meanwhile
      pollfd p{event_fd_, 0, 0};
      poll(&p, 0, 1);
      continue;
    }
    if (ucp_worker_progress(worker_) != 0) continue;
    const ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    pollfd p{event_fd_, POLLIN, 0};
    poll(&p, 1, s == UCS_OK ? 100 : 1);  // ucp_worker_signal() wakes it for the stop
  }
}

void UcxWorker::progress() {
  ucp_worker_progress(worker_);
}

bool UcxWorker::track(ucs_status_ptr_t r) {
  if (r == nullptr) return true;  // completed at once
  if (UCS_PTR_IS_ERR(r)) {
    failed_ops_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::lock_guard lock(mu_);
  outstanding_.push_back(r);
  return true;
}

bool UcxWorker::put(UcxMemory m, uint64_t remote_addr, const void* src, uint64_t n) {
  ucp_request_param_t p{};
  ucp_rkey_h rkey = m == UcxMemory::kArena ? peer_arena_rkey_ : peer_region_rkey_;
  return track(ucp_put_nbx(ep_, src, n, remote_addr, rkey, &p));
}

bool UcxWorker::get(void* dst, UcxMemory m, uint64_t remote_addr, uint64_t n) {
  ucp_request_param_t p{};
  ucp_rkey_h rkey = m == UcxMemory::kArena ? peer_arena_rkey_ : peer_region_rkey_;
  return track(ucp_get_nbx(ep_, dst, n, remote_addr, rkey, &p));
}

bool UcxWorker::fence() {
  return ucp_worker_fence(worker_) == UCS_OK;
}

bool UcxWorker::put_word(UcxMemory m, uint64_t remote_addr, uint64_t value) {
  const uint64_t* src = nullptr;
  {
    std::lock_guard lock(mu_);
    words_.push_back(value);
    src = &words_.back();  // a deque keeps element addresses across push_back
  }
  return put(m, remote_addr, src, sizeof(uint64_t));
}

Status UcxWorker::flush(int64_t deadline_ns, const std::function<bool()>& alive) {
  flushing_.fetch_add(1, std::memory_order_acq_rel);
  const Status st = flush_wait(deadline_ns, alive);
  flushing_.fetch_sub(1, std::memory_order_acq_rel);
  return st;
}

Status UcxWorker::flush_wait(int64_t deadline_ns, const std::function<bool()>& alive) {
  ucp_request_param_t p{};
  const ucs_status_ptr_t fr = ucp_worker_flush_nbx(worker_, &p);
  if (UCS_PTR_IS_ERR(fr)) return ucx_error("ucp_worker_flush_nbx", UCS_PTR_STATUS(fr));
  std::vector<void*> mine;
  size_t words = 0;
  {
    std::lock_guard lock(mu_);
    mine.swap(outstanding_);
    words = words_.size();
  }
  if (fr != nullptr) mine.push_back(fr);
  Status st;
  int64_t next_check = 0;
  size_t done = 0;  // mine[0, done) completed and freed
  while (done < mine.size()) {
    const ucs_status_t s = ucp_request_check_status(mine[done]);
    if (s != UCS_INPROGRESS) {
      if (s != UCS_OK && st.ok())
        st = unavailable("xccl ucx: an operation failed: {}", ucs_status_string(s));
      ucp_request_free(mine[done]);
      ++done;
      continue;
    }
    ucp_worker_progress(worker_);  // the progress thread rests meanwhile (one spinner a side)
    const int64_t now = now_ns();
    if (now < next_check) continue;
    next_check = now + 10'000'000;
    if (endpoint_failed() || !alive()) {
      st = unavailable("xccl ucx: the peer is gone");
      break;
    }
    if (now > deadline_ns) {
      st = deadline_exceeded("xccl ucx: flush did not complete in time ({} operations left)",
                             mine.size() - done);
      break;
    }
  }
  // What did not complete is released to UCX (it completes or fails on its own).
  for (size_t i = done; i < mine.size(); ++i) ucp_request_free(mine[i]);
  const uint64_t failed = failed_ops_.exchange(0, std::memory_order_relaxed);
  if (st.ok() && failed != 0)
    st = unavailable("xccl ucx: {} operations failed when issued", failed);
  if (st.ok()) {
    std::lock_guard lock(mu_);
    words_.erase(words_.begin(), words_.begin() + static_cast<ptrdiff_t>(words));
  }
  return st;
}

void UcxWorker::close_endpoint() {
  if (ep_ == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // no flush handshake: the peer may be gone already
  const ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    const int64_t deadline = now_ns() + 2'000'000'000;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && now_ns() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(r);
  }
  ep_ = nullptr;
}

UcxWorker::~UcxWorker() {
  if (progress_thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    ucp_worker_signal(worker_);
    progress_thread_.join();
  }
  {
    std::lock_guard lock(mu_);
    for (void* r : outstanding_) ucp_request_free(r);
    outstanding_.clear();
  }
  if (peer_arena_rkey_ != nullptr) ucp_rkey_destroy(peer_arena_rkey_);
  if (peer_region_rkey_ != nullptr) ucp_rkey_destroy(peer_region_rkey_);
  close_endpoint();
  if (region_mem_ != nullptr) ucp_mem_unmap(context_, region_mem_);
  if (arena_mem_ != nullptr) ucp_mem_unmap(context_, arena_mem_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

}  // namespace xds::xccl
