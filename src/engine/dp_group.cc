#include "engine/dp_group.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <chrono>
#include <thread>

#include <zmq.hpp>

#include "base/clock.h"
#include "base/env.h"
#include "base/log.h"
#include "engine/cooperative_prefill.h"
#include "engine/distflow.h"
#include "engine/dp_group_state.h"
#include "engine/eplb_agent.h"
#include "engine/ep_moe_exchange.h"
#include "engine/kv_manager.h"
#include "engine/mtp_drafter.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/step_sync.h"
#include "engine/zmq_io.h"
#include "model/causal_lm.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "model/speculative_decode.h"
#include "tokenizer/tokenizer.h"
#include "xccl/fabric.h"
#include "xccl/mailbox.h"
#include "xccl/transport.h"

namespace xds::engine {
namespace {

constexpr int64_t kLoadPeriodNs = 20'000'000;  // a kLoad to the shell at most every 20 ms
constexpr int64_t kExpertLoadPeriodNs = 1'000'000'000;  // expert counts in it about every 1 s

// The exchange's round size: a step's tokens (decodes + prefill chunks) in at most a few rounds.
// The order of the running, waiting and preempted lists: arrival.
bool arrived_before(const Sequence* a, const Sequence* b) {
  return a->arrival < b->arrival;
}

EpMoeOptions ep_options(int32_t max_num_batched_tokens, int32_t redundant_slots) {
  EpMoeOptions o;
  o.redundant_slots = redundant_slots;
  o.max_tokens = std::clamp(max_num_batched_tokens, 16, 512);
  o.timeout_ms = 600'000;  // a peer's long prefill chunk is not a dead peer
  o.int8_rows = true;      // W8A8 experts take the rows as INT8, quantized once by their device
  return o;
}

// The device's EPLB agent; XDS_EPLB_FAIL_LOAD (tests) wraps its loader to fail on one rank.
Result<std::unique_ptr<EplbAgent>> make_eplb_agent(CausalLm& model, EpMoeExchange& ex,
                                                   const DpGroupOptions& o) {
  EplbAgentSetup a;
  a.model = &model;
  a.exchange = &ex;
  a.redundant_slots = o.redundant_slots;
  a.window_ns = o.eplb_window_ns;
  if (env::eplb_fail_load_rank() == ex.rank())
    a.loader = std::make_unique<FailingReplicaLoader>(std::make_unique<CopyReplicaLoader>());
  return EplbAgent::create(std::move(a));
}

class DpGroup {
 public:
  DpGroup(xccl::Fabric& fabric, const DpGroupOptions& o) : fabric_(fabric), o_(o) {}
  Status init();
  Status run();

 private:
  // Control messages: drain what is queued (block up to `wait_ms` for the first; -1 forever).
  Status poll_control(int wait_ms);
  void on_message(Message m);
  void add_request(EngineRequest r);
  // Stops choice `index` of request `id` (-1: every choice); a request whose choices all
  // ended is released by release_finished().
  void cancel(const std::string& id, int32_t index);

  bool has_work() const {
    return !running_.empty() || !waiting_.empty() || !preempted_.empty() || !awaiting_.empty() ||
           !pulling_.empty() || !pool_.empty();
  }
  // Cooperative prefill: the pool state all-gathered after the step header, the same
  // assignment on every group; this group's requests leave the pool for its waiting list.
  // True when some request was assigned anywhere.
  Result<bool> cooperate();
  // DistFlow, every loop: links of decode groups that connect, completed transfers (their
  // parked sequences freed), transfers past the deadline (freed), then the awaiting handoffs
  // whose blocks fit pulled and started.
  Status service_distflow();
  // After the step's commit (MTP passes included): the prefill-only sequences that sampled
  // their first token are parked and their handoff rides on that token's delta.
  void park_handoffs();
  Status admit_handoffs();
  // The pulls the puller completed: their sequences start decoding (or end: a failed pull,
  // a cancel that came meanwhile).
  Status finish_pulls();
  Status plan_step();
  Status apply_plan();
  Status run_forward(uint64_t step);
  Status commit_step();
  // A prefill chunk's commit (chunk i; `row` its last token's logits, `hidden` its tokens'
  // final-normed hidden [count, D]): lengths advance, and once the prompt is in, every choice
  // samples its first token.
  Status commit_prefill(size_t i, const float* row, const float* hidden);
  // A speculative decode's commit: the acceptance rule over the verify rows ([1 + drafts,
  // vocab]), the accepted run emitted (cut at a stop or the length), the KV past it given back.
  Status commit_verify(size_t i, const float* rows, const float* hidden);
  // The step's MTP passes (speculation on): drafts for the next step, draft-extend rows.
  Status propose();
  // Appends `token` to t's output and to its delta; false once the choice has finished.
  bool emit_token(Sequence& t, int32_t token, TokenDelta& d);
  // Ends a choice: frees its KV; with `emit`, queues a final delta with the reason.
  void finish(Sequence& s, const std::string& reason, bool emit = true);
  void release_finished();
  void preempt(Sequence& s);
  Status fork_choices(Sequence& parent);
  void send_tokens();
  void send_load(bool force);
  // The prefix cache's block-hash events since the last call, to the shell (kBlocks).
  void send_cache_events();
  void report_eplb(std::optional<EplbReport> r);
  void remove_from(std::vector<Sequence*>& list, const Sequence* s);

  xccl::Fabric& fabric_;
  DpGroupOptions o_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvStorage> storage_;
  std::optional<KvManager> kv_;
  std::vector<BlockCopy> copies_;  // fork scratch
  std::unique_ptr<xccl::Transport> transport_;
  std::unique_ptr<xccl::Mailbox> mailbox_;
  std::unique_ptr<StepSync> sync_;
  std::unique_ptr<EpMoeExchange> exchange_;
  std::unique_ptr<EplbAgent> eplb_;  // with expert parallelism
  Sampler sampler_;
  int64_t max_model_len_ = 0;
  int64_t valid_vocab_ = 0;
  std::vector<int32_t> eos_ids_;
  std::optional<MtpDrafter> drafter_;  // speculative decoding (--speculative-tokens > 0)
  std::vector<MtpDraftWork> draft_work_;
  std::vector<Sequence*> draft_seqs_;  // [draft_work_] whose rows each work item carries
  SpecVerifyResult verdict_;
  // Speculation counters, cumulative: verify steps that had drafts, the tokens they gave, and
  // per draft position the drafts verified and accepted.
  int64_t spec_steps_ = 0, spec_tokens_ = 0;
  std::vector<int64_t> spec_drafted_, spec_accepted_;
  int64_t prefix_hits_ = 0, prefix_queries_ = 0;  // blocks
  int64_t preemptions_ = 0;

  zmq::context_t ctx_{1};
  zmq::socket_t control_{ctx_, zmq::socket_type::pull};
  zmq::socket_t shell_{ctx_, zmq::socket_type::push};
  zmq::socket_t output_{ctx_, zmq::socket_type::push};

  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_, waiting_, preempted_;  // each sorted by arrival
  std::vector<Sequence*> awaiting_;                       // kAwaitingKv, arrival order
  std::map<uint64_t, EngineRequest> pool_;                // cooperative prefill, by number
  uint64_t pool_highest_ = 0;
  std::vector<std::string> pool_cancelled_;  // ids cancelled while pooled (dropped when assigned)
  std::vector<Sequence*> handoffs_;                       // this step's first tokens to park
  std::unique_ptr<KvSender> sender_;                      // prefill role (export_kv)
  std::unique_ptr<KvPuller> puller_;                      // every group: decode phases
  std::vector<Sequence*> pulling_;                        // kPullingKv
  std::vector<KvPuller::Done> pulled_;                    // scratch
  struct Parked {
    int64_t seq = 0;
    int64_t deadline_ns = 0;
  };
  std::unordered_map<uint64_t, Parked> parked_;  // by transfer id
  std::vector<uint64_t> completed_;              // scratch
  std::string kv_format_;
  int64_t transfers_done_ = 0, transfers_expired_ = 0;
  int64_t next_seq_ = 0, next_arrival_ = 0;
  uint64_t wake_seen_ = 0;    // highest kWake seq received
  uint64_t wake_slept_ = 0;   // the highest any device had seen when all went to sleep
  bool draining_ = false;
  int64_t last_load_ns_ = 0;
  int64_t last_expert_load_ns_ = 0;
  int64_t steps_ = 0;
  double last_batch_ = 0;

  // One step's scratch (reused).
  SchedulerInput sched_in_;
  StepPlan plan_;
  std::vector<TokenChunk> chunks_;
  std::vector<Sequence*> chunk_seqs_;
  std::vector<Sequence*> samplers_;
  StepOutput out_;
  std::vector<TokenDelta> deltas_;
  PrefixCache::Events cache_events_;
};

Status DpGroup::init() {
  XDS_ASSIGN_OR_RETURN(model_, load_causal_lm(o_.model_dir, o_.model));
  const ModelInfo& info = model_->info();
  max_model_len_ = o_.max_model_len > 0
                       ? std::min<int64_t>(o_.max_model_len, info.max_position_embeddings)
                       : info.max_position_embeddings;
  valid_vocab_ = info.vocab_size;
  if (Tokenizer::has_tokenizer_files(o_.model_dir)) {  // ids beyond the tokenizer never win
    XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o_.model_dir));
    valid_vocab_ = std::min<int64_t>(valid_vocab_, tok.vocab_size());
  }
  for (int64_t id : info.eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
  if (o_.speculative_tokens > 0) {
    XDS_ASSIGN_OR_RETURN(const MtpSpecConfig spec,
                         mtp_spec_config(o_.speculative_tokens, o_.speculative_mtp_layers,
                                         info.n_mtp_layers));
    drafter_.emplace(*model_, spec, valid_vocab_);
    spec_drafted_.assign(static_cast<size_t>(spec.draft_tokens), 0);
    spec_accepted_.assign(static_cast<size_t>(spec.draft_tokens), 0);
  } else if (o_.speculative_mtp_layers > 0) {
    return invalid_argument("--speculative-mtp-layers {} needs --speculative-tokens k > 0",
                            o_.speculative_mtp_layers);
  }

  KvStorageShape shape;
  shape.layout = model_->kv_layout();
  shape.block_size = o_.block_size;
  shape.num_blocks = 1;
  const int64_t block_bytes = KvStorage::bytes_for(shape);
  if (block_bytes <= 0) return internal_error("DP group: the model's KV layout is invalid");
  const int64_t blocks = o_.kv_memory_bytes / block_bytes;
  if (blocks < 1) {
    return invalid_argument("--kv-memory {} bytes holds no KV block ({} bytes for {} tokens)",
                            o_.kv_memory_bytes, block_bytes, o_.block_size);
  }
  shape.num_blocks = blocks;
  kv_format_ = kv_format(info, shape);
  if (o_.export_kv) {
    XDS_ASSIGN_OR_RETURN(sender_, KvSender::create(distflow_link_name(getppid(), fabric_.rank()),
                                                   shape, kv_format_, o_.kv_transfer_host));
    XDS_ASSIGN_OR_RETURN(auto storage, KvStorage::wrap(shape, sender_->kv_bytes()));
    storage_ = std::make_unique<KvStorage>(std::move(storage));
  } else {
    XDS_ASSIGN_OR_RETURN(auto storage, KvStorage::create(shape));
    storage_ = std::make_unique<KvStorage>(std::move(storage));
  }
  KvManagerOptions ko;
  ko.num_blocks = static_cast<int32_t>(blocks);
  ko.block_size = o_.block_size;
  ko.prefix_cache = o_.prefix_cache;
  // A cached block's last MTP row depends on the token after it (prefix_cache.h).
  ko.mtp_drop_last_hit = drafter_.has_value();
  XDS_ASSIGN_OR_RETURN(KvManager kv, KvManager::create(ko));
  kv_.emplace(std::move(kv));
  XDS_ASSIGN_OR_RETURN(const KvBackendChoice backend, parse_kv_backend(o_.kv_transfer_backend));
  puller_ = std::make_unique<KvPuller>(
      KvReceiver(kv_format_, backend,
                 o_.kv_transfer_host.empty() ? std::string("127.0.0.1") : o_.kv_transfer_host),
      *storage_);
  kv_->record_cache_events(o_.prefix_cache);

  if (fabric_.world_size() > 1) {
    XDS_ASSIGN_OR_RETURN(transport_, xccl::make_transport("shm", fabric_));
    mailbox_ = std::make_unique<xccl::Mailbox>(fabric_, *transport_);
    std::vector<int> ranks;
    for (int r = 0; r < fabric_.world_size(); ++r) ranks.push_back(r);
    sync_ = std::make_unique<StepSync>(*mailbox_, ranks, /*timeout_ms=*/600'000);
    EpMoeSetup setup;
    setup.model = model_.get();
    setup.mailbox = mailbox_.get();
    setup.options = ep_options(o_.max_num_batched_tokens, o_.redundant_slots);
    XDS_ASSIGN_OR_RETURN(exchange_, EpMoeExchange::create(setup));
    model_->set_moe_exchange(exchange_.get());
    XDS_ASSIGN_OR_RETURN(eplb_, make_eplb_agent(*model_, *exchange_, o_));
  }

  try {
    control_.set(zmq::sockopt::linger, 0);
    control_.connect(o_.control_address);
    shell_.set(zmq::sockopt::linger, 1000);
    shell_.connect(o_.shell_address);
    output_.set(zmq::sockopt::linger, 5000);
    output_.connect(o_.output_address);
  } catch (const zmq::error_t& e) {
    return unavailable("DP group {}: cannot connect its sockets: {}", fabric_.rank(), e.what());
  }
  if (eplb_)
    XDS_LOG_INFO("DP group {}: {} redundant expert slots per MoE layer, {:.1f} MiB reserved "
                 "(slots and their staging)",
                 fabric_.rank(), o_.redundant_slots, double(eplb_->reserved_bytes()) / (1 << 20));
  XDS_LOG_INFO("DP group {}: {} KV blocks of {} tokens ({:.1f} MiB), max model len {}",
               fabric_.rank(), blocks, o_.block_size,
               static_cast<double>(blocks * block_bytes) / (1 << 20), max_model_len_);
  send_load(/*force=*/true);
  return {};
}

void DpGroup::remove_from(std::vector<Sequence*>& list, const Sequence* s) {
  list.erase(std::remove(list.begin(), list.end(), s), list.end());
}

Status DpGroup::poll_control(int wait_ms) {
  // Parked transfers complete through memory, not the socket: look again every millisecond.
  if (!parked_.empty() && (wait_ms < 0 || wait_ms > 1)) wait_ms = 1;
  zmq::pollitem_t items[3] = {{control_.handle(), 0, ZMQ_POLLIN, 0},
                              {nullptr, sender_ ? sender_->listen_fd() : -1, ZMQ_POLLIN, 0},
                              {nullptr, sender_ ? sender_->ucx_listen_fd() : -1, ZMQ_POLLIN, 0}};
  const size_t n_items = !sender_ ? 1 : sender_->ucx_listen_fd() >= 0 ? 3 : 2;
  if (wait_ms != 0) {
    try {
      zmq::poll(items, n_items, std::chrono::milliseconds(wait_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return internal_error("DP group: poll failed: {}", e.what());
    }
  }
  while (true) {
    auto m = recv_message(control_, /*dontwait=*/true);
    if (!m.ok()) {
      XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), m.status().message());
      continue;
    }
    if (!m->has_value()) break;
    on_message(std::move(**m));
  }
  return {};
}

void DpGroup::on_message(Message m) {
  switch (m.kind) {
    case MessageKind::kRequest:
      if (m.request) add_request(std::move(*m.request));
      break;
    case MessageKind::kCancel:
      cancel(m.request_id, m.index);
      break;
    case MessageKind::kWake:
      wake_seen_ = std::max(wake_seen_, m.seq);
      break;
    case MessageKind::kPing: {
      Message pong;
      pong.kind = MessageKind::kPong;
      pong.seq = m.seq;
      pong.group = fabric_.rank();
      (void)send_message(shell_, pong);
      break;
    }
    case MessageKind::kShutdown:
      draining_ = true;
      break;
    case MessageKind::kEplb:
      if (eplb_ && m.eplb) report_eplb(eplb_->on_command(*m.eplb, fabric_.rank()));
      break;
    default:
      XDS_LOG_WARN("DP group {}: unexpected message kind {}", fabric_.rank(),
                   static_cast<int>(m.kind));
  }
}

void DpGroup::add_request(EngineRequest r) {
  if (o_.cooperative_prefill && r.pool_number > 0) {
    pool_highest_ = std::max(pool_highest_, r.pool_number);
    const uint64_t n = r.pool_number;
    pool_.emplace(n, std::move(r));
    return;
  }
  if (requests_.count(r.id)) {
    XDS_LOG_WARN("DP group {}: duplicate request id {}", fabric_.rank(), r.id);
    return;
  }
  // The output process learns the request's output options (stop strings, parsers, where to
  // stream) before its first token.
  Message fwd;
  fwd.kind = MessageKind::kRequest;
  fwd.request = r;
  fwd.request->prompt.clear();
  Status st = send_message(output_, fwd);
  if (!st.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), st.message());
  const auto phase = static_cast<RequestPhase>(r.phase);
  auto req = std::make_unique<Request>();
  req->req = std::move(r);
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_++;
  seq->arrival = next_arrival_;
  next_arrival_ += 1 + req->req.sampling.n;
  seq->request = req.get();
  seq->sampling = req->req.sampling;
  seq->tokens = req->req.prompt;
  seq->target = static_cast<int64_t>(seq->tokens.size());
  req->choices.push_back(seq.get());
  if (phase == RequestPhase::kDecode) {
    // Prompt + the tokens the prefill side generated; the KV of [0, rows) arrives by DistFlow.
    const KvHandoff& h = req->req.handoff;
    seq->tokens.insert(seq->tokens.end(), h.output.begin(), h.output.end());
    seq->target = h.rows;
    seq->state = SeqState::kAwaitingKv;
    awaiting_.push_back(seq.get());
  } else {
    waiting_.push_back(seq.get());
  }
  seqs_[seq->id] = std::move(seq);
  requests_[req->req.id] = std::move(req);
}

void DpGroup::cancel(const std::string& id, int32_t index) {
  for (const auto& [n, r] : pool_) {
    if (r.id == id) {  // still pooled: every group keeps it until the common assignment
      pool_cancelled_.push_back(id);
      return;
    }
  }
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (index < 0) it->second->cancelled = true;
  for (Sequence* s : it->second->choices) {
    if (s->state == SeqState::kPullingKv) {  // its blocks are being written: end it after
      s->cancel_after_pull = true;
      continue;
    }
    if (s->state != SeqState::kFinished && (index < 0 || s->index == index)) finish(*s, "abort");
  }
}

void DpGroup::finish(Sequence& s, const std::string& reason, bool emit) {
  s.finish_reason = reason;
  if (emit) {
    TokenDelta d;
    d.request_id = s.request->req.id;
    d.index = s.index;
    d.finish_reason = reason;
    d.prompt_tokens = static_cast<int32_t>(s.prompt_len());
    d.cached_tokens = s.cached_tokens;
    deltas_.push_back(std::move(d));
  }
  if (s.kv >= 0) {
    kv_->free(s.kv);
    s.kv = -1;
  }
  remove_from(running_, &s);
  remove_from(waiting_, &s);
  remove_from(preempted_, &s);
  remove_from(awaiting_, &s);
  if (s.state == SeqState::kParked) {
    sender_->close_transfer(s.transfer);
    parked_.erase(s.transfer);
  }
  s.state = SeqState::kFinished;
  s.request->finished += 1;
}

void DpGroup::preempt(Sequence& s) {
  ++preemptions_;
  if (s.kv >= 0) kv_->free(s.kv);
  s.kv = -1;
  s.computed = 0;
  s.cached_tokens = 0;
  s.spec = {};
  s.target = static_cast<int64_t>(s.tokens.size());
  // The last sampled token is an input of the next decode, not part of the prefill target:
  // recompute everything before it, then decode it as usual.
  if (s.output_len() > 0) s.target -= 1;
  s.state = SeqState::kPreempted;
  remove_from(running_, &s);
  preempted_.insert(std::upper_bound(preempted_.begin(), preempted_.end(), &s, arrived_before),
                    &s);
}

void DpGroup::release_finished() {
  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& r = *it->second;
    const int32_t n = r.req.sampling.n;
    const bool all = r.finished >= static_cast<int32_t>(r.choices.size()) &&
                     (static_cast<int32_t>(r.choices.size()) == n || r.cancelled ||
                      r.choices[0]->state == SeqState::kFinished);
    if (!all) {
      ++it;
      continue;
    }
    for (Sequence* s : r.choices) seqs_.erase(s->id);
    it = requests_.erase(it);
  }
}

Status DpGroup::plan_step() {
  auto fill = [&](const std::vector<Sequence*>& from, std::vector<SchedSeq>& to) {
    to.clear();
    for (const Sequence* s : from) {
      SchedSeq q;
      q.id = s->id;
      q.arrival = s->arrival;
      q.target = s->target;
      q.computed = s->computed;
      q.blocks_held = s->kv >= 0 ? static_cast<int64_t>(kv_->table(s->kv).size()) : 0;
      if (s->state != SeqState::kRunning) {
        const auto hit = kv_->match_prefix(std::span<const int32_t>(s->tokens).first(
                                               static_cast<size_t>(s->target)),
                                           (s->target - 1) / o_.block_size);
        q.hit_blocks = hit.blocks;
        q.hit_evictable = hit.evictable;
      }
      to.push_back(q);
    }
  };
  fill(running_, sched_in_.running);
  fill(preempted_, sched_in_.preempted);
  fill(waiting_, sched_in_.waiting);
  SchedulerLimits lim;
  lim.max_num_seqs = o_.max_num_seqs;
  lim.max_num_batched_tokens = o_.max_num_batched_tokens;
  lim.free_blocks = kv_->available();
  lim.total_blocks = storage_->num_blocks();
  lim.block_size = o_.block_size;
  lim.chunked_prefill = o_.chunked_prefill;
  lim.lookahead = drafter_ ? drafter_->config().draft_tokens : 0;
  return schedule(sched_in_, lim, &plan_);
}

Status DpGroup::apply_plan() {
  for (int64_t id : plan_.preempted) preempt(*seqs_.at(id));
  for (int64_t id : plan_.unfittable) {
    Sequence& s = *seqs_.at(id);
    finish(s, "abort");
    XDS_LOG_WARN("DP group {}: request {} needs more KV than the whole cache holds",
                 fabric_.rank(), s.request->req.id);
  }
  for (const StepAdmission& a : plan_.admitted) {
    Sequence& s = *seqs_.at(a.seq);
    s.kv = kv_->add_sequence();
    kv_->expect(s.kv, s.prompt_len() + s.sampling.max_tokens);
    const int64_t attached = kv_->attach_prefix(
        s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.target)),
        a.hit_blocks);
    prefix_hits_ += attached / o_.block_size;
    prefix_queries_ += (s.target - 1) / o_.block_size;
    s.computed = attached;
    // The attached blocks' MTP rows are final (the hit stops a block short: prefix_cache.h).
    s.spec = {};
    s.spec.length = s.spec.mtp_length = attached;
    if (s.output_len() == 0 || s.state == SeqState::kWaiting) {
      s.cached_tokens = static_cast<int32_t>(std::min(s.computed, s.prompt_len()));
    }
    remove_from(waiting_, &s);
    remove_from(preempted_, &s);
    s.state = SeqState::kRunning;
    running_.push_back(&s);
  }
  std::sort(running_.begin(), running_.end(), arrived_before);
  chunks_.clear();
  chunk_seqs_.clear();
  for (const StepChunk& c : plan_.chunks) {
    Sequence& s = *seqs_.at(c.seq);
    XDS_CHECK(c.start == s.computed, "chunk of seq {} starts at {}, computed {}", c.seq, c.start,
              s.computed);
    TokenChunk tc;
    tc.start_pos = c.start;
    if (drafter_ && c.decode) {  // verify [x_L, drafts] (the budget counted k drafts)
      XDS_CHECK(s.spec.length == s.computed, "seq {}: speculative length {}, computed {}", c.seq,
                s.spec.length, s.computed);
      mtp_spec_verify_tokens(s.spec, s.tokens.back(), s.verify);
      tc.tokens = s.verify;
      tc.all_logits = true;
    } else {
      tc.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(c.start),
                                                             static_cast<size_t>(c.count));
      tc.all_logits = false;
    }
    XDS_RETURN_IF_ERROR(
        kv_->reserve(s.kv, c.start + static_cast<int64_t>(tc.tokens.size())));
    tc.blocks = kv_->table(s.kv);
    chunks_.push_back(tc);
    chunk_seqs_.push_back(&s);
  }
  return {};
}

Status DpGroup::run_forward(uint64_t step) {
  if (exchange_) exchange_->set_step(fabric_.epoch(), static_cast<uint32_t>(step));
  return model_->forward(chunks_, *storage_, out_);
}

Status DpGroup::commit_step() {
  // out_.logits: per chunk one row (its last token), or one per token for a verify chunk
  // (all_logits); out_.hidden: every token's final-normed hidden, in chunk order.
  const int64_t vocab = model_->info().vocab_size;
  const int64_t d = model_->info().hidden_size;
  int64_t logit_row = 0, token_row = 0;
  for (size_t i = 0; i < plan_.chunks.size(); ++i) {
    const int64_t count = static_cast<int64_t>(chunks_[i].tokens.size());
    const int64_t rows = chunks_[i].all_logits ? count : 1;
    const float* logits = out_.logits.data() + logit_row * vocab;
    const float* hidden = drafter_ ? out_.hidden.data() + token_row * d : nullptr;
    logit_row += rows;
    token_row += count;
    if (chunk_seqs_[i]->state != SeqState::kRunning) continue;  // cancelled during the step
    if (chunks_[i].all_logits) {
      XDS_RETURN_IF_ERROR(commit_verify(i, logits, hidden));
    } else {
      XDS_RETURN_IF_ERROR(commit_prefill(i, logits, hidden));
    }
  }
  return drafter_ ? propose() : Status{};
}

bool DpGroup::emit_token(Sequence& t, int32_t token, TokenDelta& d) {
  t.tokens.push_back(token);
  d.tokens.push_back(token);
  d.finish_reason = finish_reason_after(t, token, eos_ids_, max_model_len_);
  return d.finish_reason.empty();
}

Status DpGroup::commit_prefill(size_t i, const float* row, const float* hidden) {
  const StepChunk& c = plan_.chunks[i];
  Sequence& s = *chunk_seqs_[i];
  s.computed = c.start + c.count;
  XDS_RETURN_IF_ERROR(
      kv_->commit(s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed))));
  if (drafter_) {
    mtp_spec_commit(s.spec, hidden, c.count, model_->info().hidden_size);
    s.spec_committed = true;
  }
  // Sample only once every known token has KV: a recomputed (preempted) sequence's last
  // prefill chunk stops before its last sampled token, which its next decode feeds.
  if (s.computed < static_cast<int64_t>(s.tokens.size())) return {};
  if (s.computed == s.target && s.output_len() == 0 && s.index == 0 &&
      s.request->req.sampling.n > 1 && !s.forked) {
    XDS_RETURN_IF_ERROR(fork_choices(s));
  }
  // Every choice that shares this prefill samples its first token from the same row.
  samplers_.assign(1, &s);
  if (s.forked && s.output_len() == 0) {
    for (size_t k = 1; k < s.request->choices.size(); ++k) {
      if (s.request->choices[k]->output_len() == 0) samplers_.push_back(s.request->choices[k]);
    }
  }
  for (Sequence* t : samplers_) {
    SampleInput in;
    in.logits = row;
    in.valid_vocab = valid_vocab_;
    const SamplingOptions& opts = t->sampling;
    in.options = &opts;
    in.prompt = t->request->req.prompt;
    in.output = std::span<const int32_t>(t->tokens).subspan(static_cast<size_t>(t->prompt_len()));
    in.position = static_cast<int64_t>(t->tokens.size());
    in.draw = 0;
    TokenLogprob lp;
    XDS_ASSIGN_OR_RETURN(int32_t token, sampler_.sample(in, opts.logprobs >= 0 ? &lp : nullptr));
    TokenDelta d;
    d.request_id = t->request->req.id;
    d.index = t->index;
    if (opts.logprobs >= 0) d.logprobs.push_back(std::move(lp));
    d.prompt_tokens = static_cast<int32_t>(t->prompt_len());
    d.cached_tokens = t->cached_tokens;
    emit_token(*t, token, d);
    const std::string reason = d.finish_reason;
    deltas_.push_back(std::move(d));
    if (!reason.empty()) {
      finish(*t, reason, /*emit=*/false);
    } else if (sender_ && static_cast<RequestPhase>(t->request->req.phase) ==
                              RequestPhase::kPrefillOnly && t->request->req.sampling.n == 1) {
      t->handoff_delta = static_cast<int64_t>(deltas_.size()) - 1;
      handoffs_.push_back(t);
    }
  }
  return {};
}

Status DpGroup::commit_verify(size_t i, const float* rows, const float* hidden) {
  const StepChunk& c = plan_.chunks[i];
  Sequence& s = *chunk_seqs_[i];
  const SamplingOptions& opts = s.sampling;
  const std::vector<int32_t>& drafts = s.spec.drafts;
  const int64_t n = static_cast<int64_t>(drafts.size());
  SpecVerifyInput in;
  in.logits = rows;
  in.row_stride = model_->info().vocab_size;
  in.valid_vocab = valid_vocab_;
  in.drafts = drafts;
  in.options = &opts;
  in.prompt = s.request->req.prompt;
  in.output = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.prompt_len()));
  in.position = static_cast<int64_t>(s.tokens.size());
  XDS_RETURN_IF_ERROR(speculative_accept(sampler_, in, verdict_));
  const int64_t accepted = verdict_.accepted;
  if (n > 0) {
    ++spec_steps_;
    spec_tokens_ += accepted + 1;
    for (int64_t r = 0; r < n; ++r) {
      ++spec_drafted_[static_cast<size_t>(r)];
      if (r < accepted) ++spec_accepted_[static_cast<size_t>(r)];
    }
  }
  // Rows [x_L, d_1 .. d_accepted] are final; the run's tokens go out one by one, up to a stop.
  s.computed = c.start + accepted + 1;
  TokenDelta d;
  d.request_id = s.request->req.id;
  d.index = s.index;
  d.prompt_tokens = static_cast<int32_t>(s.prompt_len());
  d.cached_tokens = s.cached_tokens;
  for (size_t r = 0; r < verdict_.tokens.size(); ++r) {
    const int32_t token = verdict_.tokens[r];
    if (opts.logprobs >= 0) {
      TokenLogprob lp;
      XDS_RETURN_IF_ERROR(sampler_.raw_logprobs(rows + static_cast<int64_t>(r) * in.row_stride,
                                                valid_vocab_, token, opts.logprobs, &lp));
      d.logprobs.push_back(std::move(lp));
    }
    if (!emit_token(s, token, d)) break;
  }
  const std::string reason = d.finish_reason;
  deltas_.push_back(std::move(d));
  if (!reason.empty()) {
    finish(s, reason, /*emit=*/false);
    return {};
  }
  XDS_RETURN_IF_ERROR(
      kv_->commit(s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed))));
  XDS_RETURN_IF_ERROR(kv_->truncate(s.kv, s.computed));  // the rejected drafts' rows
  mtp_spec_commit(s.spec, hidden, accepted + 1, model_->info().hidden_size);
  s.spec_committed = true;
  return {};
}

Status DpGroup::propose() {
  const MtpSpecConfig& cfg = drafter_->config();
  draft_work_.clear();
  draft_seqs_.clear();
  for (Sequence* s : running_) {
    if (!s->spec_committed) continue;
    s->spec_committed = false;
    MtpDraftWork w;
    w.state = &s->spec;
    const int64_t length = s->spec.length;
    w.tokens = std::span<const int32_t>(s->tokens).first(static_cast<size_t>(length + 1));
    w.extend_only = static_cast<int64_t>(s->tokens.size()) > length + 1;  // prefilling
    if (!w.extend_only) {
      // Drafts past max_tokens or the context could never be emitted (a verify of n drafts
      // gives at most n + 1 tokens and writes positions up to length + n).
      const int64_t remaining = s->sampling.max_tokens - s->output_len();
      const int64_t room = max_model_len_ - 1 - length;
      w.passes = std::max<int64_t>(0, std::min({cfg.draft_tokens, remaining - 1, room}));
      // The chain rows' blocks; with none to be had, fewer drafts.
      if (!kv_->reserve(s->kv, mtp_spec_propose_end(s->spec, w.passes)).ok()) {
        w.passes = std::min(w.passes, kv_->capacity(s->kv) - length + 1);
      }
      if (w.passes == 0) continue;
    }
    w.blocks = kv_->table(s->kv);
    draft_work_.push_back(w);
    draft_seqs_.push_back(s);
  }
  XDS_RETURN_IF_ERROR(drafter_->propose(draft_work_, *storage_, /*run_empty=*/exchange_ != nullptr));
  // The chain rows are provisional: their blocks go back (the next verify reserves again).
  // Only the passes' sequences reserved past `computed` (a verify already gave its rest back).
  for (Sequence* s : draft_seqs_) {
    if (kv_->capacity(s->kv) > s->computed) XDS_RETURN_IF_ERROR(kv_->truncate(s->kv, s->computed));
  }
  return {};
}

void DpGroup::park_handoffs() {
  const int64_t deadline = now_ns() + o_.kv_transfer_timeout_ns;
  for (Sequence* s : handoffs_) {
    if (s->state != SeqState::kRunning) continue;  // cancelled in between
    KvHandoff& h = deltas_[static_cast<size_t>(s->handoff_delta)].handoff;
    s->handoff_delta = -1;
    h.link = sender_->link_name();
    h.ucx_address = sender_->ucx_address();
    h.transfer = sender_->open_transfer();
    h.rows = s->computed;
    const std::span<const int32_t> table = kv_->table(s->kv);
    h.blocks.assign(table.begin(), table.begin() + blocks_for(s->computed, o_.block_size));
    h.output.assign(s->tokens.begin() + s->prompt_len(), s->tokens.end());
    h.kv_format = kv_format_;
    h.prefill_group = fabric_.rank();
    h.drafts = s->spec.drafts;
    s->transfer = h.transfer;
    s->state = SeqState::kParked;
    remove_from(running_, s);
    parked_[h.transfer] = Parked{s->id, deadline};
  }
  handoffs_.clear();
}

Status DpGroup::admit_handoffs() {
  const int64_t lookahead = drafter_ ? drafter_->config().draft_tokens : 0;
  while (!awaiting_.empty()) {
    Sequence& s = *awaiting_.front();
    const KvHandoff& h = s.request->req.handoff;
    const int64_t need = blocks_for(h.rows + 1 + lookahead, o_.block_size);
    if (need > storage_->num_blocks() || h.rows + 1 > max_model_len_) {
      XDS_LOG_WARN("DP group {}: handoff of {} needs {} KV blocks, the cache holds {}",
                   fabric_.rank(), s.request->req.id, need, storage_->num_blocks());
      finish(s, "abort");
      continue;
    }
    // Backpressure (P101): no room, no pull; the prefill side keeps the blocks meanwhile.
    if (kv_->available() < need || static_cast<int32_t>(running_.size()) >= o_.max_num_seqs)
      return {};
    s.kv = kv_->add_sequence();
    kv_->expect(s.kv, s.prompt_len() + s.sampling.max_tokens);
    XDS_RETURN_IF_ERROR(kv_->reserve(s.kv, h.rows));
    const std::span<const int32_t> table = kv_->table(s.kv);
    puller_->post(s.id, h, std::vector<int32_t>(table.begin(), table.begin() + h.blocks.size()));
    remove_from(awaiting_, &s);
    s.state = SeqState::kPullingKv;
    pulling_.push_back(&s);
  }
  return {};
}

Status DpGroup::finish_pulls() {
  pulled_.clear();
  puller_->poll(pulled_);
  for (const KvPuller::Done& d : pulled_) {
    Sequence& s = *seqs_.at(d.seq);
    remove_from(pulling_, &s);
    s.state = SeqState::kAwaitingKv;  // for finish(): nothing writes its blocks any more
    if (!d.status.ok() || s.cancel_after_pull) {
      if (!d.status.ok())
        XDS_LOG_WARN("DP group {}: request {}: {}", fabric_.rank(), s.request->req.id,
                     d.status.message());
      finish(s, "abort");
      continue;
    }
    const KvHandoff& h = s.request->req.handoff;
    s.computed = h.rows;
    XDS_RETURN_IF_ERROR(kv_->commit(s.kv, std::span<const int32_t>(s.tokens).first(
                                              static_cast<size_t>(s.computed))));
    s.spec = {};
    s.spec.length = s.spec.mtp_length = s.computed;  // the prefill side wrote the MTP rows too
    if (drafter_ && static_cast<int64_t>(h.drafts.size()) <= drafter_->config().draft_tokens)
      s.spec.drafts = h.drafts;  // the first step verifies them
    s.state = SeqState::kRunning;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), &s, arrived_before), &s);
  }
  return {};
}

Result<bool> DpGroup::cooperate() {
  PoolGroupState mine;
  mine.highest = pool_highest_;
  mine.free_blocks = kv_->available();
  for (const Sequence* s : waiting_) mine.queued_tokens += s->target;
  for (const Sequence* s : preempted_) mine.queued_tokens += s->target;
  for (const Sequence* s : running_) mine.queued_tokens += std::max<int64_t>(0, s->target - s->computed);
  int i = 0;
  for (const auto& [n, r] : pool_) {
    if (i == kPoolWindow) break;
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    const auto hit = kv_->match_prefix(r.prompt, std::max<int64_t>(0, (len - 1) / o_.block_size));
    mine.hits[static_cast<size_t>(i++)] = static_cast<uint16_t>(std::min<int64_t>(hit.blocks, 0xFFFF));
  }
  XDS_ASSIGN_OR_RETURN(std::span<const xccl::MailWords> words,
                       sync_->exchange_words(kPoolStatePhase, pack_pool_state(mine)));
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
    pending.push_back({n, len, blocks_for(len + 1, o_.block_size)});
  }
  if (pending.empty()) return false;
  const std::vector<int> owner = assign_pooled(pending, groups, o_.block_size);
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
    if (owner[k] != fabric_.rank()) continue;
    const std::string id = r.id;
    r.pool_number = 0;
    add_request(std::move(r));
    if (cancelled) cancel(id, -1);
  }
  return any;
}

Status DpGroup::service_distflow() {
  if (sender_) {
    XDS_RETURN_IF_ERROR(sender_->accept_pending());
    completed_.clear();
    sender_->poll_completions(completed_);
    const size_t pulled = completed_.size();
    const int64_t now = now_ns();
    for (auto& [id, p] : parked_) {
      if (p.deadline_ns < now) completed_.push_back(id);  // expired: after the pulled ones
    }
    for (size_t i = 0; i < completed_.size(); ++i) {
      auto it = parked_.find(completed_[i]);
      if (it == parked_.end()) continue;  // pulled and expired, or cancelled meanwhile
      Sequence& s = *seqs_.at(it->second.seq);
      if (i >= pulled) {
        ++transfers_expired_;
        XDS_LOG_WARN("DP group {}: request {}: no decode group pulled its KV in {} s; freed",
                     fabric_.rank(), s.request->req.id, o_.kv_transfer_timeout_ns / 1'000'000'000);
      } else {
        ++transfers_done_;
      }
      finish(s, "", /*emit=*/false);  // the decode side streams the rest
    }
    if (!completed_.empty()) send_load(/*force=*/true);  // also from the sleep loop
  }
  if (!awaiting_.empty()) XDS_RETURN_IF_ERROR(admit_handoffs());
  if (!pulling_.empty()) XDS_RETURN_IF_ERROR(finish_pulls());
  return {};
}

Status DpGroup::fork_choices(Sequence& parent) {
  Request& r = *parent.request;
  parent.forked = true;
  for (int32_t k = 1; k < r.req.sampling.n; ++k) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_++;
    child->arrival = parent.arrival + k;
    child->request = &r;
    child->index = k;
    child->sampling = r.req.sampling;
    child->sampling.seed = choice_seed(r.req.sampling.seed, k);
    child->tokens = parent.tokens;
    child->computed = parent.computed;
    child->target = parent.target;
    child->cached_tokens = parent.cached_tokens;
    child->spec = parent.spec;
    child->spec_committed = parent.spec_committed;
    copies_.clear();
    XDS_ASSIGN_OR_RETURN(child->kv, kv_->fork(parent.kv, copies_));
    for (const BlockCopy& c : copies_) storage_->copy_block(c.src, c.dst);
    kv_->expect(child->kv, child->prompt_len() + child->sampling.max_tokens);
    child->state = SeqState::kRunning;
    running_.push_back(child.get());
    r.choices.push_back(child.get());
    seqs_[child->id] = std::move(child);
  }
  std::sort(running_.begin(), running_.end(), arrived_before);
  return {};
}

void DpGroup::send_tokens() {
  if (deltas_.empty()) return;
  Message m;
  m.kind = MessageKind::kTokens;
  m.tokens = std::move(deltas_);
  deltas_.clear();
  Status st = send_message(output_, m);
  if (!st.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), st.message());
}

void DpGroup::send_cache_events() {
  kv_->take_cache_events(cache_events_);
  if (cache_events_.added.empty() && cache_events_.removed.empty()) return;
  Message m;
  m.kind = MessageKind::kBlocks;
  m.group = fabric_.rank();
  m.blocks_added = cache_events_.added;
  m.blocks_removed = cache_events_.removed;
  (void)send_message(shell_, m, /*dontwait=*/true);
}

void DpGroup::report_eplb(std::optional<EplbReport> r) {
  if (!r) return;
  Message m;
  m.kind = MessageKind::kEplb;
  m.group = fabric_.rank();
  m.eplb_report = std::move(*r);
  Status st = send_message(shell_, m);
  if (!st.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), st.message());
}

void DpGroup::send_load(bool force) {
  const int64_t now = now_ns();
  if (!force && now - last_load_ns_ < kLoadPeriodNs) return;
  last_load_ns_ = now;
  GroupLoad l;
  l.group = fabric_.rank();
  l.running = static_cast<int32_t>(running_.size());
  l.waiting = static_cast<int32_t>(waiting_.size() + preempted_.size() + awaiting_.size());
  l.kv_parked = static_cast<int64_t>(parked_.size());
  l.kv_transfers_done = transfers_done_;
  l.kv_transfers_expired = transfers_expired_;
  l.kv_pulled_bytes = puller_->pulled_bytes();
  l.max_num_seqs = o_.max_num_seqs;
  const KvUsage u = kv_->usage();
  l.kv_blocks_total = u.total;
  l.kv_blocks_used = u.used;
  // Running sequences' growth (usage().reserved) plus the waiting ones' whole expectation.
  int64_t reserved = u.reserved;
  for (const Sequence* s : waiting_) {
    reserved += blocks_for(s->prompt_len() + s->sampling.max_tokens, o_.block_size) *
                s->sampling.n;
  }
  l.kv_blocks_reserved = reserved;
  l.block_size = o_.block_size;
  l.prefix_hits = prefix_hits_;
  l.prefix_queries = prefix_queries_;
  l.preemptions = preemptions_;
  l.steps = steps_;
  l.last_batch_size = last_batch_;
  l.spec_steps = spec_steps_;
  l.spec_tokens = spec_tokens_;
  l.spec_drafted = spec_drafted_;
  l.spec_accepted = spec_accepted_;
  if (force || now - last_expert_load_ns_ >= kExpertLoadPeriodNs) {
    last_expert_load_ns_ = now;
    const std::span<const int64_t> counts = model_->routed_token_counts();
    l.expert_tokens.assign(counts.begin(), counts.end());
    l.moe_layers = model_->info().moe_layers;
    l.n_experts = model_->info().n_routed_experts;
  }
  if (exchange_) {
    const EpMoeExchange::Times& t = exchange_->times();
    l.moe_ns = t.dispatch_ns + t.experts_ns + t.combine_ns;
  }
  if (eplb_) eplb_->fill_window(now, /*force=*/false, l);
  Message m;
  m.kind = MessageKind::kLoad;
  m.group = fabric_.rank();
  m.loads.push_back(l);
  (void)send_message(shell_, m, /*dontwait=*/true);
}

Status DpGroup::run() {
  uint64_t step = 0;
  while (true) {
    XDS_RETURN_IF_ERROR(poll_control(0));
    XDS_RETURN_IF_ERROR(service_distflow());
    release_finished();
    if (!draining_ || has_work()) {
      if (has_work()) XDS_RETURN_IF_ERROR(plan_step());
    }
    const bool local_work = has_work() && !plan_.chunks.empty();
    StepHeader mine;
    mine.epoch = fabric_.epoch();
    mine.step = step;
    mine.moe_passes = static_cast<uint16_t>(1 + (drafter_ ? drafter_->config().draft_tokens : 0));
    mine.requests = static_cast<uint32_t>(requests_.size());
    mine.stop = draining_ && !has_work() && parked_.empty();
    mine.wake_seq = wake_seen_;
    StepDecision decision;
    if (sync_) {
      int64_t tokens = 0;
      for (const StepChunk& c : plan_.chunks) tokens += c.count;
      mine.tokens = static_cast<uint32_t>(has_work() ? tokens : 0);
      mine.busy = (has_work() && tokens == 0) || eplb_->busy();
      mine.map_version = eplb_->loaded_version();
      XDS_ASSIGN_OR_RETURN(decision, sync_->exchange(mine));
      if (decision.action != StepAction::kAbort && o_.cooperative_prefill) {
        XDS_ASSIGN_OR_RETURN(const bool assigned, cooperate());
        // New work here or elsewhere: plan it at once instead of sleeping or stopping.
        if (assigned && decision.action != StepAction::kRun) decision.action = StepAction::kSkip;
      }
      if (decision.action != StepAction::kAbort) {  // EPLB: maps switch at this boundary
        XDS_ASSIGN_OR_RETURN(auto switched,
                             eplb_->at_step_boundary(decision.map_version, decision.step,
                                                     fabric_.rank()));
        report_eplb(std::move(switched));
      }
    } else {
      decision.action = local_work ? StepAction::kRun
                        : mine.stop ? StepAction::kStop
                        : has_work() ? StepAction::kSkip
                                     : StepAction::kSleep;
      decision.step = step;
      decision.next_step = local_work ? step + 1 : step;
      decision.wake_seq = wake_seen_;
    }
    switch (decision.action) {
      case StepAction::kAbort:
        return aborted("DP group {}: the instance's step {} was aborted", fabric_.rank(), step);
      case StepAction::kStop: {
        send_tokens();
        Message bye;
        bye.kind = MessageKind::kShutdown;
        (void)send_message(output_, bye);
        return {};
      }
      case StepAction::kSleep: {
        // Sleep until the shell wakes every group with a sequence number nobody had seen.
        wake_slept_ = std::max(wake_slept_, decision.wake_seq);
        send_load(/*force=*/true);
        bool asked = false;
        while (wake_seen_ <= wake_slept_ && !draining_) {
          XDS_RETURN_IF_ERROR(poll_control(-1));
          XDS_RETURN_IF_ERROR(service_distflow());
          release_finished();
          send_tokens();  // cancellations of waiting requests
          if (!sync_ && has_work()) break;
          if (sync_ && has_work() && !asked) {
            // A request that arrived after the header exchange, whose wake another group had
            // already seen there (the sockets of different groups are not ordered): ask the
            // shell for a newer wake, which reaches every group.
            Message w;
            w.kind = MessageKind::kWake;
            w.group = fabric_.rank();
            (void)send_message(shell_, w);
            asked = true;
          }
        }
        continue;
      }
      case StepAction::kSkip:  // work that needs no forward yet: look again shortly
        XDS_RETURN_IF_ERROR(poll_control(1));
        continue;
      case StepAction::kRun:
        break;
    }
    if (has_work()) {
      XDS_RETURN_IF_ERROR(apply_plan());
    } else {
      chunks_.clear();
      chunk_seqs_.clear();
      plan_.chunks.clear();
    }
    XDS_RETURN_IF_ERROR(run_forward(decision.step));
    XDS_RETURN_IF_ERROR(commit_step());
    if (!handoffs_.empty()) park_handoffs();
    step = decision.next_step;
    ++steps_;
    last_batch_ = static_cast<double>(plan_.chunks.size());
    send_tokens();
    send_load(/*force=*/false);
    send_cache_events();
  }
}

void pin_threads(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

Result<uint64_t> ep_staging_bytes(const std::string& model_dir, const ModelOptions& model,
                                  int32_t max_num_batched_tokens, int dp,
                                  int32_t redundant_slots) {
  if (dp <= 1) return uint64_t{1} << 20;
  XDS_ASSIGN_OR_RETURN(const ModelInfo info, load_model_info(model_dir));
  if (info.moe_layers.empty()) {
    return invalid_argument(
        "--dp {}: DP groups spread the experts of the MoE layers over the devices (expert "
        "parallelism), and the model in {} ({}) has no MoE layers: serve it with --dp 1",
        dp, model_dir, info.model_type);
  }
  return EpMoeExchange::staging_bytes(info, dp, model.compute,
                                      ep_options(max_num_batched_tokens, redundant_slots));
}

int run_dp_group(xccl::Fabric& fabric, const DpGroupOptions& options) {
  // "xds-dp<rank>" in ps and /proc/PID/comm (the threads made later inherit it).
  const std::string name = fmt::format("xds-dp{}", fabric.rank());
  ::prctl(PR_SET_NAME, name.c_str());
  pin_threads(options.cpu);
  DpGroup group(fabric, options);
  Status st = group.init();
  if (st.ok()) st = group.run();
  if (!st.ok()) {
    XDS_LOG_ERROR("DP group {}: {}", fabric.rank(), st.to_string());
    return 1;
  }
  return 0;
}

}  // namespace xds::engine
