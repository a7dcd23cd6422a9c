#include "engine/distflow.h"

#include <poll.h>
#include <sched.h>

#include <atomic>
#include <cstring>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/log.h"
#include "tensor/dtype.h"

namespace xds::engine {
namespace {

constexpr uint64_t kConsumedOffset = 0;
constexpr uint64_t kRingOffset = 64;
constexpr uint64_t kFormatOffset = kRingOffset + 8 * kCompletionSlots;
constexpr uint64_t kFormatMax = 4096;
constexpr int kLinkTimeoutMs = 30'000;
// The prefill side waits this long for a connecting peer's hello (sent right after connect):
// a peer that dies mid-handshake must not stall the prefill group's steps.
constexpr int kAcceptTimeoutMs = 2'000;
constexpr uint32_t kLinkEpoch = 1;

std::atomic<uint64_t>& word_at(std::byte* p) { return *reinterpret_cast<std::atomic<uint64_t>*>(p); }

}  // namespace

std::string kv_format(const ModelInfo& info, const KvStorageShape& shape) {
  std::string s = fmt::format("{} hidden {} vocab {} layers {}+{} mtp, block {} tokens,",
                              info.model_type, info.hidden_size, info.vocab_size,
                              info.num_layers, info.n_mtp_layers, shape.block_size);
  for (const KvPlane& p : shape.layout.planes)
    s += fmt::format(" [{} x{} stride {}]", dtype_name(p.dtype), p.elements, p.row_bytes);
  KvStorageShape one = shape;
  one.num_blocks = 1;
  s += fmt::format(", {} bytes per block", KvStorage::bytes_for(one));
  return s;
}

xccl::ArenaConfig distflow_link_config() {
  xccl::ArenaConfig c;
  c.world_size = 2;
  c.lanes = 1;
  c.ring_slots = 2;
  c.slot_bytes = 4096;
  c.staging_bytes = 4096;
  c.app_bytes = kFormatOffset + kFormatMax;
  return c;
}

std::string distflow_link_name(int shell_pid, int group) {
  return fmt::format("kv-{}-g{}", shell_pid, group);
}

Result<std::unique_ptr<KvSender>> KvSender::create(const std::string& link_name,
                                                   const KvStorageShape& shape,
                                                   std::string format) {
  if (format.size() > kFormatMax - 8)
    return invalid_argument("KV format text too long ({} bytes)", format.size());
  const int64_t bytes = KvStorage::bytes_for(shape);
  if (bytes <= 0) return invalid_argument("DistFlow: invalid KV storage shape");
  XDS_ASSIGN_OR_RETURN(xccl::LinkListener listener, xccl::LinkListener::listen(link_name));
  XDS_ASSIGN_OR_RETURN(xccl::SharedRegion region,
                       xccl::SharedRegion::create("xds-kv-" + link_name,
                                                  static_cast<uint64_t>(bytes) + 8 * kTransferSlots));
  return std::unique_ptr<KvSender>(
      new KvSender(link_name, std::move(listener), std::move(region), std::move(format)));
}

uint64_t KvSender::open_transfer() {
  const uint64_t id = ++transfers_;
  std::byte* table = region_.data() + region_.bytes() - 8 * kTransferSlots;
  word_at(table + 8 * (id % kTransferSlots)).store(id, std::memory_order_release);
  return id;
}

void KvSender::close_transfer(uint64_t id) {
  std::byte* table = region_.data() + region_.bytes() - 8 * kTransferSlots;
  uint64_t expected = id;
  word_at(table + 8 * (id % kTransferSlots)).compare_exchange_strong(expected, 0);
}

Status KvSender::accept_pending() {
  while (true) {
    pollfd p{listener_.fd(), POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return {};
    auto fabric = listener_.accept(distflow_link_config(), kLinkEpoch, kAcceptTimeoutMs, &region_);
    if (!fabric.ok()) {  // a peer that failed its hello fails only itself
      XDS_LOG_WARN("DistFlow {}: a decode group could not link: {}", link_name_,
                   fabric.status().to_string());
      continue;
    }
    xccl::Fabric& f = **fabric;
    std::byte* app = f.local() + f.layout().app;
    const uint64_t len = format_.size();
    std::memcpy(app + kFormatOffset, &len, 8);
    std::memcpy(app + kFormatOffset + 8, format_.data(), len);
    // The peer reads the format only after it sees this word (release pairs with its acquire).
    word_at(app + kConsumedOffset).store(0, std::memory_order_release);
    word_at(f.local() + f.layout().signal_off(0, 1)).store(1, std::memory_order_release);
    XDS_LOG_INFO("DistFlow {}: decode group linked ({} links)", link_name_, links_.size() + 1);
    links_.push_back(Peer{std::move(fabric).value(), 0});
  }
}

void KvSender::poll_completions(std::vector<uint64_t>& done) {
  for (Peer& p : links_) {
    xccl::Fabric& f = *p.fabric;
    std::byte* app = f.local() + f.layout().app;
    const uint64_t posted =
        word_at(f.local() + f.layout().signal_off(1, 0)).load(std::memory_order_acquire);
    while (p.consumed < posted) {
      uint64_t id = 0;
      std::memcpy(&id, app + kRingOffset + 8 * (p.consumed % kCompletionSlots), 8);
      done.push_back(id);
      ++p.consumed;
    }
    word_at(app + kConsumedOffset).store(p.consumed, std::memory_order_release);
  }
}

Result<KvReceiver::Peer*> KvReceiver::peer(const std::string& link) {
  auto it = links_.find(link);
  if (it != links_.end()) {
    if (it->second.fabric->peer_alive(0)) return &it->second;
    links_.erase(it);
    return unavailable("DistFlow: the prefill group behind link {} is gone", link);
  }
  auto fabric = xccl::link_connect(link, distflow_link_config(), kLinkEpoch, kLinkTimeoutMs);
  if (!fabric.ok()) {
    return unavailable("DistFlow: cannot link to prefill group {}: {}", link,
                       fabric.status().message());
  }
  xccl::Fabric& f = **fabric;
  // Wait for the sender's "format written" signal (it writes it right after the handshake).
  auto& ready = word_at(f.arena(0) + f.layout().signal_off(0, 1));
  const int64_t deadline = now_ns() + int64_t{kLinkTimeoutMs} * 1'000'000;
  while (ready.load(std::memory_order_acquire) == 0) {
    if (now_ns() > deadline || !f.peer_alive(0))
      return unavailable("DistFlow: prefill group {} linked but never wrote its format", link);
    sched_yield();
  }
  const std::byte* app = f.arena(0) + f.layout().app;
  uint64_t len = 0;
  std::memcpy(&len, app + kFormatOffset, 8);
  const std::string theirs(reinterpret_cast<const char*>(app + kFormatOffset + 8),
                           std::min<uint64_t>(len, kFormatMax - 8));
  if (theirs != format_) {
    return failed_precondition(
        "DistFlow: prefill group {} keeps its KV as '{}', this decode group as '{}'", link, theirs,
        format_);
  }
  XDS_ASSIGN_OR_RETURN(auto transport, xccl::make_transport("shm", f));
  Peer p{std::move(fabric).value(), std::move(transport), 0};
  return &links_.emplace(link, std::move(p)).first->second;
}

Status KvReceiver::pull(const KvHandoff& h, std::span<const int32_t> dst, KvStorage& local) {
  if (h.kv_format != format_) {
    return failed_precondition(
        "DistFlow: the handoff's KV is '{}', this decode group keeps '{}'", h.kv_format, format_);
  }
  if (dst.size() != h.blocks.size()) {
    return internal_error("DistFlow: {} blocks to pull into {}", h.blocks.size(), dst.size());
  }
  XDS_ASSIGN_OR_RETURN(Peer * p, peer(h.link));
  xccl::Fabric& f = *p->fabric;
  const uint64_t block_bytes = static_cast<uint64_t>(local.block_bytes());
  const xccl::Fabric::Region& region = f.region(0);
  if (region.bytes < 8 * kTransferSlots)
    return failed_precondition("DistFlow: link {} exports no KV region", h.link);
  const uint64_t kv_bytes = region.bytes - 8 * kTransferSlots;
  auto& held = word_at(region.base + kv_bytes + 8 * (h.transfer % kTransferSlots));
  if (held.load(std::memory_order_acquire) != h.transfer)
    return aborted("DistFlow: transfer {} of {} was already freed (its deadline passed)",
                   h.transfer, h.link);
  for (size_t i = 0; i < dst.size(); ++i) {
    const uint64_t off = static_cast<uint64_t>(h.blocks[i]) * block_bytes;
    if (h.blocks[i] < 0 || off + block_bytes > kv_bytes) {
      return invalid_argument("DistFlow: block {} of the handoff is outside {}'s region", h.blocks[i],
                              h.link);
    }
    const xccl::MemDesc src{0, off, block_bytes, xccl::kExportRegion};
    if (p->transport->get(local.block_ptr(dst[i]), src, 0, block_bytes) == xccl::OpState::kFailed)
      return unavailable("DistFlow: get from {} failed", h.link);
  }
  if (p->transport->flush() == xccl::OpState::kFailed)
    return unavailable("DistFlow: flush of the pulls from {} failed", h.link);
  std::atomic_thread_fence(std::memory_order_acquire);  // the copies before the re-check
  if (held.load(std::memory_order_acquire) != h.transfer)
    return aborted("DistFlow: transfer {} of {} was freed during the pull", h.transfer, h.link);
  pulled_bytes_ += static_cast<int64_t>(block_bytes * dst.size());
  // The completion: wait for room in the ring, write the slot, then the signal.
  const std::byte* app0 = f.arena(0) + f.layout().app;
  const int64_t deadline = now_ns() + int64_t{kLinkTimeoutMs} * 1'000'000;
  while (p->posted - word_at(const_cast<std::byte*>(app0) + kConsumedOffset)
                         .load(std::memory_order_acquire) >= kCompletionSlots) {
    if (now_ns() > deadline || !f.peer_alive(0))
      return unavailable("DistFlow: prefill group {} stopped reading its completions", h.link);
    sched_yield();
  }
  const xccl::MemDesc slot{0, f.layout().app + kRingOffset + 8 * (p->posted % kCompletionSlots), 8};
  const uint64_t id = h.transfer;
  if (p->transport->put_with_signal(slot, 0, &id, 8, {0, f.layout().signal_off(1, 0)},
                                    p->posted + 1) == xccl::OpState::kFailed) {
    return unavailable("DistFlow: the completion to {} failed", h.link);
  }
  ++p->posted;
  return {};
}

KvPuller::KvPuller(std::string format, KvStorage& local)
    : receiver_(std::move(format)), local_(local), thread_([this] { loop(); }) {}

KvPuller::~KvPuller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void KvPuller::post(int64_t seq, KvHandoff handoff, std::vector<int32_t> dst) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{seq, std::move(handoff), std::move(dst)});
  }
  cv_.notify_one();
}

void KvPuller::poll(std::vector<Done>& out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Done& d : done_) out.push_back(std::move(d));
  done_.clear();
}

void KvPuller::loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Status st = receiver_.pull(job.handoff, job.dst, local_);
    pulled_bytes_.store(receiver_.pulled_bytes(), std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(Done{job.seq, std::move(st)});
  }
}

}  // namespace xds::engine
