#include "serve/shell.h"

#include <sys/prctl.h>

#include <chrono>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zmq.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "base/process_name.h"
#include "protocol/channel_security.h"
#include "protocol/messages.h"
#include "protocol/zmq_io.h"
#include "serve/group_membership.h"
#include "serve/placement.h"

namespace xds::serve {
namespace {

using namespace protocol;  // the message structs, one per kind

constexpr int64_t kPingTimeoutNs = int64_t{30} * 1'000'000'000;
constexpr int64_t kEplbPushPeriodNs = 1'000'000'000;
constexpr int kGroupSendTimeoutMs = 2000;
constexpr int kFailedLingerMs = 1000;  // time for the FailedMsg to reach the gateways
constexpr const char* kHeartbeatId = "heartbeat";  // the gateway's heartbeat probe
// A scale-down's three phases take milliseconds; a group still in a long step answers its
// kLeave after that step.
constexpr int64_t kReformTimeoutNs = int64_t{30} * 1'000'000'000;

// What the shell knows of each group's liveness (the shell <-> group heartbeat level).
struct GroupLiveness {
  bool up = false;           // its first message came (its load, once loaded)
  int64_t answered_ns = 0;   // its last pong, from its own loop
  int32_t waiting_on = -1;   // that pong came from inside a collective waiting for this rank
};

// A health probe in flight: which gateway asked, and which groups have answered.
struct PendingPing {
  std::string gateway;  // ROUTER identity
  std::string probe;    // the gateway's probe id, echoed back
  std::vector<bool> answered;
  int64_t deadline_ns = 0;
};

}  // namespace

// One run(): the sockets, the load table, the probes in flight and where each request went.
// Messages from gateways and from the instance's own processes go to one handler per kind
// (std::visit); `from` names the gateway (ROUTER identity) or is null for the shell's input.
class Shell::Loop {
 public:
  Loop(const ShellOptions& options, ShellStats& stats)
      : o_(options),
        stats_(stats),
        n_groups_(options.group_inputs.size()),
        router_(ctx_, zmq::socket_type::router),
        input_(ctx_, zmq::socket_type::pull),
        eplb_(eplb_options(options)),
        membership_(static_cast<int>(options.group_inputs.size())) {
    stats_.placed_per_group.assign(n_groups_, 0);
    liveness_.resize(n_groups_);
    loads_.resize(n_groups_);
    for (size_t g = 0; g < n_groups_; ++g) {
      loads_[g].group = static_cast<int32_t>(g);
      loads_[g].max_num_seqs = o_.max_num_seqs;
      loads_[g].kv_blocks_total = o_.kv_blocks_per_group;
      loads_[g].block_size = o_.block_size;
    }
    // run_instance() accepts only these roles; anything else reports as colocated.
    const Result<InstanceRole> role = parse_instance_role(o_.role);
    role_ = role.ok() ? *role : InstanceRole::kColocated;
  }

  Status bind() {
    XDS_ASSIGN_OR_RETURN(zap_, protocol::ZapGuard::start(ctx_));
    try {
      router_.set(zmq::sockopt::linger, kFailedLingerMs);
      router_.set(zmq::sockopt::router_mandatory, 0);
      protocol::secure_binding(router_, o_.listen);
      router_.bind(o_.listen);
      input_.set(zmq::sockopt::linger, 0);
      protocol::secure_binding(input_, o_.shell_input);
      input_.bind(o_.shell_input);
      for (const std::string& address : o_.group_inputs) {
        groups_.emplace_back(ctx_, zmq::socket_type::push);
        groups_.back().set(zmq::sockopt::linger, 1000);
        // A group that died leaves its PUSH without a peer, where a send would block the loop
        // (and with it the death's report) forever; a live group drains its socket between
        // the model's layers, far within this.
        groups_.back().set(zmq::sockopt::sndtimeo, kGroupSendTimeoutMs);
        protocol::secure_binding(groups_.back(), address);
        groups_.back().bind(address);
      }
    } catch (const zmq::error_t& e) {
      return unavailable("shell: cannot bind {} / {}: {}", o_.listen, o_.shell_input, e.what());
    }
    return {};
  }

  Status run(const std::atomic<bool>& stop) {
    bool running = true;
    last_group_ping_ns_ = now_ns();  // the first heartbeat one interval after the start
    while (running && !stop.load(std::memory_order_relaxed)) {
      const char* kind = "dead_process";
      std::string failure = process_failure();
      if (failure.empty()) {
        failure = hung_group_failure(now_ns());
        kind = "hang";
      }
      if (failure.empty() && !fatal_.empty()) {
        failure = fatal_;
        kind = "scale_down";
      }
      if (!failure.empty()) {
        to_gateways(FailedMsg{failure, o_.will_restart, kind});
        // No Shutdown: a PUSH to a dead group would block; the caller kills the rest.
        return aborted("instance: {}", failure);
      }
      zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                                 {input_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(o_.load_period_ms));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return internal_error("shell: poll failed: {}", e.what());
      }
      if (items[0].revents & ZMQ_POLLIN) running = receive_from_gateway();
      receive_input();
      periodic(now_ns());
      if (o_.ready) o_.ready->store(running && all_up() && fatal_.empty());
    }
    if (o_.ready) o_.ready->store(false);  // draining or failed
    to_groups(ShutdownMsg{});
    for (int32_t g : rejoining_) to_group(static_cast<size_t>(g), ShutdownMsg{});  // loading
    return {};
  }

 private:
  static EplbControlOptions eplb_options(const ShellOptions& o) {
    EplbControlOptions eo = o.eplb;
    eo.n_groups = static_cast<int>(o.group_inputs.size());
    return eo;
  }

  // One gateway message, if a whole one is queued; false: the gateway asked to shut down.
  bool receive_from_gateway() {
    zmq::message_t identity, payload;
    if (!router_.recv(identity, zmq::recv_flags::dontwait) || !identity.more() ||
        !router_.recv(payload, zmq::recv_flags::dontwait)) {
      return true;
    }
    auto m = decode(payload.data(), payload.size());
    if (!m.ok()) {
      XDS_LOG_WARN("shell: {}", m.status().message());
      return true;
    }
    const std::string gateway = identity.to_string();
    gateways_[gateway] = now_ns();
    return std::visit([&](auto& msg) { return on(&gateway, msg); }, *m);
  }

  // Everything the groups and output processes queued.
  void receive_input() {
    while (true) {
      auto m = recv_message(input_, /*dontwait=*/true);
      if (!m.ok()) {
        XDS_LOG_WARN("shell: {}", m.status().message());
        continue;
      }
      if (!m->has_value()) break;
      std::visit([&](auto& msg) { return on(nullptr, msg); }, **m);
    }
  }

  // A group that is up and has not answered the heartbeat for group_timeout_ms: what to say
  // about it ("" while every group answers). A group blocked in a collective still answers,
  // naming the peer it waits on; when the silent group is such a peer, it alone is blamed.
  std::string hung_group(int64_t now, int32_t* group) const {
    const int64_t timeout = o_.group_timeout_ms * 1'000'000;
    for (size_t g = 0; g < n_groups_; ++g) {
      const GroupLiveness& l = liveness_[g];
      if (!l.up || now - l.answered_ns <= timeout) continue;
      std::string waiting;
      for (size_t o = 0; o < n_groups_; ++o) {
        if (o != g && liveness_[o].waiting_on == static_cast<int32_t>(g)) {
          waiting += fmt::format("{}{}", waiting.empty() ? "" : ", ", o);
        }
      }
      *group = static_cast<int32_t>(g);
      return fmt::format("DP group {} answered no heartbeat for {} ms{}", g,
                         (now - l.answered_ns) / 1'000'000,
                         waiting.empty() ? "" : fmt::format(" (DP group {} waits on it)", waiting));
    }
    return {};
  }

  ShellHealth health(int64_t now) const {
    ShellHealth h;
    int32_t hung = -1;
    h.healthy = all_up() && hung_group(now, &hung).empty() && fatal_.empty();
    h.groups = membership_.members();
    for (int32_t g : h.groups) {
      const GroupLoad& l = loads_[static_cast<size_t>(g)];
      h.running += l.running;
      h.waiting += l.waiting;
      h.kv_blocks_used += l.kv_blocks_used;
      h.kv_blocks_total += l.kv_blocks_total;
    }
    return h;
  }

  bool all_up() const {
    for (int32_t g : membership_.members()) {
      if (!liveness_[static_cast<size_t>(g)].up) return false;
    }
    return true;
  }

  // What died, after leaving out a DP group where it can be (scale-down): "" when nothing
  // else did.
  std::string process_failure() {
    if (!o_.process_deaths) return o_.process_failure ? o_.process_failure() : std::string();
    std::string out;
    for (const ProcessDeath& d : o_.process_deaths()) {
      if (d.group >= 0 && !membership_.member(d.group)) continue;  // left out already
      if (d.group >= 0 && out.empty() && leave_out(d.group, d.what)) continue;
      out += (out.empty() ? "" : "; ") + d.what;
    }
    return out;
  }

  std::string hung_group_failure(int64_t now) {
    int32_t g = -1;
    std::string why = hung_group(now, &g);
    if (!why.empty() && leave_out(g, why)) return {};
    return why;
  }

  // Scale-down (P119): leaves lost group g out when the groups left hold a copy of every
  // expert, and starts the reform; false (the instance starts again) otherwise.
  bool leave_out(int32_t g, const std::string& why) {
    if (!o_.scale_down) return false;
    auto left = membership_.without(g);
    Status st = left.ok() ? Status{} : left.status();
    if (st.ok() && (o_.cooperative || role_ == InstanceRole::kPrefill)) {
      st = failed_precondition("a prefill instance starts again instead");
    }
    if (st.ok() && !eplb_.idle()) st = failed_precondition("an EPLB reconfiguration runs");
    if (st.ok()) st = eplb_.covers(std::vector<int>(left->begin(), left->end()));
    if (!st.ok()) {
      XDS_LOG_WARN("shell: {}; no scale-down ({})", why, st.message());
      return false;
    }
    if (o_.kill_group) o_.kill_group(g);  // a hung group; a dead one is gone already
    auto leave = membership_.leave_out(g, now_ns(), kReformTimeoutNs);
    if (!leave.ok()) return false;
    XDS_LOG_WARN("shell: {}; the instance goes on with DP groups {} (scale-down)", why,
                 fmt::join(leave->members, ", "));
    liveness_[static_cast<size_t>(g)].up = false;
    stats_.lost_groups.push_back(g);
    GroupLoad& l = loads_[static_cast<size_t>(g)];
    l.kv_blocks_total = l.kv_blocks_used = l.kv_blocks_reserved = 0;  // nothing placed there
    l.running = l.waiting = 0;
    loads_dirty_ = true;
    eplb_.stop(fmt::format("DP group {} was lost; the instance runs on {} group(s)", g,
                           leave->members.size()));
    MembershipMsg lost;
    lost.group = g;
    lost.reason = why;
    lost.members = leave->members;
    for (auto it = owner_.begin(); it != owner_.end();) {
      if (it->second == g) {
        lost.request_ids.push_back(it->first);
        it = owner_.erase(it);
      } else {
        ++it;
      }
    }
    to_gateways(lost);
    to_groups(*leave);
    return true;
  }

  // A message from group g: the first one marks it up (its heartbeat timer starts).
  void group_spoke(int32_t g, int64_t now) {
    if (g < 0 || static_cast<size_t>(g) >= n_groups_ || !membership_.member(g)) return;
    GroupLiveness& l = liveness_[static_cast<size_t>(g)];
    if (!l.up) {
      l.up = true;
      l.answered_ns = now;
    }
  }

  // EPLB rounds and metrics, expired probes, the load table to the gateways.
  void periodic(int64_t now) {
    if (Status late = membership_.check_deadline(now); !late.ok() && fatal_.empty()) {
      fatal_ = late.message();
    }
    if (o_.on_health) o_.on_health(health(now));
    if (o_.expert_backup && !backup_started_ && all_up()) {
      std::optional<EplbCommand> command;
      const EplbAnswer a = eplb_.backup(now, command);
      if (command) eplb_broadcast(std::move(*command));
      // 409 until the groups' first expert counts give the model's shape: tried again.
      if (a.status != 409) backup_started_ = true;
      if (a.status >= 400 && a.status != 409) {
        XDS_LOG_WARN("shell: --expert-backup: {}", a.body.dump());
      }
    }
    if (now - last_group_ping_ns_ >= o_.group_heartbeat_interval_ms * 1'000'000) {
      last_group_ping_ns_ = now;
      PingMsg ping;
      ping.seq = ++ping_seq_;  // a pong to it only marks its group alive
      to_groups(ping);
    }
    if (eplb_.due(now)) (void)eplb_rebalance();
    if (eplb_.enabled() && now - last_eplb_push_ns_ >= kEplbPushPeriodNs) {
      to_gateways(EplbStatePushMsg{eplb_.metrics_text()});
      last_eplb_push_ns_ = now;
    }
    for (auto it = pings_.begin(); it != pings_.end();) {
      it = it->second.deadline_ns < now ? pings_.erase(it) : std::next(it);
    }
    if (loads_dirty_ && now - last_load_sent_ns_ >= o_.load_period_ms * 1'000'000) {
      LoadMsg lm;
      lm.loads = loads_;
      lm.role = role_;
      lm.incarnation = o_.incarnation;
      if (!experts_dirty_) {  // the gateways keep the counts they have
        for (GroupLoad& l : lm.loads) {
          l.expert_tokens.clear();
          l.moe_layers.clear();
        }
      }
      experts_dirty_ = false;
      to_gateways(lm);
      last_load_sent_ns_ = now;
      loads_dirty_ = false;
    }
  }

  // --- handlers, one per kind; `from`: the gateway, null for the shell's input ---

  bool on(const std::string* from, RequestMsg& m) {
    if (from == nullptr) return unexpected(from, m);
    if (m.incarnation != 0 && m.incarnation != o_.incarnation) {
      // Sent to the instance before it restarted: the gateway resends it, recomputed, once it
      // has seen this incarnation.
      ++stats_.stale;
      RejectedMsg rej;
      rej.request_id = m.request.id;
      rej.attempt = m.request.attempt;
      rej.reason = "the instance restarted";
      to_gateway(*from, rej);
      return true;
    }
    place(*from, std::move(m.request));
    return true;
  }

  bool on(const std::string* from, CancelMsg& m) {
    if (from != nullptr) ++stats_.cancels;  // else: an output process saw a stop string
    cancel(m);
    return true;
  }

  bool on(const std::string* from, PingMsg& m) {
    if (from == nullptr) return unexpected(from, m);
    if (m.probe_id == kHeartbeatId) {
      // The gateway <-> shell level: answered here, from the shell's loop.
      PongMsg pong;
      pong.probe_id = m.probe_id;
      pong.role = role_;
      pong.incarnation = o_.incarnation;
      pong.ready = all_up();
      if (!pong.ready) pong.state = "starting: its DP groups are loading";
      to_gateway(*from, pong);
      return true;
    }
    const uint64_t id = ++ping_seq_;
    std::vector<bool> answered(n_groups_, true);  // groups left out answer nothing
    for (int32_t g : membership_.members()) answered[static_cast<size_t>(g)] = false;
    pings_[id] = PendingPing{*from, m.probe_id, std::move(answered), now_ns() + kPingTimeoutNs};
    PingMsg ping;
    ping.seq = id;
    to_groups(ping);
    return true;
  }

  bool on(const std::string* from, ShutdownMsg& m) {
    return from == nullptr ? unexpected(from, m) : false;
  }

  bool on(const std::string* from, AdminRequestMsg& m) {
    if (from == nullptr) return unexpected(from, m);
    admin(*from, m);
    return true;
  }

  bool on(const std::string* from, LoadMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    for (const GroupLoad& l : m.loads) {
      if (l.group < 0 || static_cast<size_t>(l.group) >= n_groups_) continue;
      if (!membership_.member(l.group)) {  // left out, or started again and loaded
        maybe_rejoin(l.group);
        continue;
      }
      group_spoke(l.group, now_ns());
      if (!l.expert_tokens.empty()) experts_dirty_ = true;
      eplb_.on_window(l);
      merge_load(loads_[static_cast<size_t>(l.group)], l);
      loads_dirty_ = true;
    }
    return true;
  }

  bool on(const std::string* from, PongMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    if (m.group < 0 || static_cast<size_t>(m.group) >= n_groups_) return true;
    const int64_t now = now_ns();
    group_spoke(m.group, now);
    GroupLiveness& l = liveness_[static_cast<size_t>(m.group)];
    l.answered_ns = now;
    l.waiting_on = m.waiting_on;
    auto it = pings_.find(m.seq);
    if (it == pings_.end()) return true;
    it->second.answered[static_cast<size_t>(m.group)] = true;
    bool all = true;
    for (bool a : it->second.answered) all = all && a;
    if (all) {
      PongMsg pong;
      pong.probe_id = it->second.probe;
      pong.role = role_;
      to_gateway(it->second.gateway, pong);
      pings_.erase(it);
    }
    return true;
  }

  // Prefix-cache events: the gateways route by them (P096).
  bool on(const std::string* from, BlocksMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    to_gateways(m);
    return true;
  }

  // A sleeping group holds work: wake every group anew.
  bool on(const std::string* from, WakeMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    wake();
    return true;
  }

  bool on(const std::string* from, EplbReportMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    if (auto next = eplb_.on_report(m.report)) eplb_broadcast(std::move(*next));
    return true;
  }

  bool on(const std::string* from, ReformedMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    auto next = membership_.on_reformed(m);
    if (!next.ok()) {
      if (fatal_.empty()) fatal_ = next.status().message();
      return true;
    }
    if (next->send) {
      if (next->send->phase == ReformPhase::kJoin) {
        if (o_.group_pids) {
          const std::vector<int32_t> pids = o_.group_pids();
          for (int32_t g : next->send->members) {
            next->send->pids.push_back(static_cast<size_t>(g) < pids.size() ? pids[size_t(g)] : 0);
          }
        }
        next->send->map_version = membership_.joining() ? rejoin_version_ : 0;
      }
      to_groups(*next->send);
    }
    if (next->done) reformed(next->group, next->joined);
    return true;
  }

  // A reform is over: the groups formed their fabric.
  void reformed(int32_t g, bool joined) {
    XDS_LOG_WARN("shell: DP groups {} formed their fabric (generation {}); serving on",
                 fmt::join(membership_.members(), ", "), membership_.generation());
    if (joined) {
      MembershipMsg back;
      back.group = g;
      back.joined = true;
      back.members = membership_.members();
      to_gateways(back);
      std::erase(stats_.lost_groups, g);
      liveness_[static_cast<size_t>(g)] = GroupLiveness{true, now_ns(), -1};
      eplb_.rejoined(rejoin_version_);
      backup_started_ = false;  // --expert-backup copies the experts again
    } else if (o_.respawn_group && membership_.members().size() + 1 == n_groups_) {
      // Only the one group missing starts again: the join's map is the identity of all N.
      auto pid = o_.respawn_group(g);
      if (pid.ok()) {
        XDS_LOG_WARN("shell: DP group {} starts again (pid {}); it joins once loaded", g, *pid);
        rejoining_.push_back(g);
      } else {
        XDS_LOG_WARN("shell: DP group {} cannot start again: {}", g, pid.status().message());
      }
    }
    wake();
  }

  // A group started again has loaded (its first message): it joins the others.
  void maybe_rejoin(int32_t g) {
    if (std::find(rejoining_.begin(), rejoining_.end(), g) == rejoining_.end() ||
        membership_.reforming()) {
      return;
    }
    auto leave = membership_.join(g, now_ns(), kReformTimeoutNs);
    if (!leave.ok()) return;
    std::erase(rejoining_, g);
    rejoin_version_ = eplb_.map_version() + 2;
    XDS_LOG_WARN("shell: DP group {} is loaded; it joins DP groups {} (map v{})", g,
                 fmt::join(membership_.members(), ", "), rejoin_version_);
    to_groups(*leave);
    wake();  // sleeping groups take the next step boundary, where every group leaves
  }

  bool on(const std::string* from, EndedMsg& m) {
    if (from != nullptr) return unexpected(from, m);
    for (const std::string& id : m.request_ids) {
      auto it = owner_.find(id);
      if (it != owner_.end() && it->second == m.group) owner_.erase(it);
    }
    return true;
  }

  // Kinds the shell never receives (tokens, outputs, the shell's own replies).
  template <typename M>
  bool on(const std::string* from, M& m) {
    return unexpected(from, m);
  }

  template <typename M>
  bool unexpected(const std::string* from, const M& m) {
    XDS_LOG_WARN("shell: unexpected {} message {}", kind_name(kind_of(Message(m))),
                 from != nullptr ? "from a gateway" : "on its input");
    return true;
  }

  // --- placement, cancels, wake, EPLB, admin ---

  // Places `r` on one group (every group, numbered, when cooperative) and wakes the groups,
  // or answers Rejected when no group can take it now (or ever).
  void place(const std::string& gateway, EngineRequest r) {
    PlacementRequest pr;
    pr.prompt_tokens = static_cast<int64_t>(r.prompt.size());
    pr.max_tokens = static_cast<int64_t>(r.sampling.max_tokens) * r.sampling.n;
    auto decision = place_request(loads_, pr, o_.placement);
    if (!decision.ok() || decision->wait()) {
      ++stats_.rejected;
      RejectedMsg rej;
      rej.request_id = r.id;
      rej.attempt = r.attempt;
      int64_t largest = 0;
      for (const GroupLoad& l : loads_) largest = std::max(largest, l.kv_blocks_total);
      const int64_t need = placement_blocks(pr, std::max<int64_t>(1, o_.block_size));
      if (!decision.ok()) {
        rej.never = true;
        rej.reason = decision.status().message();
      } else if (need > largest && largest > 0) {
        rej.never = true;
        rej.reason = fmt::format(
            "the request needs {} KV blocks (prompt {} + max_tokens {} x n), a DP group has {}",
            need, pr.prompt_tokens, r.sampling.max_tokens, largest);
      } else {
        rej.reason = "every DP group is at its batch or KV limit";
      }
      to_gateway(gateway, rej);
      return;
    }
    const auto g = static_cast<size_t>(decision->index);
    account_placement(loads_[g], pr);
    ++stats_.placed;
    ++stats_.placed_per_group[g];
    if (o_.cooperative) {
      r.pool_number = ++pool_number_;
      to_groups(RequestMsg{std::move(r)});
    } else {
      owner_[r.id] = static_cast<int>(g);
      to_group(g, RequestMsg{std::move(r)});
    }
    wake();
  }

  // To the group that holds the request. A cooperative instance's groups all hold every
  // request until they agree which one prefills it (engine/cooperative_prefill.h), so its
  // cancels go to every group. A request no group holds (it ended, or was never placed) needs
  // no cancel.
  void cancel(const CancelMsg& m) {
    if (o_.cooperative) {
      to_groups(m);
      return;
    }
    auto it = owner_.find(m.request_id);
    if (it == owner_.end()) {
      ++stats_.cancels_dropped;
      return;
    }
    to_group(static_cast<size_t>(it->second), m);
  }

  void wake() {
    WakeMsg w;
    w.seq = ++wake_seq_;
    to_groups(w);
  }

  // An EPLB command to every group, then a wake so that sleeping groups exchange headers.
  void eplb_broadcast(EplbCommand c) {
    to_groups(EplbCommandMsg{std::move(c)});
    wake();
  }

  EplbAnswer eplb_rebalance() {
    std::optional<EplbCommand> command;
    EplbAnswer a = eplb_.rebalance(now_ns(), command);
    if (command) eplb_broadcast(std::move(*command));
    return a;
  }

  void admin(const std::string& gateway, const AdminRequestMsg& m) {
    EplbAnswer a;
    switch (m.call) {
      case AdminCall::kEplbState:
        a.body = eplb_.state();
        break;
      case AdminCall::kEplbRebalance:
        a = eplb_rebalance();
        break;
      case AdminCall::kInjectFault:
        a = inject_fault(m.body);
        break;
      default:
        a = {404, {{"error", fmt::format("unknown admin call {}", static_cast<int>(m.call))}}};
    }
    to_gateway(gateway, AdminReplyMsg{m.call_id, a.status, a.body.dump()});
  }

  // POST /admin/faults, already checked by the gateway: forwarded to the group it strikes.
  EplbAnswer inject_fault(const std::string& body) {
    if (!o_.fault_injection) {
      return {404, {{"error", "fault injection is off (start with --fault-injection)"}}};
    }
    FaultSpec f;
    try {
      f = nlohmann::json::parse(body).get<FaultSpec>();
    } catch (const nlohmann::json::exception& e) {
      return {400, {{"error", fmt::format("fault: {}", e.what())}}};
    }
    if (f.group < 0 || static_cast<size_t>(f.group) >= n_groups_) {
      return {400, {{"error", fmt::format("fault: 'group' {} is out of range: the instance has {}",
                                          f.group, n_groups_)}}};
    }
    if (!membership_.member(f.group)) {
      return {400, {{"error", fmt::format("fault: DP group {} was lost and left out", f.group)}}};
    }
    if (f.kind == protocol::FaultKind::kKvCorrupt && role_ != InstanceRole::kDecode) {
      return {400, {{"error", "fault: kv_corrupt strikes a decode instance's KV pulls; this "
                              "instance pulls none"}}};
    }
    if (f.kind == protocol::FaultKind::kExchangeError && membership_.members().size() < 2) {
      return {400, {{"error", "fault: exchange_error needs an expert-parallel exchange (--dp 2 or "
                              "more); this instance serves with one DP group"}}};
    }
    XDS_LOG_WARN("shell: injecting fault {} (kind {}) into DP group {} after {} step(s)", f.id,
                 static_cast<int>(f.kind), f.group, f.after_steps);
    to_group(static_cast<size_t>(f.group), FaultMsg{f});
    wake();  // a sleeping group counts steps only when it runs them
    return {202, {{"id", f.id}}};
  }

  // --- sockets ---

  void to_group(size_t g, const Message& m) {
    Status st = send_message(groups_[g], m);
    if (!st.ok()) XDS_LOG_WARN("shell: to DP group {}: {}", g, st.message());
  }

  // To every group that serves (a lost one's socket has no reader: a send would block).
  void to_groups(const Message& m) {
    for (int32_t g : membership_.members()) to_group(static_cast<size_t>(g), m);
  }

  void to_gateway(const std::string& identity, const Message& m) {
    const std::string bytes = encode(m);
    try {
      router_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      XDS_LOG_WARN("shell: reply to a gateway failed: {}", e.what());
    }
  }

  void to_gateways(const Message& m) {
    for (const auto& [identity, seen] : gateways_) to_gateway(identity, m);
  }

  const ShellOptions& o_;
  ShellStats& stats_;
  const size_t n_groups_;
  zmq::context_t ctx_{1};
  std::unique_ptr<protocol::ZapGuard> zap_;  // before the sockets: destroyed after them
  zmq::socket_t router_;
  zmq::socket_t input_;
  std::vector<zmq::socket_t> groups_;
  EplbControl eplb_;
  GroupMembership membership_;
  std::string fatal_;            // a scale-down that failed: the instance starts again
  bool backup_started_ = false;  // --expert-backup's reconfiguration was started
  std::vector<int32_t> rejoining_;  // groups started again, not loaded yet
  uint64_t rejoin_version_ = 0;     // the identity map's version of the join in flight
  InstanceRole role_ = InstanceRole::kColocated;
  std::vector<GroupLoad> loads_;
  std::vector<GroupLiveness> liveness_;
  int64_t last_group_ping_ns_ = 0;
  std::unordered_map<std::string, int> owner_;  // request id -> the group it was placed on
  std::map<uint64_t, PendingPing> pings_;
  std::map<std::string, int64_t> gateways_;  // identity -> last seen (ns)
  uint64_t wake_seq_ = 0;
  uint64_t ping_seq_ = 0;
  uint64_t pool_number_ = 0;  // cooperative prefill: the last request number sent
  int64_t last_eplb_push_ns_ = 0;
  int64_t last_load_sent_ns_ = 0;
  bool loads_dirty_ = false;
  bool experts_dirty_ = false;  // expert counts arrived since the last load sent to gateways
};

Shell::Shell(ShellOptions options) : options_(std::move(options)) {}

Status Shell::run() {
  set_process_name(process_name("shell", options_.instance));  // "xds-shell", "xds-<i>-shell"
  Loop loop(options_, stats_);
  XDS_RETURN_IF_ERROR(loop.bind());
  return loop.run(stop_);
}

}  // namespace xds::serve
