#include "serve/shell.h"

#include <chrono>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <zmq.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "engine/zmq_io.h"
#include "serve/placement.h"

namespace xds::serve {
namespace {

using engine::GroupLoad;
using engine::Message;
using engine::MessageKind;

// A health probe in flight: which gateway asked, and which groups have answered.
struct PendingPing {
  std::string gateway;  // ROUTER identity
  std::string probe;    // the gateway's probe id, echoed back
  std::vector<bool> answered;
  int64_t deadline_ns = 0;
};

}  // namespace

Shell::Shell(ShellOptions options) : options_(std::move(options)) {}

Status Shell::run() {
  const size_t n_groups = options_.group_inputs.size();
  stats_.placed_per_group.assign(n_groups, 0);
  std::vector<GroupLoad> loads(n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    loads[g].group = static_cast<int32_t>(g);
    loads[g].max_num_seqs = options_.max_num_seqs;
    loads[g].kv_blocks_total = options_.kv_blocks_per_group;
    loads[g].block_size = options_.block_size;
  }

  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  zmq::socket_t input(ctx, zmq::socket_type::pull);
  std::vector<zmq::socket_t> groups;
  try {
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::router_mandatory, 0);
    router.bind(options_.listen);
    input.set(zmq::sockopt::linger, 0);
    input.bind(options_.shell_input);
    for (const std::string& address : options_.group_inputs) {
      groups.emplace_back(ctx, zmq::socket_type::push);
      groups.back().set(zmq::sockopt::linger, 1000);
      groups.back().bind(address);
    }
  } catch (const zmq::error_t& e) {
    return unavailable("shell: cannot bind {} / {}: {}", options_.listen, options_.shell_input,
                       e.what());
  }

  EplbControlOptions eo = options_.eplb;
  eo.n_groups = static_cast<int>(n_groups);
  EplbControl eplb(eo);
  int64_t last_eplb_push_ns = 0;
  uint64_t wake_seq = 0;
  uint64_t ping_seq = 0;
  std::map<uint64_t, PendingPing> pings;
  uint64_t pool_number = 0;  // cooperative prefill: the last request number sent
  std::map<std::string, int64_t> gateways;  // identity -> last seen (ns)
  int64_t last_load_sent_ns = 0;
  bool loads_dirty = false;
  bool experts_dirty = false;  // expert counts arrived since the last load sent to gateways

  auto to_groups = [&](const Message& m) {
    for (auto& s : groups) {
      Status st = engine::send_message(s, m);
      if (!st.ok()) XDS_LOG_WARN("shell: {}", st.message());
    }
  };
  auto to_gateway = [&](const std::string& identity, const Message& m) {
    const std::string bytes = engine::encode(m);
    try {
      router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      XDS_LOG_WARN("shell: reply to a gateway failed: {}", e.what());
    }
  };

  // An EPLB command to every group, then a wake so that sleeping groups exchange headers.
  auto eplb_broadcast = [&](engine::EplbCommand c) {
    Message em;
    em.kind = MessageKind::kEplb;
    em.eplb = std::move(c);
    to_groups(em);
    Message wake;
    wake.kind = MessageKind::kWake;
    wake.seq = ++wake_seq;
    to_groups(wake);
  };
  auto eplb_rebalance = [&]() {
    std::optional<engine::EplbCommand> command;
    EplbAnswer a = eplb.rebalance(now_ns(), command);
    if (command) eplb_broadcast(std::move(*command));
    return a;
  };

  auto handle_gateway = [&](const std::string& identity, Message m) -> bool {
    gateways[identity] = now_ns();
    switch (m.kind) {
      case MessageKind::kRequest: {
        if (!m.request) return true;
        const engine::EngineRequest& r = *m.request;
        PlacementRequest pr;
        pr.prompt_tokens = static_cast<int64_t>(r.prompt.size());
        pr.max_tokens = static_cast<int64_t>(r.sampling.max_tokens) * r.sampling.n;
        auto decision = place_request(loads, pr, options_.placement);
        if (!decision.ok() || decision->wait()) {
          ++stats_.rejected;
          Message rej;
          rej.kind = MessageKind::kRejected;
          rej.request_id = r.id;
          int64_t largest = 0;
          for (const GroupLoad& l : loads) largest = std::max(largest, l.kv_blocks_total);
          const int64_t need = placement_blocks(pr, std::max<int64_t>(1, options_.block_size));
          if (!decision.ok()) {
            rej.text = std::string(kRejectNever) + decision.status().message();
          } else if (need > largest && largest > 0) {
            rej.text = fmt::format(
                "{}the request needs {} KV blocks (prompt {} + max_tokens {} x n), a DP group "
                "has {}",
                kRejectNever, need, pr.prompt_tokens, r.sampling.max_tokens, largest);
          } else {
            rej.text = "every DP group is at its batch or KV limit";
          }
          to_gateway(identity, rej);
          return true;
        }
        const auto g = static_cast<size_t>(decision->index);
        account_placement(loads[g], pr);
        ++stats_.placed;
        ++stats_.placed_per_group[g];
        if (options_.cooperative) {
          m.request->pool_number = ++pool_number;
          to_groups(m);
        } else {
          Status st = engine::send_message(groups[g], m);
          if (!st.ok()) XDS_LOG_WARN("shell: {}", st.message());
        }
        Message wake;
        wake.kind = MessageKind::kWake;
        wake.seq = ++wake_seq;
        to_groups(wake);
        return true;
      }
      case MessageKind::kCancel:
        ++stats_.cancels;
        to_groups(m);
        return true;
      case MessageKind::kPing: {
        const uint64_t id = ++ping_seq;
        pings[id] = PendingPing{identity, m.request_id, std::vector<bool>(n_groups, false),
                                now_ns() + int64_t{30} * 1'000'000'000};
        Message ping;
        ping.kind = MessageKind::kPing;
        ping.seq = id;
        to_groups(ping);
        return true;
      }
      case MessageKind::kShutdown:
        return false;
      case MessageKind::kAdmin: {
        Message reply;
        reply.kind = MessageKind::kAdmin;
        reply.request_id = m.request_id;
        EplbAnswer a;
        if (m.text == "eplb") {
          a.body = eplb.state();
        } else if (m.text == "eplb/rebalance") {
          a = eplb_rebalance();
        } else {
          a = {404, {{"error", fmt::format("unknown admin call '{}'", m.text)}}};
        }
        reply.index = a.status;
        reply.text = a.body.dump();
        to_gateway(identity, reply);
        return true;
      }
      default:
        XDS_LOG_WARN("shell: unexpected message kind {} from a gateway", static_cast<int>(m.kind));
        return true;
    }
  };

  auto handle_input = [&](Message m) {
    switch (m.kind) {
      case MessageKind::kLoad:
        for (const GroupLoad& l : m.loads) {
          if (l.group >= 0 && static_cast<size_t>(l.group) < n_groups) {
            if (!l.expert_tokens.empty()) experts_dirty = true;
            eplb.on_window(l);
            engine::merge_load(loads[static_cast<size_t>(l.group)], l);
            loads_dirty = true;
          }
        }
        break;
      case MessageKind::kPong: {
        auto it = pings.find(m.seq);
        if (it == pings.end() || m.group < 0 || static_cast<size_t>(m.group) >= n_groups) break;
        it->second.answered[static_cast<size_t>(m.group)] = true;
        bool all = true;
        for (bool a : it->second.answered) all = all && a;
        if (all) {
          Message pong;
          pong.kind = MessageKind::kPong;
          pong.request_id = it->second.probe;
          pong.text = options_.role;
          to_gateway(it->second.gateway, pong);
          pings.erase(it);
        }
        break;
      }
      case MessageKind::kBlocks:  // prefix-cache events: the gateways route by them (P096)
        for (const auto& [identity, seen] : gateways) to_gateway(identity, m);
        break;
      case MessageKind::kCancel:  // an output process saw a stop string
        to_groups(m);
        break;
      case MessageKind::kWake: {  // a sleeping group holds work: wake every group anew
        Message wake;
        wake.kind = MessageKind::kWake;
        wake.seq = ++wake_seq;
        to_groups(wake);
        break;
      }
      case MessageKind::kEplb:
        if (m.eplb_report) {
          if (auto next = eplb.on_report(*m.eplb_report)) eplb_broadcast(std::move(*next));
        }
        break;
      default:
        XDS_LOG_WARN("shell: unexpected message kind {} on its input", static_cast<int>(m.kind));
    }
  };

  bool running = true;
  while (running && !stop_.load(std::memory_order_relaxed)) {
    if (options_.process_failure) {
      if (std::string failure = options_.process_failure(); !failure.empty()) {
        Message failed;
        failed.kind = MessageKind::kFailed;
        failed.text = failure;
        for (const auto& [identity, seen] : gateways) to_gateway(identity, failed);
        // No kShutdown: a PUSH to a dead group would block; the caller kills the rest.
        return unavailable("instance: {}", failure);
      }
    }
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                               {input.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(options_.load_period_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return internal_error("shell: poll failed: {}", e.what());
    }
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t identity, payload;
      if (router.recv(identity, zmq::recv_flags::dontwait) && identity.more() &&
          router.recv(payload, zmq::recv_flags::dontwait)) {
        auto m = engine::decode(payload.data(), payload.size());
        if (!m.ok()) {
          XDS_LOG_WARN("shell: {}", m.status().message());
        } else {
          running = handle_gateway(identity.to_string(), std::move(*m));
        }
      }
    }
    while (true) {
      auto m = engine::recv_message(input, /*dontwait=*/true);
      if (!m.ok()) {
        XDS_LOG_WARN("shell: {}", m.status().message());
        continue;
      }
      if (!m->has_value()) break;
      handle_input(std::move(**m));
    }
    const int64_t now = now_ns();
    if (eplb.due(now)) (void)eplb_rebalance();
    if (eplb.enabled() && now - last_eplb_push_ns >= int64_t{1'000'000'000}) {
      Message em;
      em.kind = MessageKind::kAdmin;
      em.text = eplb.metrics_text();
      for (const auto& [identity, seen] : gateways) to_gateway(identity, em);
      last_eplb_push_ns = now;
    }
    for (auto it = pings.begin(); it != pings.end();) {
      it = it->second.deadline_ns < now ? pings.erase(it) : std::next(it);
    }
    if (loads_dirty && now - last_load_sent_ns >= options_.load_period_ms * 1'000'000) {
      Message lm;
      lm.kind = MessageKind::kLoad;
      lm.loads = loads;
      lm.text = options_.role;
      if (!experts_dirty) {  // the gateways keep the counts they have
        for (GroupLoad& l : lm.loads) {
          l.expert_tokens.clear();
          l.moe_layers.clear();
        }
      }
      experts_dirty = false;
      for (const auto& [identity, seen] : gateways) to_gateway(identity, lm);
      last_load_sent_ns = now;
      loads_dirty = false;
    }
  }
  Message bye;
  bye.kind = MessageKind::kShutdown;
  to_groups(bye);
  return {};
}

}  // namespace xds::serve
