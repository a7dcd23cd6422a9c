#!/usr/bin/python3
"""Writes deploy/grafana/xdeepserve.json, the Grafana dashboard over the gateway's /metrics
(docs/design/operations.md). The panels are listed here, one row per concern; run this after
changing them (tests/deploy checks that the JSON is what this script writes).

Every expression is PromQL over families the gateway exports. Rates use Grafana's
$__rate_interval. The gateway's `instance` label (the xDeepServe instance's index) arrives in
Prometheus as `exported_instance`: the scrape's own `instance` label (the gateway's address)
takes precedence.
"""
import json
import os
import sys

RATE = "$__rate_interval"


def quantiles(metric, by=""):
    by_clause = f"sum by (le{', ' + by if by else ''})"
    return [(f"p{int(q * 100)}", f"histogram_quantile({q}, {by_clause} "
             f"(rate({metric}_bucket[{RATE}])))") for q in (0.5, 0.9, 0.99)]


# (row title, [(panel title, unit, [(legend, expr)])])
ROWS = [
    ("Latency", [
        ("Time to first token", "s", quantiles("xdeepserve_time_to_first_token_seconds")),
        ("Time per output token", "s", quantiles("xdeepserve_time_per_output_token_seconds")),
        ("Inter-token latency", "s", quantiles("xdeepserve_inter_token_latency_seconds")),
        ("End-to-end request latency", "s", quantiles("xdeepserve_e2e_request_latency_seconds")),
    ]),
    ("Throughput", [
        ("Tokens per second", "short", [
            ("decode", f"sum(rate(xdeepserve_generation_tokens_total[{RATE}]))"),
            ("prompt", f"sum(rate(xdeepserve_prompt_tokens_total[{RATE}]))"),
        ]),
        ("Requests per second by outcome", "reqps", [
            ("{{outcome}}", f"sum by (outcome) (rate(xdeepserve_requests_total[{RATE}]))"),
        ]),
        ("Rejected requests per second by reason", "reqps", [
            ("{{reason}}",
             f"sum by (reason) (rate(xdeepserve_requests_rejected_total[{RATE}]))"),
        ]),
        ("Requests running and waiting", "short", [
            ("running", "sum(xdeepserve_requests_running)"),
            ("waiting", "sum(xdeepserve_requests_waiting)"),
        ]),
    ]),
    ("DP groups", [
        ("KV cache use", "percentunit", [
            ("group {{group}}", "max by (group) (xdeepserve_kv_cache_usage_ratio)"),
        ]),
        ("Batch size (last step)", "short", [
            ("group {{group}}", "max by (group) (xdeepserve_batch_size)"),
        ]),
        ("Steps per second", "short", [
            ("group {{group}}", f"sum by (group) (rate(xdeepserve_steps_total[{RATE}]))"),
        ]),
        ("Running and waiting per group", "short", [
            ("running {{group}}", "max by (group) (xdeepserve_group_requests_running)"),
            ("waiting {{group}}", "max by (group) (xdeepserve_group_requests_waiting)"),
        ]),
        ("Prefix-cache hit ratio (blocks)", "percentunit", [
            ("all groups", f"sum(rate(xdeepserve_prefix_cache_hit_blocks_total[{RATE}])) / "
                           f"sum(rate(xdeepserve_prefix_cache_query_blocks_total[{RATE}]))"),
            ("hits/s {{group}}",
             f"sum by (group) (rate(xdeepserve_prefix_cache_hit_blocks_total[{RATE}]))"),
        ]),
        ("Preemptions per second", "short", [
            ("group {{group}}", f"sum by (group) (rate(xdeepserve_preemptions_total[{RATE}]))"),
        ]),
    ]),
    ("Experts and EPLB", [
        ("Tokens routed per expert (per second)", "short", [
            ("layer {{layer}} expert {{expert}}",
             f"sum by (layer, expert) (rate(xdeepserve_expert_routed_tokens_total[{RATE}]))"),
        ]),
        ("Expert load imbalance (max / mean per layer)", "short", [
            ("layer {{layer}}",
             f"max by (layer) (rate(xdeepserve_expert_routed_tokens_total[{RATE}])) / "
             f"avg by (layer) (rate(xdeepserve_expert_routed_tokens_total[{RATE}]))"),
        ]),
        ("MoE phase time per step", "s", [
            ("group {{group}}",
             f"sum by (group) (rate(xdeepserve_moe_seconds_total[{RATE}])) / "
             f"sum by (group) (rate(xdeepserve_steps_total[{RATE}]))"),
        ]),
        ("EPLB map version", "short", [
            ("version", "max(xdeepserve_eplb_map_version)"),
        ]),
        ("EPLB rebalances", "short", [
            ("{{result}}", "sum by (result) (xdeepserve_eplb_rebalances_total)"),
        ]),
        ("EPLB device load max / mean", "short", [
            ("layer {{layer}} {{when}}",
             "max by (layer, when) (xdeepserve_eplb_device_load_max_mean)"),
        ]),
        ("Token-expert pairs per device (per second)", "short", [
            ("device {{device}}",
             f"sum by (device) (rate(xdeepserve_eplb_device_tokens_total[{RATE}]))"),
        ]),
        ("MTP draft acceptance", "percentunit", [
            ("position {{position}}",
             "max by (position) (xdeepserve_spec_decode_acceptance_rate)"),
        ]),
    ]),
    ("Prefill/decode handoffs", [
        ("KV transfers per second", "short", [
            ("completed", f"sum(rate(xdeepserve_kv_transfers_completed_total[{RATE}]))"),
            ("expired", f"sum(rate(xdeepserve_kv_transfers_expired_total[{RATE}]))"),
            ("deferred", f"sum(rate(xdeepserve_kv_handoffs_deferred_total[{RATE}]))"),
        ]),
        ("KV bytes pulled per second", "Bps", [
            ("all decode groups", f"sum(rate(xdeepserve_kv_pulled_bytes_total[{RATE}]))"),
        ]),
        ("Handoffs parked and waiting", "short", [
            ("parked (prefill side)", "sum(xdeepserve_kv_transfers_parked)"),
            ("waiting (gateway)", "sum(xdeepserve_kv_handoffs_waiting)"),
        ]),
        ("KV link trouble", "short", [
            ("saturated probes", f"sum(increase(xdeepserve_kv_probes_saturated_total[{RATE}]))"),
            ("failed links", f"sum(increase(xdeepserve_kv_links_failed_total[{RATE}]))"),
            ("checksum mismatches",
             f"sum(increase(xdeepserve_kv_checksum_mismatches_total[{RATE}]))"),
            ("recomputed handoffs",
             f"sum(increase(xdeepserve_kv_handoffs_recomputed_total[{RATE}]))"),
        ]),
    ]),
    ("Faults and recovery", [
        ("Instances up", "short", [
            ("instance {{exported_instance}}", "max by (exported_instance) (xdeepserve_instance_up)"),
            ("DP groups {{exported_instance}}",
             "max by (exported_instance) (xdeepserve_instance_groups)"),
        ]),
        ("Instance failures and restarts", "short", [
            ("{{kind}} {{exported_instance}}",
             f"sum by (exported_instance, kind) "
             f"(increase(xdeepserve_instance_failures_total[{RATE}]))"),
            ("restarts {{exported_instance}}",
             f"sum by (exported_instance) (increase(xdeepserve_instance_restarts_total[{RATE}]))"),
            ("scale-downs {{exported_instance}}",
             f"sum by (exported_instance) "
             f"(increase(xdeepserve_instance_scale_downs_total[{RATE}]))"),
        ]),
        ("Recomputed requests, rolled-back steps, retired KV blocks", "short", [
            ("recomputed", f"sum(increase(xdeepserve_requests_recomputed_total[{RATE}]))"),
            ("rollbacks", f"sum(increase(xdeepserve_step_rollbacks_total[{RATE}]))"),
            ("retired blocks", f"sum(increase(xdeepserve_kv_blocks_retired_total[{RATE}]))"),
        ]),
        ("Fault recovery time", "s", quantiles("xdeepserve_fault_recovery_seconds")),
    ]),
]


def dashboard():
    panels, panel_id, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"type": "row", "title": row_title, "id": panel_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        panel_id += 1
        y += 1
        for i, (title, unit, targets) in enumerate(row_panels):
            panels.append({
                "type": "timeseries",
                "title": title,
                "id": panel_id,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}},
                "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for k, (legend, expr) in enumerate(targets)],
            })
            panel_id += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "title": "xDeepServe",
        "uid": "xdeepserve",
        "tags": ["xdeepserve", "llm-serving"],
        "timezone": "browser",
        "schemaVersion": 38,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xdeepserve.json")
    text = json.dumps(dashboard(), indent=2) + "\n"
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        with open(out) as f:
            if f.read() != text:
                print(f"{out} is not what make_dashboard.py writes: run it", file=sys.stderr)
                return 1
        return 0
    with open(out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
