#include "engine/distflow.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include "base/clock.h"
#include "base/log.h"
#include "tensor/dtype.h"

namespace xds::engine {
namespace {

constexpr uint64_t kConsumedOffset = 0;
constexpr uint64_t kRingOffset = 64;
constexpr uint64_t kFormatOffset = kRingOffset + 8 * kCompletionSlots;
constexpr uint64_t kFormatMax = 4096;
constexpr uint64_t kProbeOffset = kFormatOffset + kFormatMax;
constexpr uint64_t kAnswerOffset = kProbeOffset + 64;
constexpr uint64_t kHoldOffset = kAnswerOffset + 8;
constexpr uint64_t kAppBytes = kProbeOffset + 128;
static_assert(kRingOffset % 64 == 0 && kFormatOffset % 64 == 0);
static_assert(kProbeOffset % 64 == 0 && kAnswerOffset % 64 == 0,
              "the probe and its answer sit on lines of their own (different writers)");
static_assert(kHoldOffset / 64 == kAnswerOffset / 64, "answer and hold: one line, one writer");
// A decode side copies at most this many bytes between two looks at its pull's clock.
constexpr uint64_t kWatchBatchBytes = uint64_t{16} << 20;
// How often a decode side looks at a held link again.
constexpr useconds_t kHoldPollUs = 200;
constexpr int kLinkTimeoutMs = 30'000;
// A connecting peer's hello (sent right after connect) must arrive within this; the prefill
// side never waits for it (xccl::LinkListener::accept_ready), it drops a silent peer then.
// The UCX listener likewise (xccl::UcxListener::accept_ready): a UCX peer's whole handshake,
// the proof of the cluster secret included, must be done within this.
constexpr int kAcceptTimeoutMs = 2'000;
// 2: the probe lines (app area grew by 128 bytes).
constexpr uint32_t kLinkEpoch = 2;

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
  c.app_bytes = kAppBytes;
  return c;
}

std::string distflow_link_name(int shell_pid, int group) {
  return fmt::format("kv-{}-g{}", shell_pid, group);
}

xccl::UcxLinkOptions distflow_ucx_options(const std::optional<xccl::LinkSecret>& secret) {
  xccl::UcxLinkOptions o;
  o.secret = secret;
  o.config = distflow_link_config();
  o.epoch = kLinkEpoch;
  o.timeout_ms = kLinkTimeoutMs;
  o.ucx_config = {{"TX_SEG_SIZE", "64k"}, {"RX_SEG_SIZE", "64k"}};
  return o;
}

PullState pull_state(const Status& st) {
  if (st.ok()) return PullState::kDone;
  if (st.code() == StatusCode::kDataLoss) return PullState::kCorrupt;
  return st.code() == StatusCode::kUnavailable ? PullState::kLinkFailed : PullState::kFailed;
}

uint64_t block_checksum(const std::byte* block, size_t bytes) { return XXH3_64bits(block, bytes); }

Result<KvBackendChoice> parse_kv_backend(const std::string& name) {
  if (name == "auto") return KvBackendChoice::kAuto;
  if (name == "shm") return KvBackendChoice::kShm;
  if (name == "ucx") return KvBackendChoice::kUcx;
  return invalid_argument("--kv-transfer-backend must be auto, shm or ucx, got '{}'", name);
}

Result<std::unique_ptr<KvSender>> KvSender::create(const std::string& link_name,
                                                   const KvStorageShape& shape, std::string format,
                                                   const std::string& ucx_host,
                                                   const std::optional<xccl::LinkSecret>& secret) {
  if (!ucx_host.empty() && !secret) {
    return invalid_argument(
        "DistFlow {}: a UCX listener on {} needs the cluster secret (decode groups prove it "
        "before they get the KV cache's keys)",
        link_name, ucx_host);
  }
  if (format.size() > kFormatMax - 8)
    return invalid_argument("KV format text too long ({} bytes)", format.size());
  const int64_t bytes = KvStorage::bytes_for(shape);
  if (bytes <= 0) return invalid_argument("DistFlow: invalid KV storage shape");
  XDS_ASSIGN_OR_RETURN(xccl::LinkListener listener, xccl::LinkListener::listen(link_name));
  XDS_ASSIGN_OR_RETURN(xccl::SharedRegion region,
                       xccl::SharedRegion::create("xds-kv-" + link_name,
                                                  static_cast<uint64_t>(bytes) + 8 * kTransferSlots));
  std::unique_ptr<KvSender> sender(
      new KvSender(link_name, std::move(listener), std::move(region), std::move(format)));
  if (!ucx_host.empty()) {
    XDS_ASSIGN_OR_RETURN(xccl::UcxListener ucx, xccl::UcxListener::listen(ucx_host, 0));
    sender->ucx_.emplace(std::move(ucx));
    sender->ucx_options_ = distflow_ucx_options(secret);
    sender->ucx_options_.timeout_ms = kAcceptTimeoutMs;
    sender->ucx_options_.exported = sender->region_.span();
  }
  return sender;
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

void KvSender::adopt(Peer p) {
  const xccl::ArenaLayout& layout = p.fabric ? p.fabric->layout() : p.ucx->layout();
  p.arena = p.fabric ? p.fabric->local() : p.ucx->local();
  p.app = layout.app;
  p.posted_signal = layout.signal_off(1, 0);
  p.ready_signal = layout.signal_off(0, 1);
  std::byte* app = p.arena + p.app;
  const uint64_t len = format_.size();
  std::memcpy(app + kFormatOffset, &len, 8);
  std::memcpy(app + kFormatOffset + 8, format_.data(), len);
  // The peer reads the format only after it sees this word (release pairs with its acquire).
  word_at(app + kConsumedOffset).store(0, std::memory_order_release);
  word_at(app + kAnswerOffset).store(0, std::memory_order_release);
  word_at(app + kHoldOffset).store(hold_ ? 1 : 0, std::memory_order_release);
  word_at(p.arena + p.ready_signal).store(1, std::memory_order_release);
  XDS_LOG_INFO("DistFlow {}: decode group linked over {} ({} links)", link_name_,
               p.ucx ? "ucx" : "shared memory", links_.size() + 1);
  links_.push_back(std::move(p));
}

Status KvSender::accept_pending() {
  // Never waits: a peer whose hello has not arrived stays pending (and is dropped after
  // kAcceptTimeoutMs); one of another uid is refused before it is sent anything. Out of
  // descriptors, a listener pauses and reports one error per pause; XDS_LOG_* rate-limits
  // each call site besides (base/log.h), so a flood of refusals logs ~20 lines a second.
  xccl::LinkListener::Accepted a =
      listener_.accept_ready(distflow_link_config(), kLinkEpoch, kAcceptTimeoutMs, &region_);
  for (const Status& st : a.refused) {  // a peer that failed its hello fails only itself
    XDS_LOG_WARN("DistFlow {}: a peer could not link: {}", link_name_, st.to_string());
  }
  for (auto& fabric : a.formed) {
    Peer peer;
    peer.fabric = std::move(fabric);
    adopt(std::move(peer));
  }
  if (ucx_) {  // the same rules: a peer is linked only once it proved the cluster secret
    xccl::UcxListener::Accepted u = ucx_->accept_ready(ucx_options_);
    for (const Status& st : u.refused) {
      XDS_LOG_WARN("DistFlow {}: a decode group could not link over UCX: {}", link_name_,
                   st.to_string());
    }
    for (auto& link : u.formed) {
      Peer peer;
      peer.ucx = std::move(link);
      adopt(std::move(peer));
    }
  }
  return {};
}

void KvSender::poll_peer(Peer& p, std::vector<uint64_t>& done) {
  std::byte* app = p.arena + p.app;
  const uint64_t posted = word_at(p.arena + p.posted_signal).load(std::memory_order_acquire);
  while (p.consumed < posted) {
    uint64_t id = 0;
    std::memcpy(&id, app + kRingOffset + 8 * (p.consumed % kCompletionSlots), 8);
    done.push_back(id);
    ++p.consumed;
  }
  word_at(app + kConsumedOffset).store(p.consumed, std::memory_order_release);
}

void KvSender::poll_completions(std::vector<uint64_t>& done) {
  for (Peer& p : links_) poll_peer(p, done);
}

int KvSender::answer_probes() {
  int answered = 0;
  for (Peer& p : links_) {
    std::byte* app = p.arena + p.app;
    const uint64_t probe = word_at(app + kProbeOffset).load(std::memory_order_acquire);
    if (probe == p.answered) continue;
    word_at(app + kAnswerOffset).store(probe, std::memory_order_release);
    p.answered = probe;
    ++answered;
  }
  return answered;
}

void KvSender::hold_links(bool hold) {
  hold_ = hold;
  for (Peer& p : links_)
    word_at(p.arena + p.app + kHoldOffset).store(hold ? 1 : 0, std::memory_order_release);
}

int KvSender::drop_failed_links(std::vector<uint64_t>& done) {
  int dropped = 0;
  for (auto it = links_.begin(); it != links_.end();) {
    Peer& p = *it;
    const bool poisoned = p.fabric && p.fabric->poison_word() != 0;
    if (!poisoned && (p.fabric ? p.fabric->peer_alive(1) : p.ucx->peer_alive())) {
      ++it;
      continue;
    }
    poll_peer(p, done);  // what it completed before it failed still counts
    XDS_LOG_WARN("DistFlow {}: dropped a {} link to a decode group: {}", link_name_,
                 p.ucx ? "ucx" : "shared-memory",
                 poisoned ? "it declared the link failed" : "the decode group is gone");
    it = links_.erase(it);
    ++dropped;
  }
  return dropped;
}

Status KvReceiver::read(Peer& p, const xccl::MemDesc& src, void* dst, uint64_t n,
                        const std::string& link) {
  if (p.transport->get(dst, src, 0, n) == xccl::OpState::kFailed ||
      p.transport->flush() == xccl::OpState::kFailed) {
    return unavailable("DistFlow: reading from prefill group {} failed", link);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return {};
}

Result<KvReceiver::Peer*> KvReceiver::peer(const KvHandoff& h) {
  auto it = links_.find(h.link);
  if (it != links_.end()) {
    if (it->second.alive()) return &it->second;
    links_.erase(it);
    return unavailable("DistFlow: the prefill group behind link {} is gone", h.link);
  }
  bool ucx = backend_ == KvBackendChoice::kUcx;
  if (backend_ == KvBackendChoice::kAuto && !h.ucx_address.empty()) {
    ucx = xccl::pick_transfer_backend(self_host_, h.ucx_address) == xccl::TransferBackend::kUcx;
  }
  Peer p;
  if (ucx) {
    if (h.ucx_address.empty()) {
      return failed_precondition(
          "DistFlow: --kv-transfer-backend ucx, but prefill group {} has no UCX listener (start "
          "the prefill instance with --kv-transfer-host)",
          h.link);
    }
    const std::string host(xccl::address_host(h.ucx_address));
    const size_t colon = h.ucx_address.rfind(':');
    const int port = colon == std::string::npos ? 0 : std::atoi(h.ucx_address.c_str() + colon + 1);
    if (!secret_) {
      return failed_precondition(
          "DistFlow: pulling from prefill group {} over UCX needs the cluster secret", h.link);
    }
    auto link = xccl::ucx_connect(host, static_cast<uint16_t>(port), distflow_ucx_options(secret_));
    if (!link.ok()) {
      return unavailable("DistFlow: cannot link to prefill group {} at {}: {}", h.link,
                         h.ucx_address, link.status().message());
    }
    p.ucx = std::move(link).value();
    p.transport = &p.ucx->transport();
    p.layout = p.ucx->layout();
    p.region_bytes = p.ucx->peer_region_bytes();
  } else {
    auto fabric = xccl::link_connect(h.link, distflow_link_config(), kLinkEpoch, kLinkTimeoutMs);
    if (!fabric.ok()) {
      return unavailable("DistFlow: cannot link to prefill group {}: {}", h.link,
                         fabric.status().message());
    }
    p.fabric = std::move(fabric).value();
    XDS_ASSIGN_OR_RETURN(p.shm_transport, xccl::make_transport("shm", *p.fabric));
    p.transport = p.shm_transport.get();
    p.layout = p.fabric->layout();
    p.region_bytes = p.fabric->region(0).bytes;
  }
  // Wait for the sender's "format written" word (it writes it right after the handshake).
  const int64_t deadline = now_ns() + int64_t{kLinkTimeoutMs} * 1'000'000;
  uint64_t ready = 0;
  while (true) {
    XDS_RETURN_IF_ERROR(read(p, {0, p.layout.signal_off(0, 1), 8}, &ready, 8, h.link));
    if (ready != 0) break;
    if (now_ns() > deadline || !p.alive())
      return unavailable("DistFlow: prefill group {} linked but never wrote its format", h.link);
    sched_yield();
  }
  uint64_t len = 0;
  const uint64_t format_at = p.layout.app + kFormatOffset;
  XDS_RETURN_IF_ERROR(read(p, {0, format_at, 8}, &len, 8, h.link));
  std::string theirs(std::min<uint64_t>(len, kFormatMax - 8), '\0');
  XDS_RETURN_IF_ERROR(read(p, {0, format_at + 8, theirs.size()}, theirs.data(), theirs.size(), h.link));
  if (theirs != format_) {
    return failed_precondition(
        "DistFlow: prefill group {} keeps its KV as '{}', this decode group as '{}'", h.link,
        theirs, format_);
  }
  return &links_.emplace(h.link, std::move(p)).first->second;
}

Status KvReceiver::pull(const KvHandoff& h, std::span<const int32_t> dst, KvStorage& local,
                        std::vector<int32_t>* bad) {
  if (h.kv_format != format_) {
    return failed_precondition(
        "DistFlow: the handoff's KV is '{}', this decode group keeps '{}'", h.kv_format, format_);
  }
  if (dst.size() != h.blocks.size()) {
    return internal_error("DistFlow: {} blocks to pull into {}", h.blocks.size(), dst.size());
  }
  if (!h.block_sums.empty() && h.block_sums.size() != h.blocks.size()) {
    return invalid_argument("DistFlow: the handoff of transfer {} has {} checksums for {} blocks",
                            h.transfer, h.block_sums.size(), h.blocks.size());
  }
  XDS_ASSIGN_OR_RETURN(Peer * p, peer(h));
  Status st = pull_from(*p, h, dst, local, bad);
  if (pull_state(st) == PullState::kLinkFailed) drop_link(h.link);
  return st;
}

void KvReceiver::drop_link(const std::string& link) {
  auto it = links_.find(link);
  if (it == links_.end()) return;
  Peer& p = it->second;
  if (p.fabric) {  // the prefill side drops a poisoned link (KvSender::drop_failed_links)
    xccl::PoisonRecord rec;
    rec.epoch = p.fabric->epoch();
    rec.peer = 0;
    rec.reason = p.fabric->peer_alive(0) ? xccl::PoisonReason::kSilent : xccl::PoisonReason::kDead;
    rec.op = xccl::OpKind::kGet;
    rec.detector = 1;
    (void)p.fabric->poison(rec);
  }  // UCX: closing the link is the prefill side's EOF
  links_.erase(it);
}

Status KvReceiver::watch(Peer& p, PullWatch& w, const KvHandoff& h) {
  const int64_t now = now_ns();
  const uint64_t probe_at = p.layout.app + kProbeOffset;
  if (w.probe == 0) {
    if (now < w.probe_at_ns) return {};
    const uint64_t n = ++p.probes;
    if (p.transport->put_with_signal({0, probe_at, 0}, 0, nullptr, 0, {0, probe_at}, n) ==
            xccl::OpState::kFailed ||
        p.transport->flush() == xccl::OpState::kFailed) {
      return unavailable("DistFlow: link {} failed: probe {} could not be sent", h.link, n);
    }
    w.probe = n;
    w.probe_sent_ns = now;
    return {};
  }
  uint64_t answer = 0;
  XDS_RETURN_IF_ERROR(read(p, {0, p.layout.app + kAnswerOffset, 8}, &answer, 8, h.link));
  if (answer >= w.probe) {
    ++probes_saturated_;
    if (probes_total_) probes_total_->fetch_add(1, std::memory_order_relaxed);
    if (w.answered++ == 0) {
      XDS_LOG_INFO(
          "DistFlow: link {} is slow but alive: transfer {} at {} ms (expected {} ms), "
          "probe {} answered",
          h.link, h.transfer, (now - w.start_ns) / 1'000'000, w.expected_ns / 1'000'000, w.probe);
    }
    w.probe = 0;
    w.probe_at_ns = now + probe_.slack_ns;
    return {};
  }
  if (now - w.probe_sent_ns < probe_.probe_timeout_ns) return {};
  return unavailable(
      "DistFlow: link {} failed: probe {} unanswered for {} ms, {} ms into transfer {} "
      "(expected {} ms)",
      h.link, w.probe, (now - w.probe_sent_ns) / 1'000'000, (now - w.start_ns) / 1'000'000,
      h.transfer, w.expected_ns / 1'000'000);
}

Status KvReceiver::wait_unheld(Peer& p, PullWatch& w, const KvHandoff& h,
                               const xccl::MemDesc& held) {
  while (true) {
    uint64_t hold = 0, word = 0;
    XDS_RETURN_IF_ERROR(read(p, {0, p.layout.app + kHoldOffset, 8}, &hold, 8, h.link));
    if (hold == 0) return {};
    XDS_RETURN_IF_ERROR(read(p, held, &word, 8, h.link));
    if (word != h.transfer)
      return aborted("DistFlow: transfer {} of {} was freed while held", h.transfer, h.link);
    XDS_RETURN_IF_ERROR(watch(p, w, h));
    usleep(kHoldPollUs);
  }
}

Status KvReceiver::verify(Peer& p, const KvHandoff& h, std::span<const int32_t> dst,
                          KvStorage& local, std::vector<int32_t>* bad) {
  if (h.block_sums.empty()) return {};
  const auto block_bytes = static_cast<size_t>(local.block_bytes());
  if (const int64_t n = corrupt_next_->exchange(0, std::memory_order_relaxed); n > 0) {
    for (size_t i = 0; i < dst.size() && static_cast<int64_t>(i) < n; ++i)
      local.block_ptr(dst[i])[block_bytes / 2] ^= std::byte{0x5a};
  }
  std::vector<size_t> differ;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (block_checksum(local.block_ptr(dst[i]), block_bytes) != h.block_sums[i]) differ.push_back(i);
  }
  if (differ.empty()) return {};
  // Read each differing block again: which side's memory holds the bad bytes?
  std::vector<std::byte> scratch(block_bytes);
  std::vector<int32_t> here, there;
  for (const size_t i : differ) {
    const xccl::MemDesc src{0, static_cast<uint64_t>(h.blocks[i]) * block_bytes, block_bytes,
                            xccl::kExportRegion};
    XDS_RETURN_IF_ERROR(read(p, src, scratch.data(), block_bytes, h.link));
    if (block_checksum(scratch.data(), block_bytes) == h.block_sums[i]) {
      here.push_back(dst[i]);
    } else {
      there.push_back(h.blocks[i]);
    }
  }
  if (bad) *bad = here;
  return data_loss(
      "DistFlow: transfer {} from {}: {} of {} blocks differ from their checksums ({} bad in "
      "this group's memory: blocks [{}]; {} changed on the prefill side: its blocks [{}])",
      h.transfer, h.link, differ.size(), dst.size(), here.size(), fmt::join(here, ", "),
      there.size(), fmt::join(there, ", "));
}

Status KvReceiver::pull_from(Peer& p, const KvHandoff& h, std::span<const int32_t> dst,
                             KvStorage& local, std::vector<int32_t>* bad) {
  xccl::Transport& t = *p.transport;
  const uint64_t block_bytes = static_cast<uint64_t>(local.block_bytes());
  if (p.region_bytes < 8 * kTransferSlots)
    return failed_precondition("DistFlow: link {} exports no KV region", h.link);
  PullWatch w;
  w.start_ns = now_ns();
  w.expected_ns = static_cast<int64_t>(static_cast<double>(block_bytes * dst.size()) /
                                       probe_.expected_bytes_per_s * 1e9) +
                  probe_.slack_ns;
  w.probe_at_ns = w.start_ns + w.expected_ns;
  const uint64_t kv_bytes = p.region_bytes - 8 * kTransferSlots;
  const xccl::MemDesc held{0, kv_bytes + 8 * (h.transfer % kTransferSlots), 8, xccl::kExportRegion};
  uint64_t word = 0;
  XDS_RETURN_IF_ERROR(read(p, held, &word, 8, h.link));
  if (word != h.transfer)
    return aborted("DistFlow: transfer {} of {} was already freed (its deadline passed)",
                   h.transfer, h.link);
  XDS_RETURN_IF_ERROR(wait_unheld(p, w, h, held));
  uint64_t batch = 0;  // bytes issued since the last flush
  for (size_t i = 0; i < dst.size(); ++i) {
    const uint64_t off = static_cast<uint64_t>(h.blocks[i]) * block_bytes;
    if (h.blocks[i] < 0 || off + block_bytes > kv_bytes) {
      return invalid_argument("DistFlow: block {} of the handoff is outside {}'s region", h.blocks[i],
                              h.link);
    }
    const xccl::MemDesc src{0, off, block_bytes, xccl::kExportRegion};
    if (t.get(local.block_ptr(dst[i]), src, 0, block_bytes) == xccl::OpState::kFailed)
      return unavailable("DistFlow: get from {} failed", h.link);
    batch += block_bytes;
    if (batch >= kWatchBatchBytes && i + 1 < dst.size()) {
      if (t.flush() == xccl::OpState::kFailed)
        return unavailable("DistFlow: the pulls from {} failed", h.link);
      batch = 0;
      XDS_RETURN_IF_ERROR(watch(p, w, h));
    }
  }
  if (t.flush() == xccl::OpState::kFailed)
    return unavailable("DistFlow: the pulls from {} failed", h.link);
  XDS_RETURN_IF_ERROR(read(p, held, &word, 8, h.link));  // the copies before the re-check
  if (word != h.transfer)
    return aborted("DistFlow: transfer {} of {} was freed during the pull", h.transfer, h.link);
  pulled_bytes_ += static_cast<int64_t>(block_bytes * dst.size());
  // Checked before the completion (the prefill side's blocks are held until then); a mismatch
  // still completes the transfer.
  const Status checked = verify(p, h, dst, local, bad);
  if (!checked.ok() && pull_state(checked) != PullState::kCorrupt) return checked;
  // The completion: wait for room in the ring, write the slot, then the signal.
  const int64_t deadline = now_ns() + int64_t{kLinkTimeoutMs} * 1'000'000;
  while (true) {
    uint64_t consumed = 0;
    XDS_RETURN_IF_ERROR(read(p, {0, p.layout.app + kConsumedOffset, 8}, &consumed, 8, h.link));
    if (p.posted - consumed < kCompletionSlots) break;
    if (now_ns() > deadline || !p.alive())
      return unavailable("DistFlow: prefill group {} stopped reading its completions", h.link);
    XDS_RETURN_IF_ERROR(watch(p, w, h));
    sched_yield();
  }
  const xccl::MemDesc slot{0, p.layout.app + kRingOffset + 8 * (p.posted % kCompletionSlots), 8};
  const uint64_t id = h.transfer;
  if (t.put_with_signal(slot, 0, &id, 8, {0, p.layout.signal_off(1, 0)}, p.posted + 1) ==
          xccl::OpState::kFailed ||
      t.flush() == xccl::OpState::kFailed) {
    return unavailable("DistFlow: the completion to {} failed", h.link);
  }
  ++p.posted;
  return checked;
}

KvPuller::KvPuller(KvReceiver receiver, KvStorage& local)
    : receiver_(std::move(receiver)), local_(local) {
  receiver_.count_probes_into(&probes_saturated_);
  thread_ = std::thread([this] { loop(); });
}

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
    std::vector<int32_t> bad;
    Status st = receiver_.pull(job.handoff, job.dst, local_, &bad);
    pulled_bytes_.store(receiver_.pulled_bytes(), std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    const PullState state = pull_state(st);
    if (state == PullState::kLinkFailed) {
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        if (it->handoff.link != job.handoff.link) {
          ++it;
          continue;
        }
        Done d{it->seq, PullState::kLinkFailed,
               unavailable("DistFlow: link {} failed under the pull of transfer {} before "
                           "transfer {}'s turn",
                           job.handoff.link, job.handoff.transfer, it->handoff.transfer),
               {}, /*behind_failed_link=*/true};
        done_.push_back(std::move(d));
        it = jobs_.erase(it);
      }
    }
    done_.push_back(Done{job.seq, state, std::move(st), std::move(bad)});
  }
}

}  // namespace xds::engine
