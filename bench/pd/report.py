#!/usr/bin/env python3
"""The prefill/decode disaggregation table from the JSON that bench/pd/run.sh wrote.

    report.py OUT_DIR

Reads OUT_DIR/{colo_short,colo_mix,pd_short,pd_mix}.json (`xdeepserve bench --json`, class 0 =
the short requests) and the servers' /metrics at the end of each run; prints the short
requests' TTFT and TPOT P50/P90/P99 per run, their goodput at TTFT P99 <= 2 s and TPOT P99 <=
150 ms, the target ratio (TPOT P99 of pd_mix / TPOT P99 without long prompts), and the KV moved;
writes OUT_DIR/summary.json. A missing file is a missing row.
"""
import json
import os
import re
import sys

RUNS = ["colo_short", "colo_mix", "pd_short", "pd_mix"]
TTFT_SLO_MS, TPOT_SLO_MS = 2000.0, 150.0


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        m = re.match(re.escape(name) + r"(\{[^}]*\})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    rows, summary = [], {}
    for run in RUNS:
        d = load(os.path.join(out, f"{run}.json"))
        if not d:
            continue
        classes = d.get("classes") or [d.get("summary") or {}]
        short = classes[0]
        ttft, tpot = short.get("ttft_ms", {}), short.get("tpot_ms", {})
        within = (ttft.get("p99", 1e18) <= TTFT_SLO_MS and tpot.get("p99", 1e18) <= TPOT_SLO_MS)
        goodput = short.get("request_throughput", 0.0) if within else 0.0
        s = {"requests": short.get("completed"), "failed": short.get("failed"),
             "ttft_ms": {k: ttft.get(k) for k in ("p50", "p90", "p99")},
             "tpot_ms": {k: tpot.get(k) for k in ("p50", "p90", "p99")},
             "goodput_rps": goodput}
        if len(classes) > 1:
            s["long_requests"] = classes[1].get("completed")
        try:
            with open(os.path.join(out, f"{run}_metrics.txt")) as f:
                text = f.read()
            s["kv_pulled_bytes"] = metric_sum(text, "xdeepserve_kv_pulled_bytes_total")
            s["kv_transfers"] = metric_sum(text, "xdeepserve_kv_transfers_completed_total")
        except OSError:
            pass
        summary[run] = s
        rows.append((run, s))
    print(f"{'run':<11} {'short req':>9} {'TTFT p50/p90/p99 ms':>26} {'TPOT p50/p90/p99 ms':>24} "
          f"{'goodput req/s':>13}")
    for run, s in rows:
        t, p = s["ttft_ms"], s["tpot_ms"]
        fmt3 = lambda v: "/".join(f"{x:.0f}" if x is not None else "-" for x in v)  # noqa: E731
        print(f"{run:<11} {s['requests'] or 0:>9} {fmt3([t['p50'], t['p90'], t['p99']]):>26} "
              f"{fmt3([p['p50'], p['p90'], p['p99']]):>24} {s['goodput_rps']:>13.3f}")
    base = [summary[r]["tpot_ms"]["p99"] for r in ("pd_short", "colo_short") if r in summary]
    if "pd_mix" in summary and base and base[0]:
        ratio = summary["pd_mix"]["tpot_ms"]["p99"] / base[0]
        summary["target_tpot_p99_ratio"] = ratio
        print(f"TPOT P99 with long prompts, disaggregated / without long prompts: {ratio:.2f} "
              f"(target <= 1.3)")
    if "colo_mix" in summary and "colo_short" in summary:
        r = summary["colo_mix"]["tpot_ms"]["p99"] / summary["colo_short"]["tpot_ms"]["p99"]
        summary["colocated_tpot_p99_ratio"] = r
        print(f"TPOT P99 with long prompts, colocated / without long prompts: {r:.2f}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
