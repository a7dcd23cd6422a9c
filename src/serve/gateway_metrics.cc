#include "serve/gateway_metrics.h"

#include <string>
#include <utility>
#include <vector>

namespace xds::serve {
namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,
          0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0, 160.0};
}

Counter& handoffs_deferred(MetricsRegistry& reg) {
  return reg.counter("xdeepserve_kv_handoffs_deferred_total",
                     "Decode phases no decode instance could take at once (their KV waited on "
                     "the prefill side).");
}

constexpr const char* kRejectedHelp =
    "Requests refused before or instead of being served, by reason: bad_request, "
    "unauthorized, context_length, queue_full, unavailable.";
constexpr const char* kRejectionReasons[] = {"bad_request", "unauthorized", "context_length",
                                             "queue_full", "unavailable"};

}  // namespace

std::string_view rejection_reason(const ApiError& e) {
  if (e.http_status == 401) return "unauthorized";
  if (e.code == "context_length_exceeded") return "context_length";
  if (e.code == "queue_full") return "queue_full";
  if (e.http_status == 503) return "unavailable";
  return "bad_request";
}

GatewayMetrics::GatewayMetrics()
    : prompt_tokens_(reg_.counter("xdeepserve_prompt_tokens_total", "Prompt tokens processed.")),
      generation_tokens_(reg_.counter("xdeepserve_generation_tokens_total", "Tokens generated.")),
      ttft_(reg_.histogram("xdeepserve_time_to_first_token_seconds",
                           "From arrival at the gateway to the first token.", latency_buckets())),
      tpot_(reg_.histogram("xdeepserve_time_per_output_token_seconds",
                           "Per request: (last token - first token) / (tokens - 1).",
                           latency_buckets())),
      itl_(reg_.histogram("xdeepserve_inter_token_latency_seconds",
                          "Between consecutive deltas of a request.", latency_buckets())),
      e2e_(reg_.histogram("xdeepserve_e2e_request_latency_seconds",
                          "From arrival to the last token.", latency_buckets())),
      recovery_(reg_.histogram("xdeepserve_fault_recovery_seconds",
                               "From an instance's failure to the first token of one of the "
                               "requests it held, recomputed.",
                               latency_buckets())),
      recomputed_(reg_.counter("xdeepserve_requests_recomputed_total",
                               "Requests sent again after their instance failed (recomputed "
                               "from their prompt and the tokens they had streamed).")) {
  for (const char* outcome : {"success", "cancelled", "rejected", "error"}) {
    reg_.counter("xdeepserve_requests_total", "Finished requests by outcome.",
                 {{"outcome", outcome}});
  }
  for (const char* reason : kRejectionReasons) {
    reg_.counter("xdeepserve_requests_rejected_total", kRejectedHelp, {{"reason", reason}});
  }
}

void GatewayMetrics::count_rejected(std::string_view reason) {
  count_outcome("rejected");
  reg_.counter("xdeepserve_requests_rejected_total", kRejectedHelp,
               {{"reason", std::string(reason)}})
      .inc();
}

void GatewayMetrics::count_outcome(const std::string& outcome) {
  reg_.counter("xdeepserve_requests_total", "Finished requests by outcome.", {{"outcome", outcome}})
      .inc();
}

void GatewayMetrics::count_tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_.inc(static_cast<double>(prompt));
  generation_tokens_.inc(static_cast<double>(generated));
}

void GatewayMetrics::count_instance_failure(int32_t instance, const std::string& kind) {
  reg_.counter("xdeepserve_instance_failures_total",
               "Instance failures seen by the gateway: dead_process (a process died), hang (a "
               "DP group stopped answering), silent (the shell stopped answering), final (no "
               "restart left).",
               {{"instance", std::to_string(instance)}, {"kind", kind}})
      .inc();
}

void GatewayMetrics::count_instance_restart(int32_t instance) {
  reg_.counter("xdeepserve_instance_restarts_total",
               "New incarnations of an instance (its processes started again).",
               {{"instance", std::to_string(instance)}})
      .inc();
}

void GatewayMetrics::count_scale_down(int32_t instance, int64_t groups) {
  const std::string i = std::to_string(instance);
  reg_.counter("xdeepserve_instance_scale_downs_total",
               "DP groups an instance lost and went on without (scale-down: their requests "
               "recomputed on the others).",
               {{"instance", i}})
      .inc();
  set_instance_groups(instance, groups);
}

void GatewayMetrics::set_instance_groups(int32_t instance, int64_t groups) {
  reg_.gauge("xdeepserve_instance_groups",
             "DP groups an instance serves with, after its last scale-down or rejoin.",
             {{"instance", std::to_string(instance)}})
      .set(static_cast<double>(groups));
}

void GatewayMetrics::set_instance_up(int32_t instance, bool up) {
  reg_.gauge("xdeepserve_instance_up", "1 while the instance serves, 0 while it is out.",
             {{"instance", std::to_string(instance)}})
      .set(up ? 1.0 : 0.0);
}

void GatewayMetrics::count_recomputed() {
  recomputed_.inc();
}
void GatewayMetrics::observe_fault_recovery(double s) {
  recovery_.observe(s);
}

void GatewayMetrics::observe_ttft(double s) {
  ttft_.observe(s);
}
void GatewayMetrics::observe_tpot(double s) {
  tpot_.observe(s);
}
void GatewayMetrics::observe_itl(double s) {
  itl_.observe(s);
}
void GatewayMetrics::observe_e2e(double s) {
  e2e_.observe(s);
}

Counter& GatewayMetrics::expert_counter(int64_t layer, int64_t expert) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = expert_counters_.find({layer, expert});
    if (it != expert_counters_.end()) return *it->second;
  }
  Counter& c = reg_.counter(
      "xdeepserve_expert_routed_tokens_total",
      "Tokens routed to each logical expert of each MoE layer (cache-layer id; MTP layers after "
      "the decoder's), all DP groups.",
      {{"layer", std::to_string(layer)}, {"expert", std::to_string(expert)}});
  std::lock_guard<std::mutex> lock(mu_);
  expert_counters_[{layer, expert}] = &c;
  return c;
}

// Tokens routed per (MoE layer, expert), summed over the DP groups (each counts the tokens it
// routes: under expert parallelism a group's tokens go to every device's experts).
void GatewayMetrics::render_expert_tokens(std::span<const engine::GroupLoad> loads) {
  for (const engine::GroupLoad& l : loads) {
    // expert_tokens: [moe_layers, n_experts], cumulative
    if (l.n_experts <= 0 ||
        l.expert_tokens.size() != l.moe_layers.size() * static_cast<size_t>(l.n_experts))
      continue;
    for (size_t r = 0; r < l.moe_layers.size(); ++r) {
      for (int64_t e = 0; e < l.n_experts; ++e) {
        add_rise(expert_counter(l.moe_layers[r], e), l.group,
                 static_cast<double>(l.expert_tokens[r * static_cast<size_t>(l.n_experts) + e]));
      }
    }
  }
}

// MTP speculative decoding, summed over the DP groups (vLLM's spec_decode counters): verify
// steps with drafts, the tokens they gave, and per draft position (1-based) the drafts
// verified and accepted, with their ratio. Nothing when no group speculates.
void GatewayMetrics::render_speculation(std::span<const engine::GroupLoad> loads) {
  for (const engine::GroupLoad& l : loads) {
    if (l.spec_drafted.empty() || l.spec_accepted.size() != l.spec_drafted.size()) continue;
    Counter& steps = reg_.counter("xdeepserve_spec_decode_verify_steps_total",
                                  "Decode steps that verified MTP drafts, all DP groups.");
    Counter& tokens =
        reg_.counter("xdeepserve_spec_decode_step_tokens_total",
                     "Tokens those steps gave (accepted drafts + 1 each), all DP groups.");
    add_rise(steps, l.group, static_cast<double>(l.spec_steps));
    add_rise(tokens, l.group, static_cast<double>(l.spec_tokens));
    reg_.gauge("xdeepserve_spec_decode_tokens_per_step",
               "Mean tokens per verify step (step_tokens / verify_steps).")
        .set(steps.value() > 0 ? tokens.value() / steps.value() : 0.0);
    for (size_t i = 0; i < l.spec_drafted.size(); ++i) {
      const MetricLabels pos{{"position", std::to_string(i + 1)}};
      Counter& drafted =
          reg_.counter("xdeepserve_spec_decode_draft_tokens_total",
                       "Drafts verified at each draft position, all DP groups.", pos);
      Counter& accepted =
          reg_.counter("xdeepserve_spec_decode_accepted_tokens_total",
                       "Drafts accepted at each draft position, all DP groups.", pos);
      add_rise(drafted, l.group, static_cast<double>(l.spec_drafted[i]));
      add_rise(accepted, l.group, static_cast<double>(l.spec_accepted[i]));
      reg_.gauge("xdeepserve_spec_decode_acceptance_rate",
                 "accepted_tokens / draft_tokens at each draft position.", pos)
          .set(drafted.value() > 0 ? accepted.value() / drafted.value() : 0.0);
    }
  }
}

void GatewayMetrics::count_handoff_deferred() {
  handoffs_deferred(reg_).inc();
}

void GatewayMetrics::set_instances_state(size_t handoffs_waiting,
                                         std::span<const size_t> cached_blocks) {
  handoffs_deferred(reg_);  // listed from the first scrape, at 0
  reg_.gauge("xdeepserve_kv_handoffs_waiting", "Decode phases waiting in the gateway now.")
      .set(static_cast<double>(handoffs_waiting));
  for (size_t i = 0; i < cached_blocks.size(); ++i) {
    reg_.gauge("xdeepserve_gateway_cached_blocks",
               "Prefix-cache blocks the gateway knows each instance holds (from its block-hash "
               "events), for cache-aware routing.",
               {{"instance", std::to_string(i)}})
        .set(static_cast<double>(cached_blocks[i]));
  }
}

void GatewayMetrics::add_rise(Counter& c, int32_t group, double cumulative) {
  std::lock_guard<std::mutex> lock(mu_);
  double& seen = seen_[{&c, group}];
  // A count below the last one: the group started again (from 0).
  const double added = cumulative >= seen ? cumulative - seen : cumulative;
  seen = cumulative;
  if (added > 0) c.inc(added);
}

void GatewayMetrics::render_group(const engine::GroupLoad& l) {
  const MetricLabels g{{"group", std::to_string(l.group)}};
  reg_.gauge("xdeepserve_group_requests_running", "Requests holding KV, per DP group.", g)
      .set(l.running);
  reg_.gauge("xdeepserve_group_requests_waiting", "Requests placed and waiting, per DP group.", g)
      .set(l.waiting);
  reg_.gauge("xdeepserve_kv_cache_usage_ratio", "KV blocks in use / total, per DP group.", g)
      .set(l.kv_blocks_total > 0
               ? static_cast<double>(l.kv_blocks_used) / static_cast<double>(l.kv_blocks_total)
               : 0.0);
  reg_.gauge("xdeepserve_batch_size", "Sequences in the group's last step.", g)
      .set(l.last_batch_size);
  reg_.gauge("xdeepserve_kv_transfers_parked",
             "Prefilled requests whose KV waits for a decode "
             "group to pull it (prefill/decode disaggregation), per DP group.",
             g)
      .set(static_cast<double>(l.kv_parked));
  // What the group counts from its start, as counters: {name, help, cumulative value}.
  const struct {
    const char* name;
    const char* help;
    double value;
  } cumulative[] = {
      {"xdeepserve_prefix_cache_hit_blocks_total",
       "Prompt blocks served from the prefix cache, per DP group.",
       static_cast<double>(l.prefix_hits)},
      {"xdeepserve_prefix_cache_query_blocks_total",
       "Prompt blocks looked up in the prefix cache, per DP group.",
       static_cast<double>(l.prefix_queries)},
      {"xdeepserve_preemptions_total",
       "Requests preempted (KV exhausted; recomputed later), per DP group.",
       static_cast<double>(l.preemptions)},
      {"xdeepserve_kv_blocks_retired_total",
       "KV blocks taken out of use (bad memory; the requests holding them recomputed), per DP "
       "group.",
       static_cast<double>(l.kv_blocks_retired)},
      {"xdeepserve_steps_total", "Forward steps run, per DP group.", static_cast<double>(l.steps)},
      {"xdeepserve_moe_seconds_total",
       "Time in the expert-parallel MoE phase (dispatch to combine done, every MoE layer), per "
       "DP group.",
       static_cast<double>(l.moe_ns) * 1e-9},
      {"xdeepserve_step_rollbacks_total",
       "Steps rolled back on every DP group and run again after a transient expert-parallel "
       "exchange error, per DP group.",
       static_cast<double>(l.rollbacks)},
      {"xdeepserve_kv_transfers_completed_total",
       "KV transfers a decode group pulled and completed, per prefill DP group.",
       static_cast<double>(l.kv_transfers_done)},
      {"xdeepserve_kv_transfers_expired_total",
       "KV transfers freed unpulled at their deadline, per prefill DP group.",
       static_cast<double>(l.kv_transfers_expired)},
      {"xdeepserve_kv_pulled_bytes_total",
       "KV bytes pulled from prefill groups, per decode DP "
       "group.",
       static_cast<double>(l.kv_pulled_bytes)},
      {"xdeepserve_kv_probes_saturated_total",
       "Probes a prefill group answered while a KV pull ran slow (the link saturated, not "
       "failed), per decode DP group.",
       static_cast<double>(l.kv_probes_saturated)},
      {"xdeepserve_kv_links_failed_total",
       "KV links found failed by a pull (a probe unanswered, the peer gone; the pulls queued "
       "behind it fail with it), per decode DP group.",
       static_cast<double>(l.kv_links_failed)},
      {"xdeepserve_kv_handoffs_recomputed_total",
       "Handoffs whose KV was recomputed on the decode group after their link failed or their "
       "blocks came corrupted, per decode DP group.",
       static_cast<double>(l.kv_handoffs_recomputed)},
      {"xdeepserve_kv_checksum_mismatches_total",
       "KV pulls whose blocks did not match the prefill side's checksums (bad blocks retired, "
       "the handoff recomputed), per decode DP group.",
       static_cast<double>(l.kv_checksum_mismatches)},
  };
  for (const auto& c : cumulative) add_rise(reg_.counter(c.name, c.help, g), l.group, c.value);
}

std::string GatewayMetrics::render(std::span<const engine::GroupLoad> loads) {
  double running = 0, waiting = 0;
  for (const engine::GroupLoad& l : loads) {
    render_group(l);
    running += l.running;
    waiting += l.waiting;
  }
  render_expert_tokens(loads);
  render_speculation(loads);
  reg_.gauge("xdeepserve_requests_running", "Requests holding KV, all DP groups.").set(running);
  reg_.gauge("xdeepserve_requests_waiting", "Requests placed and waiting, all DP groups.")
      .set(waiting);
  return reg_.render();
}

}  // namespace xds::serve
