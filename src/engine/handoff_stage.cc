#include "engine/handoff_stage.h"

#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "engine/cooperative_prefill.h"
#include "engine/speculative_stage.h"

namespace xds::engine {
namespace {

// How often the prefill side looks for links a decode group declared failed (a syscall each).
constexpr int64_t kLinkCheckPeriodNs = 1'000'000'000;

const char* link_fault_name(LinkFault::Kind k) {
  return k == LinkFault::kDelay ? "delay" : "drop";
}

}  // namespace

HandoffStage::HandoffStage(const HandoffOptions& options) : o_(options) {}

HandoffStage::~HandoffStage() = default;

KvStorageFactory HandoffStage::storage_factory() {
  if (!o_.export_kv) return nullptr;
  return [this](const KvStorageShape& shape, const std::string& format) -> Result<KvStorage> {
    XDS_ASSIGN_OR_RETURN(sender_, KvSender::create(o_.link_name, shape, format, o_.kv_transfer_host,
                                                   o_.link_secret));
    return KvStorage::wrap(shape, sender_->kv_bytes());
  };
}

Status HandoffStage::attach(EngineCore& core) {
  core_ = &core;
  XDS_ASSIGN_OR_RETURN(const KvBackendChoice backend, parse_kv_backend(o_.kv_transfer_backend));
  puller_ = std::make_unique<KvPuller>(
      KvReceiver(core.kv_format(), backend,
                 o_.kv_transfer_host.empty() ? std::string("127.0.0.1") : o_.kv_transfer_host,
                 o_.kv_probe, o_.link_secret),
      core.storage());
  core.table().set_on_finish_parked([this](Sequence& s) {
    sender_->close_transfer(s.transfer);
    parked_.erase(s.transfer);
  });
  return {};
}

bool HandoffStage::pool(EngineRequest& r) {
  if (!o_.cooperative_prefill || r.pool_number == 0) return false;
  pool_highest_ = std::max(pool_highest_, r.pool_number);
  const uint64_t n = r.pool_number;
  pool_.emplace(n, std::move(r));
  return true;
}

bool HandoffStage::cancel_pooled(const std::string& id) {
  for (const auto& [n, r] : pool_) {
    if (r.id == id) {  // still pooled: every group keeps it until the common assignment
      pool_cancelled_.push_back(id);
      return true;
    }
  }
  return false;
}

Result<bool> HandoffStage::cooperate(StepSync& sync,
                                     const std::function<void(EngineRequest)>& admit,
                                     const std::function<void(const std::string&)>& cancel) {
  const int64_t bs = core_->block_size();
  KvManager& kv = core_->kv();
  const RequestTable& table = core_->table();
  PoolGroupState mine;
  mine.highest = pool_highest_;
  mine.free_blocks = kv.available();
  for (const Sequence* s : table.waiting()) mine.queued_tokens += s->target;
  for (const Sequence* s : table.preempted()) mine.queued_tokens += s->target;
  for (const Sequence* s : table.running())
    mine.queued_tokens += std::max<int64_t>(0, s->target - s->computed);
  int i = 0;
  for (const auto& [n, r] : pool_) {
    if (i == kPoolWindow) break;
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    const auto hit = kv.match_prefix(r.prompt, std::max<int64_t>(0, (len - 1) / bs));
    mine.hits[static_cast<size_t>(i++)] =
        static_cast<uint16_t>(std::min<int64_t>(hit.blocks, 0xFFFF));
  }
  XDS_ASSIGN_OR_RETURN(std::span<const xccl::MailWords> words,
                       sync.exchange_words(kPoolStatePhase, pack_pool_state(mine)));
  std::vector<PoolGroupState> groups;
  uint64_t common = UINT64_MAX;
  for (const xccl::MailWords& w : words) {
    groups.push_back(unpack_pool_state(w));
    common = std::min(common, groups.back().highest);
  }
  std::vector<PoolRequest> pending;
  for (const auto& [n, r] : pool_) {
    if (n > common || pending.size() == static_cast<size_t>(kPoolWindow)) break;
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    pending.push_back({n, len, blocks_for(len + 1, bs)});
  }
  if (pending.empty()) return false;
  const std::vector<int> owner = assign_pooled(pending, groups, bs);
  bool any = false;
  for (size_t k = 0; k < pending.size(); ++k) {
    if (owner[k] < 0) break;
    any = true;
    auto it = pool_.find(pending[k].number);
    EngineRequest r = std::move(it->second);
    pool_.erase(it);
    const auto c = std::find(pool_cancelled_.begin(), pool_cancelled_.end(), r.id);
    const bool cancelled = c != pool_cancelled_.end();
    if (cancelled) pool_cancelled_.erase(c);
    if (owner[k] != o_.rank) continue;
    const std::string id = r.id;
    r.pool_number = 0;
    admit(std::move(r));
    if (cancelled) cancel(id);
  }
  return any;
}

void HandoffStage::answer_probes() {
  if (sender_ && fault_ != LinkFault::kDrop) sender_->answer_probes();
}

Status HandoffStage::inject_link_fault(LinkFault f) {
  if (!sender_) {
    return failed_precondition("DP group {}: a link fault needs a prefill group (it exports no KV)",
                               o_.rank);
  }
  if (f.duration_ms <= 0) {
    if (fault_)
      XDS_LOG_WARN("DP group {}: KV link fault ({}) ended", o_.rank, link_fault_name(*fault_));
    fault_.reset();
    sender_->hold_links(false);
    return {};
  }
  fault_ = f.kind;
  fault_end_ns_ = now_ns() + f.duration_ms * 1'000'000;
  sender_->hold_links(true);
  XDS_LOG_WARN("DP group {}: KV link fault injected: {} for {} ms on {}", o_.rank,
               link_fault_name(f.kind), f.duration_ms, sender_->link_name());
  return {};
}

void HandoffStage::serve_links() {
  const int64_t now = now_ns();
  if (fault_ && now >= fault_end_ns_) (void)inject_link_fault({*fault_, 0});
  if (fault_ != LinkFault::kDrop) {  // a dropped link answers nothing
    sender_->answer_probes();
    sender_->poll_completions(completed_);
  }
  if (now - links_checked_ns_ >= kLinkCheckPeriodNs) {
    links_checked_ns_ = now;
    sender_->drop_failed_links(completed_);
  }
}

Status HandoffStage::service(bool* ended) {
  *ended = false;
  RequestTable& table = core_->table();
  if (sender_) {
    XDS_RETURN_IF_ERROR(sender_->accept_pending());
    completed_.clear();
    serve_links();
    const size_t pulled = completed_.size();
    const int64_t now = now_ns();
    for (auto& [id, p] : parked_) {
      if (p.deadline_ns < now) completed_.push_back(id);  // expired: after the pulled ones
    }
    for (size_t i = 0; i < completed_.size(); ++i) {
      auto it = parked_.find(completed_[i]);
      if (it == parked_.end()) continue;  // pulled and expired, or cancelled meanwhile
      Sequence& s = *table.find(it->second.seq);
      if (i >= pulled) {
        ++transfers_expired_;
        XDS_LOG_WARN("DP group {}: request {}: no decode group pulled its KV in {} s; freed",
                     o_.rank, s.request->req.id, o_.kv_transfer_timeout_ns / 1'000'000'000);
      } else {
        ++transfers_done_;
      }
      table.finish(s, "", /*emit=*/false);  // the decode side streams the rest
    }
    *ended = !completed_.empty();
  }
  if (table.pulling().empty()) return {};
  pulled_.clear();
  puller_->poll(pulled_);
  SpeculativeStage* spec = core_->speculative();
  for (const KvPuller::Done& d : pulled_) {
    Sequence& s = *table.find(d.seq);
    table.end_pull(s);
    if (d.state == PullState::kLinkFailed && !d.behind_failed_link) ++links_failed_;
    if (d.state == PullState::kLinkFailed && !s.cancel_after_pull) {
      // The prompt and the prefill side's tokens are here: recompute the KV instead.
      XDS_LOG_WARN(
          "DP group {}: request {}: {}; the link is dropped (made anew by the next "
          "pull) and the request's KV is recomputed here",
          o_.rank, s.request->req.id, d.status.message());
      table.recompute_handoff(s);
      ++handoffs_recomputed_;
      continue;
    }
    if (d.state == PullState::kCorrupt) {
      ++checksum_mismatches_;
      XDS_LOG_WARN("DP group {}: request {}: {}; {} block(s) retired{}", o_.rank,
                   s.request->req.id, d.status.message(), d.bad_blocks.size(),
                   s.cancel_after_pull ? "" : ", the request's KV is recomputed here");
      if (!s.cancel_after_pull) {
        table.recompute_handoff(s, d.bad_blocks);
        ++handoffs_recomputed_;
        continue;
      }
      table.retire_bad_blocks(d.bad_blocks);
    }
    if (d.state != PullState::kDone || s.cancel_after_pull) {
      if (d.state != PullState::kDone && d.state != PullState::kCorrupt)
        XDS_LOG_WARN("DP group {}: request {}: {}", o_.rank, s.request->req.id,
                     d.status.message());
      table.finish(s, "abort");
      continue;
    }
    const KvHandoff& h = s.request->req.handoff;
    s.computed = h.rows;
    XDS_RETURN_IF_ERROR(core_->kv().commit(
        s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed))));
    s.spec = {};
    s.spec.length = s.spec.mtp_length = s.computed;  // the prefill side wrote the MTP rows too
    if (spec && static_cast<int64_t>(h.drafts.size()) <= spec->draft_tokens())
      s.spec.drafts = h.drafts;  // the first step verifies them
    table.start_running(s);
  }
  return {};
}

Status HandoffStage::start_pulls(const StepPlan& plan) {
  RequestTable& table = core_->table();
  KvManager& kv = core_->kv();
  for (int64_t id : plan.handoffs_unfittable) {
    Sequence& s = *table.find(id);
    XDS_LOG_WARN("DP group {}: handoff of {} ({} rows) does not fit: the cache holds {} KV "
                 "blocks, max model len {}",
                 o_.rank, s.request->req.id, s.request->req.handoff.rows,
                 kv.allocator().num_blocks(), core_->max_model_len());
    table.finish(s, "abort");
  }
  for (int64_t id : plan.handoffs) {
    Sequence& s = *table.find(id);
    const KvHandoff& h = s.request->req.handoff;
    s.kv = kv.add_sequence();
    kv.expect(s.kv, s.prompt_len() + s.sampling.max_tokens);
    XDS_RETURN_IF_ERROR(kv.reserve(s.kv, h.rows));
    const std::span<const int32_t> blocks = kv.table(s.kv);
    puller_->post(s.id, h, std::vector<int32_t>(blocks.begin(), blocks.begin() + h.blocks.size()));
    table.start_pull(s);
  }
  return {};
}

void HandoffStage::park() {
  RequestTable& table = core_->table();
  std::vector<Sequence*>& handoffs = table.handoffs();
  if (handoffs.empty()) return;
  const int64_t deadline = now_ns() + o_.kv_transfer_timeout_ns;
  for (Sequence* s : handoffs) {
    if (s->state != SeqState::kRunning) continue;  // cancelled in between
    KvHandoff& h = table.deltas()[static_cast<size_t>(s->handoff_delta)].handoff;
    s->handoff_delta = -1;
    h.link = sender_->link_name();
    h.ucx_address = sender_->ucx_address();
    h.transfer = sender_->open_transfer();
    h.rows = s->computed;
    const std::span<const int32_t> blocks = core_->kv().table(s->kv);
    h.blocks.assign(blocks.begin(), blocks.begin() + blocks_for(s->computed, core_->block_size()));
    const KvStorage& storage = core_->storage();
    h.block_sums.resize(h.blocks.size());
    for (size_t i = 0; i < h.blocks.size(); ++i) {
      h.block_sums[i] = block_checksum(storage.block_ptr(h.blocks[i]),
                                       static_cast<size_t>(storage.block_bytes()));
    }
    h.output.assign(s->tokens.begin() + s->prompt_len(), s->tokens.end());
    h.kv_format = core_->kv_format();
    h.prefill_group = o_.rank;
    h.drafts = s->spec.drafts;
    s->transfer = h.transfer;
    table.park(*s);
    parked_[h.transfer] = Parked{s->id, deadline};
  }
  handoffs.clear();
}

HandoffStats HandoffStage::stats() const {
  HandoffStats st;
  st.parked = static_cast<int64_t>(parked_.size());
  st.transfers_done = transfers_done_;
  st.transfers_expired = transfers_expired_;
  st.pulled_bytes = puller_ ? puller_->pulled_bytes() : 0;
  st.probes_saturated = puller_ ? puller_->probes_saturated() : 0;
  st.links_failed = links_failed_;
  st.handoffs_recomputed = handoffs_recomputed_;
  st.checksum_mismatches = checksum_mismatches_;
  return st;
}

}  // namespace xds::engine
