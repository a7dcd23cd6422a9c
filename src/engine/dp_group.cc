#include "engine/dp_group.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>

#include <zmq.hpp>

#include "base/clock.h"
#include "base/env.h"
#include "base/log.h"
#include "base/process_name.h"
#include "engine/engine_core.h"
#include "engine/ep_moe_exchange.h"
#include "engine/eplb_agent.h"
#include "engine/group_collectives.h"
#include "engine/handoff_stage.h"
#include "engine/speculative_stage.h"
#include "engine/step_sync.h"
#include "model/causal_lm.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "protocol/channel_security.h"
#include "protocol/messages.h"
#include "protocol/zmq_io.h"
#include "xccl/fabric.h"

namespace xds::engine {
namespace {

using protocol::recv_message;
using protocol::send_message;

constexpr int64_t kLoadPeriodNs = 20'000'000;           // a kLoad to the shell at most every 20 ms
constexpr int64_t kExpertLoadPeriodNs = 1'000'000'000;  // expert counts in it about every 1 s
// Scale-down: how long a group whose fabric failed waits for the shell's next phase before it
// gives up (and exits: the shell then starts the instance again).
constexpr int64_t kReformWaitNs = 60'000'000'000;
// The step header's abort code of a group that holds a kLeave: every group leaves the fabric
// at this step boundary, together (a rejoin: nothing failed).
constexpr uint32_t kAbortToReform = 0x52464d;  // "RFM"

// The exchange's round size: a step's tokens (decodes + prefill chunks) in at most a few rounds.
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

// The loop around the engine core: control messages, DistFlow service, the step header
// exchange with the other groups, sleeping, and the reports to the shell.
class DpGroup {
 public:
  DpGroup(xccl::Fabric& fabric, const DpGroupOptions& o) : fabric_(fabric), o_(o) {}
  Status init();
  Status run();
  // Answers the pings queued on the control socket and keeps every other message for the
  // next poll_control(): callable from inside a step (between layers, and from inside an
  // XCCL wait, naming the rank it waits for), so that a long step does not look like a dead
  // group and a wait on a dead peer blames that peer.
  void answer_heartbeats(int32_t waiting_on = -1);

 private:
  // Control messages: drain what is queued (block up to `wait_ms` for the first; -1 forever).
  Status poll_control(int wait_ms);
  void on_message(Message m);
  void add_request(EngineRequest r);
  // Stops choice `index` of request `id` (-1: every choice); a request whose choices all
  // ended is released by release_finished().
  void cancel(const std::string& id, int32_t index);
  bool has_work() const { return core_->has_work() || !handoff_->pool_empty(); }
  // DistFlow, every loop (HandoffStage::service); a load report when a transfer ended.
  Status service_distflow();
  // Releases the requests whose choices all ended; the shell forgets which group holds them.
  void release_finished();
  // The step's header, exchanged with the other groups (or decided alone).
  Result<StepDecision> decide(uint64_t step);
  // Sleeps until the shell wakes every group with a sequence number nobody had seen.
  Status sleep(const StepDecision& decision);
  void send_tokens();
  void send_load(bool force);
  // The prefix cache's block-hash events since the last call, to the shell (kBlocks).
  void send_cache_events();
  void report_eplb(std::optional<EplbReport> r);
  // Injected faults (POST /admin/faults): each strikes once this group has run its
  // after_steps more steps.
  void strike_due_faults();
  // Scale-down (P119; protocol::ReformMsg): after a step failed with the fabric (a peer died
  // or hung), waits for the shell to reform the instance without it (true) instead of
  // exiting; false (the error stands) without --scale-down or when no reform came.
  bool await_reform(const Status& failed);
  // The three phases, from a kLeave, outside any collective; blocks until the kJoin is done.
  Status reform(const protocol::ReformMsg& leave);
  // The next ReformMsg of `phase` (pings answered, anything else kept for poll_control).
  Result<protocol::ReformMsg> next_reform_phase(protocol::ReformPhase phase);
  void reformed_reply(const protocol::ReformMsg& m, const Status& st);

  xccl::Fabric& fabric_;
  DpGroupOptions o_;
  std::unique_ptr<HandoffStage> handoff_;
  std::unique_ptr<EngineCore> core_;
  std::unique_ptr<GroupCollectives> coll_;  // with expert parallelism (dp > 1)
  std::unique_ptr<EpMoeExchange> exchange_;
  std::unique_ptr<EplbAgent> eplb_;  // with expert parallelism
  std::unique_ptr<AeMoeExchange> ae_;  // an attention group of an A/E instance

  zmq::context_t ctx_{1};
  zmq::socket_t control_{ctx_, zmq::socket_type::pull};
  zmq::socket_t shell_{ctx_, zmq::socket_type::push};
  zmq::socket_t output_{ctx_, zmq::socket_type::push};
  std::deque<Message> held_;  // received by answer_heartbeats(), handled by poll_control()
  int32_t waiting_on_ = -1;   // the rank an XCCL wait waits for while it answers pings
  struct PendingFault {
    protocol::FaultSpec fault;
    int64_t at_step = 0;  // strikes once steps_ reaches it
  };
  std::vector<PendingFault> faults_;
  // A kLeave received: run by poll_control() once this group left the fabric (await_reform);
  // until then the step header asks every group to leave (kAbortToReform).
  std::optional<protocol::ReformMsg> reform_;
  bool awaiting_reform_ = false;
  bool reformed_ = false;  // a reform formed a new fabric: run() steps from 0 again

  uint64_t wake_seen_ = 0;   // highest kWake seq received
  uint64_t wake_slept_ = 0;  // the highest any device had seen when all went to sleep
  bool draining_ = false;
  int64_t last_load_ns_ = 0;
  int64_t last_expert_load_ns_ = 0;
  int64_t steps_ = 0;
  StepAttempts attempts_;  // of the step in flight; rollbacks so far
  double last_batch_ = 0;
  PrefixCache::Events cache_events_;
};

Status DpGroup::init() {
  HandoffOptions ho = o_.handoff;
  ho.rank = fabric_.rank();
  if (ho.export_kv) ho.link_name = distflow_link_name(getppid(), ho.rank);
  handoff_ = std::make_unique<HandoffStage>(ho);
  EngineCoreOptions eo = o_.core;
  eo.park_prefill_only = ho.export_kv;
  eo.kv_storage = handoff_->storage_factory();
  XDS_ASSIGN_OR_RETURN(core_, EngineCore::create(eo));
  XDS_RETURN_IF_ERROR(handoff_->attach(*core_));
  core_->set_heartbeat([this] { answer_heartbeats(); });
  // The prefix cache's block-hash events go to the shell after each step (send_cache_events),
  // and from there to the gateways, which route by them (P096).
  core_->kv().record_cache_events(o_.core.prefix_cache);

  if (o_.ae_mode) {
    // Step headers between the attention groups only; MoE layers over A2E/E2A.
    XDS_ASSIGN_OR_RETURN(coll_, GroupCollectives::create(
                                    fabric_, /*step_timeout_ms=*/600'000,
                                    [this](int group) { answer_heartbeats(group); },
                                    o_.ae.shape.attention));
    XDS_ASSIGN_OR_RETURN(ae_, AeMoeExchange::create(core_->model(), coll_->mailbox(), o_.ae));
    core_->model().set_moe_exchange(ae_.get());
  } else if (fabric_.world_size() > 1) {
    // Waits inside collectives answer heartbeats too, naming the group they wait on.
    XDS_ASSIGN_OR_RETURN(coll_, GroupCollectives::create(
                                    fabric_, /*step_timeout_ms=*/600'000,
                                    [this](int group) { answer_heartbeats(group); }));
    EpMoeSetup setup;
    setup.model = &core_->model();
    setup.mailbox = &coll_->mailbox();
    setup.options = ep_options(o_.core.max_num_batched_tokens, o_.redundant_slots);
    XDS_ASSIGN_OR_RETURN(exchange_, EpMoeExchange::create(setup));
    core_->model().set_moe_exchange(exchange_.get());
    core_->set_step_agreement([this] { return exchange_->agree_step(); });
    XDS_ASSIGN_OR_RETURN(eplb_, make_eplb_agent(core_->model(), *exchange_, o_));
  }

  try {
    control_.set(zmq::sockopt::linger, 0);
    protocol::secure_connecting(control_);
    control_.connect(o_.control_address);
    shell_.set(zmq::sockopt::linger, 1000);
    // A shell that stopped reading (it drains and waits for this group to exit) must not
    // block this group's sends forever: after this long a send fails and is logged.
    shell_.set(zmq::sockopt::sndtimeo, 2000);
    protocol::secure_connecting(shell_);
    shell_.connect(o_.shell_address);
    output_.set(zmq::sockopt::linger, 5000);
    protocol::secure_connecting(output_);
    output_.connect(o_.output_address);
  } catch (const zmq::error_t& e) {
    return unavailable("DP group {}: cannot connect its sockets: {}", fabric_.rank(), e.what());
  }
  if (eplb_)
    XDS_LOG_INFO(
        "DP group {}: {} redundant expert slots per MoE layer, {:.1f} MiB reserved "
        "(slots and their staging)",
        fabric_.rank(), o_.redundant_slots, double(eplb_->reserved_bytes()) / (1 << 20));
  const int64_t blocks = core_->kv().allocator().num_blocks();
  XDS_LOG_INFO("DP group {}: {} KV blocks of {} tokens ({:.1f} MiB), max model len {}",
               fabric_.rank(), blocks, o_.core.block_size,
               static_cast<double>(blocks * core_->kv_block_bytes()) / (1 << 20),
               core_->max_model_len());
  send_load(/*force=*/true);
  return {};
}

Status DpGroup::poll_control(int wait_ms) {
  // Messages answer_heartbeats() kept (a Shutdown, a Wake, ...): handled now, and then the
  // poll below must not block -- the caller looks at what they changed first.
  if (!held_.empty()) wait_ms = 0;
  while (!held_.empty()) {
    Message m = std::move(held_.front());
    held_.pop_front();
    on_message(std::move(m));
  }
  // Parked transfers complete through memory, not the socket: look again every millisecond.
  if (handoff_->has_parked() && (wait_ms < 0 || wait_ms > 1)) wait_ms = 1;
  zmq::pollitem_t items[3] = {{control_.handle(), 0, ZMQ_POLLIN, 0},
                              {nullptr, handoff_->listen_fd(), ZMQ_POLLIN, 0},
                              {nullptr, handoff_->ucx_listen_fd(), ZMQ_POLLIN, 0}};
  const size_t n_items = !handoff_->exporting() ? 1 : handoff_->ucx_listen_fd() >= 0 ? 3 : 2;
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
  if (reform_ && awaiting_reform_) {
    const protocol::ReformMsg leave = *reform_;
    reform_.reset();
    return reform(leave);
  }
  return {};
}

void DpGroup::answer_heartbeats(int32_t waiting_on) {
  waiting_on_ = waiting_on;
  handoff_->answer_probes();  // a long step is not a dead KV link either
  while (true) {
    auto m = recv_message(control_, /*dontwait=*/true);
    if (!m.ok()) {
      XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), m.status().message());
      continue;
    }
    if (!m->has_value()) break;
    if (std::holds_alternative<protocol::PingMsg>(**m)) {
      on_message(std::move(**m));
    } else {
      held_.push_back(std::move(**m));
    }
  }
  waiting_on_ = -1;
}

void DpGroup::on_message(Message m) {
  if (auto* r = std::get_if<protocol::RequestMsg>(&m)) {
    add_request(std::move(r->request));
  } else if (const auto* c = std::get_if<protocol::CancelMsg>(&m)) {
    cancel(c->request_id, c->index);
  } else if (const auto* w = std::get_if<protocol::WakeMsg>(&m)) {
    wake_seen_ = std::max(wake_seen_, w->seq);
  } else if (const auto* ping = std::get_if<protocol::PingMsg>(&m)) {
    protocol::PongMsg pong;
    pong.seq = ping->seq;
    pong.group = fabric_.rank();
    pong.waiting_on = waiting_on_;
    (void)send_message(shell_, pong, /*dontwait=*/true);
  } else if (const auto* f = std::get_if<protocol::FaultMsg>(&m)) {
    XDS_LOG_WARN("DP group {}: fault {} injected, strikes after {} step(s)", fabric_.rank(),
                 f->fault.id, f->fault.after_steps);
    faults_.push_back(PendingFault{f->fault, steps_ + f->fault.after_steps});
  } else if (const auto* rf = std::get_if<protocol::ReformMsg>(&m)) {
    if (rf->phase == protocol::ReformPhase::kLeave) {
      reform_ = *rf;
    } else {
      reformed_reply(*rf, failed_precondition("DP group {}: reform phase {} before its kLeave",
                                              fabric_.rank(), static_cast<int>(rf->phase)));
    }
  } else if (std::holds_alternative<protocol::ShutdownMsg>(m)) {
    draining_ = true;
  } else if (const auto* e = std::get_if<protocol::EplbCommandMsg>(&m)) {
    if (eplb_) report_eplb(eplb_->on_command(e->command, fabric_.rank()));
  } else {
    XDS_LOG_WARN("DP group {}: unexpected {} message", fabric_.rank(),
                 protocol::kind_name(protocol::kind_of(m)));
  }
}

bool DpGroup::await_reform(const Status& failed) {
  // Only a failed fabric (a poisoned epoch: a peer died or hung) is waited out.
  if (!o_.scale_down || !coll_ || failed.code() != StatusCode::kAborted) return false;
  XDS_LOG_WARN("DP group {}: {}; waiting for the shell to reform the instance", fabric_.rank(),
               failed.message());
  const uint64_t generation = coll_->generation();
  const int64_t deadline = now_ns() + kReformWaitNs;
  awaiting_reform_ = true;
  Status st;
  while (st.ok() && coll_->generation() == generation && now_ns() < deadline && !draining_) {
    st = poll_control(100);  // runs the reform when its kLeave arrives
  }
  awaiting_reform_ = false;
  if (!st.ok()) XDS_LOG_ERROR("DP group {}: {}", fabric_.rank(), st.message());
  return coll_->generation() != generation;
}

void DpGroup::reformed_reply(const protocol::ReformMsg& m, const Status& st) {
  protocol::ReformedMsg r;
  r.group = fabric_.rank();
  r.phase = m.phase;
  r.generation = m.generation;
  if (!st.ok()) r.error = st.message();
  (void)send_message(shell_, r);
}

Result<protocol::ReformMsg> DpGroup::next_reform_phase(protocol::ReformPhase phase) {
  const int64_t deadline = now_ns() + kReformWaitNs;
  while (now_ns() < deadline) {
    zmq::pollitem_t item{control_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return internal_error("DP group: poll failed: {}", e.what());
    }
    while (true) {
      auto m = recv_message(control_, /*dontwait=*/true);
      if (!m.ok()) continue;
      if (!m->has_value()) break;
      if (const auto* rf = std::get_if<protocol::ReformMsg>(&**m)) {
        if (rf->phase == phase) return *rf;
        return failed_precondition("scale-down: phase {} arrived while waiting for phase {}",
                                   static_cast<int>(rf->phase), static_cast<int>(phase));
      }
      if (std::holds_alternative<protocol::PingMsg>(**m)) {
        on_message(std::move(**m));
      } else {
        held_.push_back(std::move(**m));
      }
    }
  }
  return deadline_exceeded("scale-down: no phase {} from the shell within {} s",
                           static_cast<int>(phase), kReformWaitNs / 1'000'000'000);
}

Status DpGroup::reform(const protocol::ReformMsg& leave) {
  if (!coll_ || !exchange_) {
    const Status st = failed_precondition("DP group {}: scale-down without expert parallelism",
                                          fabric_.rank());
    reformed_reply(leave, st);
    return st;
  }
  // Phase 1: this loop is outside every collective here (a step in flight failed and was
  // rolled back, or none ran).
  reformed_reply(leave, {});
  XDS_ASSIGN_OR_RETURN(const protocol::ReformMsg reset,
                       next_reform_phase(protocol::ReformPhase::kReset));
  coll_->reset_own_lines();
  reformed_reply(reset, {});
  XDS_ASSIGN_OR_RETURN(const protocol::ReformMsg join,
                       next_reform_phase(protocol::ReformPhase::kJoin));
  const std::vector<int> before = coll_->members();
  const std::vector<int> after(join.members.begin(), join.members.end());
  Status st;
  // A member started again is another process: watch that one from now on.
  for (size_t i = 0; st.ok() && i < after.size() && i < join.pids.size(); ++i) {
    if (after[i] != fabric_.rank() && join.pids[i] > 0) {
      st = fabric_.watch_peer(after[i], join.pids[i]);
    }
  }
  if (st.ok()) st = coll_->reform(after, join.generation);
  if (st.ok()) st = exchange_->reform(coll_->mailbox(), before, after, join.map_version);
  if (st.ok() && eplb_) eplb_->reformed();
  reformed_reply(join, st);
  if (!st.ok()) return st.with_context(fmt::format("DP group {}: reform", fabric_.rank()));
  reformed_ = true;
  XDS_LOG_WARN("DP group {}: the instance goes on with {} DP group(s), epoch {} (rank {} of them)",
               fabric_.rank(), after.size(), coll_->fabric().epoch(), coll_->fabric().rank());
  return {};
}

void DpGroup::strike_due_faults() {
  for (auto it = faults_.begin(); it != faults_.end();) {
    if (steps_ < it->at_step) {
      ++it;
      continue;
    }
    const protocol::FaultSpec f = it->fault;
    it = faults_.erase(it);
    switch (f.kind) {
      case protocol::FaultKind::kKill:
        XDS_LOG_WARN("DP group {}: fault {}: killing this device process", fabric_.rank(), f.id);
        ::kill(::getpid(), SIGKILL);
        break;
      case protocol::FaultKind::kHang:
        XDS_LOG_WARN("DP group {}: fault {}: this group's loop stops answering", fabric_.rank(),
                     f.id);
        while (true) ::pause();
      case protocol::FaultKind::kRetireKvBlocks: {
        const int64_t n = core_->table().retire_kv_blocks(f.blocks);
        XDS_LOG_WARN("DP group {}: fault {}: {} KV block(s) retired, {} sequence(s) recomputed so "
                     "far",
                     fabric_.rank(), f.id, n, core_->table().stats().retired_recomputes);
        send_load(/*force=*/true);
        break;
      }
      case protocol::FaultKind::kLinkDelay:
      case protocol::FaultKind::kLinkDrop: {
        LinkFault lf;
        lf.kind = f.kind == protocol::FaultKind::kLinkDelay ? LinkFault::kDelay : LinkFault::kDrop;
        lf.duration_ms = f.duration_ms;
        Status st = handoff_->inject_link_fault(lf);
        XDS_LOG_WARN("DP group {}: fault {}: its KV links {} for {} ms{}", fabric_.rank(), f.id,
                     lf.kind == LinkFault::kDelay ? "are slow" : "stop answering", f.duration_ms,
                     st.ok() ? "" : " -- refused: " + st.message());
        break;
      }
      case protocol::FaultKind::kKvCorrupt:
        XDS_LOG_WARN("DP group {}: fault {}: the next KV pull lands with {} block(s) corrupted",
                     fabric_.rank(), f.id, f.blocks);
        handoff_->corrupt_next_pull(f.blocks);
        break;
      case protocol::FaultKind::kExchangeError:
        if (!exchange_) {
          XDS_LOG_WARN("DP group {}: fault {}: refused, this group has no MoE exchange (--dp 1)",
                       fabric_.rank(), f.id);
          break;
        }
        XDS_LOG_WARN("DP group {}: fault {}: the next step's MoE exchange fails once",
                     fabric_.rank(), f.id);
        exchange_->fail_next_exchange();
        break;
      default:
        XDS_LOG_WARN("DP group {}: fault {}: kind {} is not handled by a DP group", fabric_.rank(),
                     f.id, static_cast<int>(f.kind));
    }
  }
}

void DpGroup::add_request(EngineRequest r) {
  if (handoff_->pool(r)) return;
  if (auto held = core_->table().requests().find(r.id); held != core_->table().requests().end()) {
    if (held->second->req.attempt >= r.attempt) {
      XDS_LOG_WARN("DP group {}: duplicate request id {}", fabric_.rank(), r.id);
      return;
    }
    // Sent again by the gateway (it gave this attempt up while the group was slow to answer):
    // the old attempt ends here, its last deltas reach the output process before the new
    // attempt's options do.
    core_->cancel(r.id, -1);
    release_finished();
    send_tokens();
    if (core_->table().requests().count(r.id)) {
      XDS_LOG_WARN("DP group {}: request {} is still pulling its KV; attempt {} dropped",
                   fabric_.rank(), r.id, r.attempt);
      return;
    }
  }
  // The output process learns the request's output options (stop strings, parsers, where to
  // stream) before its first token.
  protocol::RequestMsg fwd{r};
  fwd.request.prompt.clear();
  Status st = send_message(output_, fwd);
  if (!st.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), st.message());
  Status added = core_->add_request(std::move(r));
  if (!added.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), added.message());
}

void DpGroup::cancel(const std::string& id, int32_t index) {
  if (handoff_->cancel_pooled(id)) return;
  core_->cancel(id, index);
}

void DpGroup::release_finished() {
  protocol::EndedMsg ended;
  ended.group = fabric_.rank();
  core_->table().release_finished(&ended.request_ids);
  if (!ended.request_ids.empty()) (void)send_message(shell_, ended);
}

Status DpGroup::service_distflow() {
  bool ended = false;
  XDS_RETURN_IF_ERROR(handoff_->service(&ended));
  if (ended) send_load(/*force=*/true);  // also from the sleep loop
  return {};
}

void DpGroup::send_tokens() {
  if (core_->deltas().empty()) return;
  protocol::TokensMsg m{std::move(core_->deltas())};
  core_->deltas().clear();
  Status st = send_message(output_, std::move(m));
  if (!st.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), st.message());
}

void DpGroup::send_cache_events() {
  core_->kv().take_cache_events(cache_events_);
  if (cache_events_.added.empty() && cache_events_.removed.empty()) return;
  const protocol::BlocksMsg m{fabric_.rank(), cache_events_.added, cache_events_.removed};
  (void)send_message(shell_, m, /*dontwait=*/true);
}

void DpGroup::report_eplb(std::optional<EplbReport> r) {
  if (!r) return;
  const protocol::EplbReportMsg m{std::move(*r)};
  Status st = send_message(shell_, m);
  if (!st.ok()) XDS_LOG_WARN("DP group {}: {}", fabric_.rank(), st.message());
}

void DpGroup::send_load(bool force) {
  const int64_t now = now_ns();
  if (!force && now - last_load_ns_ < kLoadPeriodNs) return;
  last_load_ns_ = now;
  GroupLoad l;
  l.group = fabric_.rank();
  const RequestTable& table = core_->table();
  const HandoffStats hs = handoff_->stats();
  l.running = static_cast<int32_t>(table.running().size());
  l.waiting = static_cast<int32_t>(table.waiting().size() + table.preempted().size() +
                                   table.awaiting().size());
  l.kv_parked = hs.parked;
  l.kv_transfers_done = hs.transfers_done;
  l.kv_transfers_expired = hs.transfers_expired;
  l.kv_pulled_bytes = hs.pulled_bytes;
  l.kv_probes_saturated = hs.probes_saturated;
  l.kv_links_failed = hs.links_failed;
  l.kv_handoffs_recomputed = hs.handoffs_recomputed;
  l.kv_checksum_mismatches = hs.checksum_mismatches;
  l.max_num_seqs = o_.core.max_num_seqs;
  const KvUsage u = core_->kv().usage();
  l.kv_blocks_total = u.total;
  l.kv_blocks_used = u.used;
  // Running sequences' growth (usage().reserved) plus the waiting ones' whole expectation.
  int64_t reserved = u.reserved;
  for (const Sequence* s : table.waiting()) {
    reserved +=
        blocks_for(s->prompt_len() + s->sampling.max_tokens, o_.core.block_size) * s->sampling.n;
  }
  l.kv_blocks_reserved = reserved;
  l.block_size = o_.core.block_size;
  l.prefix_hits = table.stats().prefix_hits;
  l.prefix_queries = table.stats().prefix_queries;
  l.preemptions = table.stats().preemptions;
  l.kv_blocks_retired = table.stats().kv_blocks_retired;
  l.steps = steps_;
  l.rollbacks = attempts_.rollbacks();
  l.last_batch_size = last_batch_;
  if (const SpeculativeStage* spec = core_->speculative()) {
    l.spec_steps = spec->stats().steps;
    l.spec_tokens = spec->stats().tokens;
    l.spec_drafted = spec->stats().drafted;
    l.spec_accepted = spec->stats().accepted;
  }
  if (force || now - last_expert_load_ns_ >= kExpertLoadPeriodNs) {
    last_expert_load_ns_ = now;
    const std::span<const int64_t> counts = core_->model().routed_token_counts();
    l.expert_tokens.assign(counts.begin(), counts.end());
    l.moe_layers = core_->info().moe_layers;
    l.n_experts = core_->info().n_routed_experts;
  }
  if (exchange_) {
    const EpMoeExchange::Times& t = exchange_->times();
    l.moe_ns = t.dispatch_ns + t.experts_ns + t.combine_ns;
  }
  if (ae_) l.moe_ns = ae_->times().a2e_ns + ae_->times().e2a_ns;
  if (eplb_) eplb_->fill_window(now, /*force=*/false, l);
  protocol::LoadMsg m;
  m.loads.push_back(l);
  (void)send_message(shell_, m, /*dontwait=*/true);
}

Result<StepDecision> DpGroup::decide(uint64_t step) {
  const StepPlan& plan = core_->planned();
  const bool local_work = has_work() && !plan.chunks.empty();
  const SpeculativeStage* spec = core_->speculative();
  StepHeader mine;
  mine.epoch = coll_ ? coll_->fabric().epoch() : fabric_.epoch();
  mine.step = step;
  mine.moe_passes = static_cast<uint16_t>(1 + (spec ? spec->draft_tokens() : 0));
  mine.requests = static_cast<uint32_t>(core_->table().requests().size());
  mine.stop = draining_ && !has_work() && !handoff_->has_parked();
  mine.wake_seq = wake_seen_;
  mine.attempt = attempts_.attempt();
  if (reform_) {  // the shell reforms the fabric: every group leaves it after this exchange
    mine.abort = true;
    mine.abort_code = kAbortToReform;
  }
  StepDecision decision;
  if (!coll_) {
    decision.action = local_work   ? StepAction::kRun
                      : mine.stop  ? StepAction::kStop
                      : has_work() ? StepAction::kSkip
                                   : StepAction::kSleep;
    decision.step = step;
    decision.next_step = local_work ? step + 1 : step;
    decision.wake_seq = wake_seen_;
    return decision;
  }
  int64_t tokens = 0;
  for (const StepChunk& c : plan.chunks) tokens += c.count;
  mine.tokens = static_cast<uint32_t>(has_work() ? tokens : 0);
  mine.busy = (has_work() && tokens == 0) || (eplb_ && eplb_->busy());
  mine.map_version = eplb_ ? eplb_->loaded_version() : 0;
  XDS_ASSIGN_OR_RETURN(decision, coll_->sync().exchange(mine));
  if (decision.action != StepAction::kAbort && o_.handoff.cooperative_prefill) {
    XDS_ASSIGN_OR_RETURN(const bool assigned,
                         handoff_->cooperate(
                             coll_->sync(), [this](EngineRequest r) { add_request(std::move(r)); },
                             [this](const std::string& id) { cancel(id, -1); }));
    // New work here or elsewhere: plan it at once instead of sleeping or stopping.
    if (assigned && decision.action != StepAction::kRun) decision.action = StepAction::kSkip;
  }
  if (ae_ && fabric_.rank() == 0) XDS_RETURN_IF_ERROR(ae_->notify_experts(decision));
  if (eplb_ && decision.action != StepAction::kAbort) {  // EPLB: maps switch at this boundary
    XDS_ASSIGN_OR_RETURN(auto switched, eplb_->at_step_boundary(decision.map_version, decision.step,
                                                                fabric_.rank()));
    report_eplb(std::move(switched));
  }
  return decision;
}

Status DpGroup::sleep(const StepDecision& decision) {
  wake_slept_ = std::max(wake_slept_, decision.wake_seq);
  send_load(/*force=*/true);
  bool asked = false;
  while (wake_seen_ <= wake_slept_ && !draining_ && !reformed_ && !reform_) {
    XDS_RETURN_IF_ERROR(poll_control(-1));
    XDS_RETURN_IF_ERROR(service_distflow());
    release_finished();
    send_tokens();  // cancellations of waiting requests
    if (!coll_ && has_work()) break;
    if (coll_ && has_work() && !asked) {
      // A request that arrived after the header exchange, whose wake another group had
      // already seen there (the sockets of different groups are not ordered): ask the
      // shell for a newer wake, which reaches every group.
      protocol::WakeMsg w;
      w.group = fabric_.rank();
      (void)send_message(shell_, w);
      asked = true;
    }
  }
  return {};
}

Status DpGroup::run() {
  uint64_t step = 0;
  if (o_.rejoining &&  // started again after it was lost: it joins the others' fabric first
      !await_reform(aborted("DP group {} starts again and joins the instance", fabric_.rank()))) {
    if (draining_) return {};  // the instance stops before it was taken back
    return aborted("DP group {}: the instance did not take it back", fabric_.rank());
  }
  while (true) {
    XDS_RETURN_IF_ERROR(poll_control(0));
    if (reformed_) {  // a new fabric: its step counter and attempts start afresh
      reformed_ = false;
      step = 0;
      attempts_.restart_attempts();
    }
    if (!faults_.empty()) strike_due_faults();
    XDS_RETURN_IF_ERROR(service_distflow());
    release_finished();
    if (has_work()) {
      XDS_RETURN_IF_ERROR(core_->plan());
      // Handoffs the plan admits are pulled whatever the step does (their blocks are
      // counted out of the plan already).
      XDS_RETURN_IF_ERROR(handoff_->start_pulls(core_->planned()));
    }
    Result<StepDecision> decided = decide(step);
    if (!decided.ok()) {
      if (await_reform(decided.status())) continue;
      return decided.status();
    }
    const StepDecision decision = *decided;
    switch (decision.action) {
      case StepAction::kAbort: {
        const Status abort =
            aborted("DP group {}: the instance's step {} was aborted (code {:#x})",
                    fabric_.rank(), step, decision.abort_code);
        if (decision.abort_code == kAbortToReform && await_reform(abort)) continue;
        return abort;
      }
      case StepAction::kStop: {
        send_tokens();
        (void)send_message(output_, protocol::ShutdownMsg{});
        return {};
      }
      case StepAction::kSleep:
        XDS_RETURN_IF_ERROR(sleep(decision));
        continue;
      case StepAction::kSkip:  // work that needs no forward yet: look again shortly
        XDS_RETURN_IF_ERROR(poll_control(1));
        continue;
      case StepAction::kRun:
        break;
    }
    if (exchange_) {
      exchange_->set_step(coll_->fabric().epoch(), static_cast<uint32_t>(decision.step),
                          attempts_.attempt());
    }
    if (ae_) {
      ae_->set_step(coll_->fabric().epoch(), static_cast<uint32_t>(decision.step),
                    decision.max_tokens);
    }
    const Status executed = core_->execute(/*lockstep=*/exchange_ != nullptr || ae_ != nullptr);
    if (!attempts_.after_execute(executed)) {
      if (await_reform(executed)) continue;  // the step was rolled back
      return executed;
    }
    if (!executed.ok()) {  // every group rolled the step back: plan and run it again
      XDS_LOG_WARN("DP group {}: step {} rolled back ({}); attempt {} follows", fabric_.rank(),
                   decision.step, executed.message(), attempts_.attempt());
      continue;
    }
    handoff_->park();
    step = decision.next_step;
    ++steps_;
    last_batch_ = static_cast<double>(core_->planned().chunks.size());
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
                                  int32_t max_num_batched_tokens, int dp, int32_t redundant_slots) {
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
  // "xds-dp<rank>" (or "xds-<instance>-dp<rank>") in ps and /proc/PID/comm; the threads made
  // later inherit it.
  set_process_name(process_name("dp", options.instance, fabric.rank()));
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
