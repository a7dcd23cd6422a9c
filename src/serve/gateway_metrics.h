// The gateway's /metrics: the request-level series it observes itself (outcomes, TTFT, TPOT,
// ITL, end to end, tokens) and the per-DP-group series it hears from the shell (running and
// waiting requests, KV usage, batch size, prefix-cache hits, tokens routed per expert).
//
// Families (all prefixed xdeepserve_; docs/design/operations.md lists them all). A value that
// only grows is a counter named *_total; a value that goes up and down is a gauge:
//   requests_total{outcome}                    counter  success | cancelled | rejected | error
//   requests_rejected_total{reason}            counter  the rejected ones by reason
//                                              (rejection_reason below); their sum is
//                                              requests_total{outcome="rejected"}
//   prompt_tokens_total, generation_tokens_total counter
//   time_to_first_token_seconds, time_per_output_token_seconds, inter_token_latency_seconds,
//   e2e_request_latency_seconds                histograms
//   group_requests_running{group}, group_requests_waiting{group}, kv_cache_usage_ratio{group},
//   batch_size{group}, kv_transfers_parked{group} gauges (the group's last report)
//   steps_total{group}, preemptions_total{group}, prefix_cache_hit_blocks_total{group},
//   prefix_cache_query_blocks_total{group}, kv_transfers_completed_total{group}, ...,
//   expert_routed_tokens_total{layer,expert}, spec_decode_*_total
//                                              counters that follow each group's cumulative
//                                              count as it rises between renders (a group that
//                                              starts again from 0 is counted on from there)
//   requests_running / requests_waiting without a label: the sums
//   instance_failures_total{instance,kind}    counter  dead_process | hang | silent | final
//   instance_restarts_total{instance}         counter  new incarnations seen
//   instance_up{instance}                     gauge    1 serving, 0 recovering or failed
//   instance_scale_downs_total{instance}      counter  DP groups lost and left out (P119)
//   instance_groups{instance}                 gauge    DP groups serving (after a scale-down or
//                                                      a rejoin)
//   requests_recomputed_total                 counter  requests sent again after a failure
//   fault_recovery_seconds                    histogram from an instance's failure to the
//                                             first token of one of its recomputed requests
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "protocol/payloads.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace xds::serve {

// The reason label of a rejected request's error: unauthorized (401), context_length
// (context_length_exceeded), queue_full, unavailable (any other 503: shutting down, no
// instance serving), bad_request (any other 4xx). Pure.
std::string_view rejection_reason(const ApiError& e);

class GatewayMetrics {
 public:
  GatewayMetrics();
  // A finished request: success, cancelled or error (a rejection goes to count_rejected).
  void count_outcome(const std::string& outcome);
  // A request refused before or instead of being served: requests_total{outcome="rejected"}
  // and requests_rejected_total{reason}.
  void count_rejected(std::string_view reason);
  void count_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double s);
  void observe_tpot(double s);
  void observe_itl(double s);
  void observe_e2e(double s);
  // Several instances (prefill/decode disaggregation): a decode phase no decode instance
  // could take at once.
  void count_handoff_deferred();
  // Faults (docs/design/reliability.md).
  void count_instance_failure(int32_t instance, const std::string& kind);
  void count_instance_restart(int32_t instance);
  // A DP group lost and left out (scale-down); `groups` the instance serves with now.
  void count_scale_down(int32_t instance, int64_t groups);
  void set_instance_groups(int32_t instance, int64_t groups);
  void set_instance_up(int32_t instance, bool up);
  void count_recomputed();
  void observe_fault_recovery(double s);
  // Several instances, before render(): the decode phases waiting in the gateway and the
  // prefix-cache blocks the gateway knows each instance holds (index = instance).
  void set_instances_state(size_t handoffs_waiting, std::span<const size_t> cached_blocks);
  // The exposition text, with the groups' last loads written into their gauges first.
  std::string render(std::span<const engine::GroupLoad> loads);

 private:
  void render_expert_tokens(std::span<const engine::GroupLoad> loads);
  // The counter of (layer, expert), found in expert_counters_ rather than by the registry's
  // scan of its series (layers x experts of them: 14848 for DeepSeek-V3).
  Counter& expert_counter(int64_t layer, int64_t expert);
  void render_speculation(std::span<const engine::GroupLoad> loads);
  // The per-group series of one load.
  void render_group(const engine::GroupLoad& l);
  // Adds what `group`'s cumulative count for `c` rose by since the last render (all of it
  // when it fell: the group started again from 0).
  void add_rise(Counter& c, int32_t group, double cumulative);

  MetricsRegistry reg_;
  Counter &prompt_tokens_, &generation_tokens_;
  Histogram &ttft_, &tpot_, &itl_, &e2e_, &recovery_;
  Counter& recomputed_;
  std::mutex mu_;
  // (mu_) (counter, group) -> the group's last reported cumulative count for it
  std::map<std::pair<const Counter*, int32_t>, double> seen_;
  std::map<std::pair<int64_t, int64_t>, Counter*> expert_counters_;  // (mu_) (layer, expert)
};

}  // namespace xds::serve
