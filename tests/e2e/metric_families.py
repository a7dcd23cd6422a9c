"""The /metrics families of `xdeepserve serve` and their Prometheus types, written down by hand
from docs/design/operations.md (not read from the code): what the metrics tests hold the
exposition text to. A value that only grows is a counter whose name ends in _total; a value
that goes up and down is a gauge."""

COUNTERS = [
    # gateway: requests
    "xdeepserve_requests_total", "xdeepserve_requests_rejected_total",
    "xdeepserve_prompt_tokens_total", "xdeepserve_generation_tokens_total",
    # gateway: faults and P/D
    "xdeepserve_requests_recomputed_total", "xdeepserve_instance_failures_total",
    "xdeepserve_instance_restarts_total", "xdeepserve_instance_scale_downs_total",
    "xdeepserve_kv_handoffs_deferred_total",
    # per DP group
    "xdeepserve_steps_total", "xdeepserve_step_rollbacks_total", "xdeepserve_preemptions_total",
    "xdeepserve_prefix_cache_hit_blocks_total", "xdeepserve_prefix_cache_query_blocks_total",
    "xdeepserve_kv_blocks_retired_total", "xdeepserve_moe_seconds_total",
    "xdeepserve_kv_transfers_completed_total", "xdeepserve_kv_transfers_expired_total",
    "xdeepserve_kv_pulled_bytes_total", "xdeepserve_kv_probes_saturated_total",
    "xdeepserve_kv_links_failed_total", "xdeepserve_kv_handoffs_recomputed_total",
    "xdeepserve_kv_checksum_mismatches_total",
    # experts, MTP, EPLB
    "xdeepserve_expert_routed_tokens_total", "xdeepserve_spec_decode_verify_steps_total",
    "xdeepserve_spec_decode_step_tokens_total", "xdeepserve_spec_decode_draft_tokens_total",
    "xdeepserve_spec_decode_accepted_tokens_total", "xdeepserve_eplb_rebalances_total",
    "xdeepserve_eplb_device_tokens_total", "xdeepserve_eplb_slot_tokens_total",
]

GAUGES = [
    "xdeepserve_requests_running", "xdeepserve_requests_waiting",
    "xdeepserve_group_requests_running", "xdeepserve_group_requests_waiting",
    "xdeepserve_kv_cache_usage_ratio", "xdeepserve_batch_size", "xdeepserve_kv_transfers_parked",
    "xdeepserve_instance_up", "xdeepserve_instance_groups", "xdeepserve_kv_handoffs_waiting",
    "xdeepserve_gateway_cached_blocks", "xdeepserve_spec_decode_tokens_per_step",
    "xdeepserve_spec_decode_acceptance_rate", "xdeepserve_eplb_map_version",
    "xdeepserve_eplb_switch_step", "xdeepserve_eplb_device_load_max_mean",
]

HISTOGRAMS = [
    "xdeepserve_time_to_first_token_seconds", "xdeepserve_time_per_output_token_seconds",
    "xdeepserve_inter_token_latency_seconds", "xdeepserve_e2e_request_latency_seconds",
    "xdeepserve_fault_recovery_seconds",
]

# exposed family name (as on its # TYPE line) -> type
TYPES = {**{n: "counter" for n in COUNTERS}, **{n: "gauge" for n in GAUGES},
         **{n: "histogram" for n in HISTOGRAMS}}

# The rejection reasons of xdeepserve_requests_rejected_total.
REJECTION_REASONS = ["bad_request", "unauthorized", "context_length", "queue_full", "unavailable"]
