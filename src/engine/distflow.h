// DistFlow (P098-P103): a prefilled request's KV moves from the prefill DP group that
// computed it to the decode DP group that continues it, pulled by the decode side with
// one-sided reads when it has room.
//
//   prefill DP group (KvSender)                       decode DP group (KvReceiver)
//   KV cache in a SharedRegion, exported over         links to each prefill group it pulls
//   every link; a LinkListener per group.             from, made on first use.
//   after the first token: the sequence is parked,    a kDecode request arrives with the
//   its blocks held, transfer id registered; the      handoff (via the gateway); when its
//   handoff (metadata only) leaves with the last      blocks fit, get() each block from the
//   token delta.                                      peer's region, then post the transfer
//   polls its completion ring every loop: a           id into the peer's completion ring
//   completed id frees the parked sequence.           (put_with_signal), and decodes.
//
// Each prefill/decode DP-group pair is its own two-device link, so a dead peer poisons only
// that link. Two backends (P104), chosen by the decode side from the peers' addresses
// (xccl/transfer_backend.h): on one host the shared-memory link (xccl/link.h, name
// "kv-<shell pid>-g<group>" in the abstract namespace, the region mapped); between hosts a
// UCX link (xccl/ucx_link.h; the prefill group listens on HOST:port when given a transfer
// host, the region registered with UCX and pulled with ucp_get). Everything the decode side
// reads of the prefill side -- the format, the ring's consumed count, the validity table,
// the blocks -- it reads through the link's Transport, so both backends run the same code.
//
// The completion ring, the format and the probe lines live in the prefill side's (rank 0's)
// arena, app area (every field a u64; each 64-byte line has one writer):
//   [0, 8)                          consumed: completions the prefill side has read (it writes)
//   [64, 64 + 8 * kCompletionSlots) transfer ids, slot = completion number % kCompletionSlots
//                                   (the decode side writes)
//   kFormatOffset = 64 + 8 * kCompletionSlots
//   [kFormatOffset, +8 + len)       the sender's KV format: u64 length, then the text (len
//                                   < kFormatMax = 4096; the prefill side writes it once)
//   kProbeOffset = kFormatOffset + kFormatMax
//   [kProbeOffset, +8)              probe: the decode side's latest probe number, from 1 (it
//                                   writes it as a signal word: put_with_signal, no data)
//   [kProbeOffset + 64, +8)         answer: the latest probe number the prefill side has
//                                   written back (it writes)
//   [kProbeOffset + 72, +8)         hold: 1 while the prefill side holds this link's transfers
//                                   (fault injection: HandoffStage::inject_link_fault), else 0
//                                   (it writes)
//   app bytes = kProbeOffset + 128
// Rank 1 (the decode side) writes slot n, then signal (1 -> 0, index 0) = n + 1; it waits
// while n - consumed >= kCompletionSlots. The decode side checks the format when it links,
// and every handoff carries it too.
//
// Probing (P116): a pull that runs past its expected time (bytes / KvProbeOptions::
// expected_bytes_per_s + slack_ns) sends a probe (number n) and polls the answer word; the
// prefill side writes every probe number back from its DP group's loop (answer_probes(), also
// between a long step's layers). Answered (answer >= n): the link is saturated, not dead; the
// pull goes on and probes again after another slack. Not answered within probe_timeout_ns: the
// link failed; the pull ends Unavailable, the decode side poisons the link (shared memory:
// rank 0's poison word; UCX: the link is closed) and forgets it, so the next pull links anew,
// and the prefill side drops poisoned or dead links (drop_failed_links()). A decode side
// polls while it waits (hold, ring room) and between batches of copies; a single blocked UCX
// flush still ends only at the link's flush timeout.
//
// Checksums (P120): the prefill side hashes each block it parks (block_checksum, XXH3-64) and
// the sums ride on the handoff; the decode side hashes every block it pulled before it posts the
// completion. A block whose bytes differ is read again from the prefill side into scratch
// memory: matching there, the bytes went bad in this group's memory (the block is reported bad:
// the caller retires it); differing there too, the prefill side's copy changed (nothing local is
// retired). Either way the pull ends DataLoss (PullState::kCorrupt) and the handoff is
// recomputed from its tokens; the completion is still posted, so the prefill side frees it.
//
// The region holds the KV blocks, then a table of kTransferSlots words: slot id % kTransferSlots
// holds the transfer id while its blocks are held for it, 0 once freed. The decode side reads
// the slot before and after its copies (acquire): unchanged, the blocks were held throughout;
// otherwise the pull fails (a transfer freed at its deadline is never read as valid KV).
//
// Thread-safety: each object is used by its DP group's thread only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "protocol/payloads.h"
#include "model/causal_lm.h"
#include "model/kv_storage.h"
#include "xccl/link.h"
#include "xccl/shared_region.h"
#include "xccl/transfer_backend.h"
#include "xccl/transport.h"
#include "xccl/ucx_link.h"

namespace xds::engine {

inline constexpr uint64_t kCompletionSlots = 1024;
inline constexpr uint64_t kTransferSlots = 4096;

// When a pull counts as slow and when a slow link counts as failed (the header comment).
struct KvProbeOptions {
  double expected_bytes_per_s = 1e9;       // conservative: a pull is slow past bytes / this
  int64_t slack_ns = 200'000'000;          // ... plus this (also the pause between probes)
  int64_t probe_timeout_ns = 500'000'000;  // a probe unanswered this long: the link failed
};

// How a pull ended: kDone; kFailed (this handoff's KV cannot be had: a freed transfer, a
// format mismatch, a malformed handoff; the request ends); kLinkFailed (the link failed under
// the pull: a probe unanswered, the peer gone, an operation failed -- the status is
// Unavailable; the link is forgotten and the request can be recomputed from its tokens);
// kCorrupt (blocks pulled did not match their checksums -- DataLoss; the link is kept, the
// request can be recomputed from its tokens).
enum class PullState : uint8_t { kDone, kFailed, kLinkFailed, kCorrupt };
PullState pull_state(const Status& st);

// XXH3-64 of a KV block's bytes (KvHandoff::block_sums).
uint64_t block_checksum(const std::byte* block, size_t bytes);

// The text both sides must agree on before a block means the same thing to both: the model
// (type, hidden size, vocabulary, layers, MTP layers), block size, every plane's dtype,
// elements and row bytes, and the block's bytes.
std::string kv_format(const ModelInfo& info, const KvStorageShape& shape);

// The link's arena (small: signals and the completion ring only; KV travels in the region).
xccl::ArenaConfig distflow_link_config();

// "kv-<shell pid>-g<group>".
std::string distflow_link_name(int shell_pid, int group);

// UCX settings of DistFlow's links (64 KB TCP segments: docs/benchmarks.md), proving
// `secret` (the cluster secret) to the peer.
xccl::UcxLinkOptions distflow_ucx_options(const std::optional<xccl::LinkSecret>& secret);

class KvSender {
 public:
  // Listens on `link_name` and makes the region for `shape` (the KV storage lives there);
  // with a non-empty `ucx_host`, also on UCX at ucx_host:<a free port>, where a decode group
  // must prove `secret` (the cluster secret; required then: InvalidArgument without it).
  static Result<std::unique_ptr<KvSender>> create(
      const std::string& link_name, const KvStorageShape& shape, std::string format,
      const std::string& ucx_host = "", const std::optional<xccl::LinkSecret>& secret = {});
  const std::string& link_name() const { return link_name_; }
  // "host:port" of the UCX listener; empty without one.
  std::string ucx_address() const { return ucx_ ? ucx_->address() : std::string(); }
  const std::string& format() const { return format_; }
  xccl::SharedRegion& region() { return region_; }
  // The listener's fd: readable when a decode group connects (poll it with the control socket).
  int listen_fd() const { return listener_.fd(); }
  int ucx_listen_fd() const { return ucx_ ? ucx_->fd() : -1; }
  // Forms the links of the peers that are connecting now (never waits for one that is not);
  // logs each peer refused (rate-limited per message, base/log.h).
  Status accept_pending();
  // A new transfer id, marked valid in the region's table.
  uint64_t open_transfer();
  // Marks `id` freed (before its blocks are).
  void close_transfer(uint64_t id);
  // The KV storage's share of the region.
  std::span<std::byte> kv_bytes() { return region_.span().first(region_.bytes() - 8 * kTransferSlots); }
  // Appends the transfer ids completed since the last call, from every live link.
  void poll_completions(std::vector<uint64_t>& done);
  // Writes every link's latest probe number back; returns how many links had a new one.
  // Cheap (one load per link): call it every loop and between a long step's layers.
  int answer_probes();
  // Holds (true) or releases every link's transfers: while held, a decode side waits before
  // its copies (probing as usual). Links formed meanwhile start held. Fault injection only.
  void hold_links(bool hold);
  // Drops the links a decode side declared failed (poisoned) or whose peer is gone, after
  // appending their last completions to `done`; returns how many. A syscall per link: call it
  // about once a second.
  int drop_failed_links(std::vector<uint64_t>& done);
  int links() const { return static_cast<int>(links_.size()); }
  // Peers connected whose handshake has not finished (dropped after the handshake timeout).
  size_t pending_links() const { return listener_.pending() + (ucx_ ? ucx_->pending() : 0); }

 private:
  KvSender(std::string name, xccl::LinkListener listener, xccl::SharedRegion region,
           std::string format)
      : link_name_(std::move(name)),
        listener_(std::move(listener)),
        region_(std::move(region)),
        format_(std::move(format)) {}
  struct Peer {
    std::unique_ptr<xccl::Fabric> fabric;  // shared memory, or
    std::unique_ptr<xccl::UcxLink> ucx;    // UCX
    std::byte* arena = nullptr;            // this side's arena of the link
    uint64_t app = 0, posted_signal = 0, ready_signal = 0;  // offsets in it
    uint64_t consumed = 0;
    uint64_t answered = 0;  // the latest probe number written back
  };
  void poll_peer(Peer& p, std::vector<uint64_t>& done);
  // A formed link (fabric or ucx set): its arena offsets filled in, its format written, its
  // ring opened.
  void adopt(Peer p);
  std::string link_name_;
  xccl::LinkListener listener_;
  std::optional<xccl::UcxListener> ucx_;
  xccl::UcxLinkOptions ucx_options_;  // the UCX listener's: the secret peers must prove
  xccl::SharedRegion region_;
  std::string format_;
  std::vector<Peer> links_;
  uint64_t transfers_ = 0;
  bool hold_ = false;
};

// Which backend a decode group pulls with: kAuto picks from its own host and the prefill
// side's UCX address (xccl::pick_transfer_backend; shared memory without one).
enum class KvBackendChoice : uint8_t { kAuto, kShm, kUcx };
Result<KvBackendChoice> parse_kv_backend(const std::string& name);

class KvReceiver {
 public:
  // `secret`: the cluster secret, proved to prefill groups reached over UCX (without it a
  // UCX pull fails FailedPrecondition).
  explicit KvReceiver(std::string format, KvBackendChoice backend = KvBackendChoice::kAuto,
                      std::string self_host = "127.0.0.1", KvProbeOptions probe = {},
                      std::optional<xccl::LinkSecret> secret = {})
      : format_(std::move(format)),
        backend_(backend),
        self_host_(std::move(self_host)),
        probe_(probe),
        secret_(secret) {}
  // Copies blocks h.blocks of h.link's region into `dst` (same count) of `local`, then posts
  // h.transfer to the sender's completion ring, probing the link while the pull is slow.
  // FailedPrecondition naming both formats when they differ; Aborted when the transfer was
  // freed; Unavailable, naming the link and why, when the link cannot be formed, its peer
  // died, an operation on it failed or a probe went unanswered (the link is then poisoned and
  // forgotten: the next pull links anew).
  // DataLoss when a block did not match its checksum (the header comment); *bad (optional)
  // then gets the blocks of `dst` whose bytes went bad here.
  Status pull(const KvHandoff& h, std::span<const int32_t> dst, KvStorage& local,
              std::vector<int32_t>* bad = nullptr);
  // Fault injection: the next pull with blocks flips a byte in each of its first `blocks`
  // destination blocks after they landed (as bad memory would). Any thread.
  void corrupt_next_pull(int64_t blocks) { corrupt_next_->store(blocks, std::memory_order_relaxed); }
  // Bytes pulled so far (for the load report).
  int64_t pulled_bytes() const { return pulled_bytes_; }
  // Probes answered while a pull was slow, so far.
  int64_t probes_saturated() const { return probes_saturated_; }
  // Also counts each of them into *total as it is answered (KvPuller's, read by the DP
  // group's thread while a pull runs); *total must outlive the receiver.
  void count_probes_into(std::atomic<int64_t>* total) { probes_total_ = total; }
  // Links held now (a failed one is forgotten).
  size_t links() const { return links_.size(); }

 private:
  struct Peer {
    std::unique_ptr<xccl::Fabric> fabric;           // shared memory: the mapped link
    std::unique_ptr<xccl::Transport> shm_transport;
    std::unique_ptr<xccl::UcxLink> ucx;             // or UCX
    xccl::Transport* transport = nullptr;
    xccl::ArenaLayout layout;
    uint64_t region_bytes = 0;
    uint64_t posted = 0;
    uint64_t probes = 0;  // the latest probe number sent
    bool alive() { return fabric ? fabric->peer_alive(0) : ucx->peer_alive(); }
  };
  // One pull's clock: when it counts as slow, and its probe in flight.
  struct PullWatch {
    int64_t start_ns = 0;
    int64_t expected_ns = 0;  // bytes / expected_bytes_per_s + slack_ns
    int64_t probe_at_ns = 0;  // probe when past this with none in flight
    uint64_t probe = 0;       // the probe awaiting its answer (0: none)
    int64_t probe_sent_ns = 0;
    int64_t answered = 0;  // probes answered in this pull
  };
  Result<Peer*> peer(const KvHandoff& h);
  Status pull_from(Peer& p, const KvHandoff& h, std::span<const int32_t> dst, KvStorage& local,
                   std::vector<int32_t>* bad);
  // The checks of the header comment over the blocks just pulled; DataLoss naming the blocks
  // that differ, *bad = those whose bytes went bad here.
  Status verify(Peer& p, const KvHandoff& h, std::span<const int32_t> dst, KvStorage& local,
                std::vector<int32_t>* bad);
  // Probes the link when the pull is slow; Unavailable when a probe went unanswered too long.
  Status watch(Peer& p, PullWatch& w, const KvHandoff& h);
  // Waits while the prefill side holds the link's transfers (watching; Aborted when the
  // transfer is freed meanwhile).
  Status wait_unheld(Peer& p, PullWatch& w, const KvHandoff& h, const xccl::MemDesc& held);
  // Poisons and forgets `link` after a pull on it failed Unavailable (the caller logs why).
  void drop_link(const std::string& link);
  // n bytes at `src` of the prefill side into dst, complete (get, then flush).
  Status read(Peer& p, const xccl::MemDesc& src, void* dst, uint64_t n, const std::string& link);
  std::string format_;
  KvBackendChoice backend_;
  std::string self_host_;
  KvProbeOptions probe_;
  std::optional<xccl::LinkSecret> secret_;
  std::unordered_map<std::string, Peer> links_;
  int64_t pulled_bytes_ = 0;
  int64_t probes_saturated_ = 0;
  std::atomic<int64_t>* probes_total_ = nullptr;
  // Behind a pointer so that the receiver stays movable.
  std::unique_ptr<std::atomic<int64_t>> corrupt_next_ = std::make_unique<std::atomic<int64_t>>(0);
};

// KvReceiver on a thread of its own (the decode side's asynchronous receive, P101/P103): the
// DP group posts a pull and goes on stepping; the blocks it reserved for the pull are not read
// by any step until the pull's completion is polled. Pulls run one at a time, in order; when a
// link fails under one, the pulls queued for the same link fail with it at once (each would
// otherwise wait out a probe of its own before its request is recomputed).
//
// Thread-safety: post() and poll() from the DP group's thread; the pulls run on the puller's.
// `local` must outlive the puller; the destination blocks of a posted pull must not be freed
// before its completion is polled.
class KvPuller {
 public:
  KvPuller(KvReceiver receiver, KvStorage& local);
  ~KvPuller();  // finishes the pull in progress, drops the queued ones, joins
  KvPuller(const KvPuller&) = delete;
  KvPuller& operator=(const KvPuller&) = delete;

  void post(int64_t seq, KvHandoff handoff, std::vector<int32_t> dst);
  // KvReceiver::corrupt_next_pull (fault injection).
  void corrupt_next_pull(int64_t blocks) { receiver_.corrupt_next_pull(blocks); }
  struct Done {
    int64_t seq = 0;
    PullState state = PullState::kDone;  // pull_state(status)
    Status status;
    std::vector<int32_t> bad_blocks;  // kCorrupt: destination blocks whose memory went bad
    // kLinkFailed without a pull of its own: it was queued for a link that failed under an
    // earlier pull (failed at once rather than waiting for a probe of its own).
    bool behind_failed_link = false;
  };
  // Appends the pulls completed since the last call (never waits).
  void poll(std::vector<Done>& out);
  int64_t pulled_bytes() const { return pulled_bytes_.load(std::memory_order_relaxed); }
  int64_t probes_saturated() const { return probes_saturated_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    int64_t seq = 0;
    KvHandoff handoff;
    std::vector<int32_t> dst;
  };
  void loop();

  KvReceiver receiver_;  // the puller thread's only
  KvStorage& local_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;    // guarded by mu_
  std::vector<Done> done_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::atomic<int64_t> pulled_bytes_{0};
  std::atomic<int64_t> probes_saturated_{0};
  std::thread thread_;
};

}  // namespace xds::engine
