#!/usr/bin/env python3
"""Folds bench/peers/serve_compare.sh's runs into one table (markdown on stdout) and
OUT/serve.json: per engine and scenario, the range over rounds of TTFT mean / P50, TPOT mean
and output tokens/s; and the ratio of our single-stream TPOT to our bench_decode batch-1
step in the same round.

    serve_summarize.py OUT
"""
import glob
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        j = json.load(f)
    return j.get("summary", j)


def span(values, fmt):
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def main():
    out = sys.argv[1]
    runs = {}  # (engine, scenario) -> [summary per round]
    for path in sorted(glob.glob(os.path.join(out, "*-*-*.json"))):
        m = re.fullmatch(r"(ours|peer)-(single|conc8)-(\d+)\.json", os.path.basename(path))
        if m:
            runs.setdefault((m[1], m[2]), []).append((int(m[3]), load(path)))
    step_ms = {}  # round -> our bench_decode batch-1 step, ms
    for path in glob.glob(os.path.join(out, "ours-bench_decode-*.json")):
        r = int(re.search(r"-(\d+)\.json$", path)[1])
        with open(path) as f:
            rows = json.load(f)["rows"]
        steps = [x["step_ms"] for x in rows if x["phase"] == "decode" and x["batch"] == 1]
        if steps:
            step_ms[r] = sorted(steps)[len(steps) // 2]

    table = ["| scenario | engine | TTFT mean ms | TTFT P50 ms | TPOT mean ms | output tok/s | failed |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    result = {}
    for scenario in ("single", "conc8"):
        for engine in ("ours", "peer"):
            rs = [s for _, s in sorted(runs.get((engine, scenario), []))]
            if not rs:
                continue
            col = lambda k, f: [s[k][f] for s in rs]
            result[f"{engine}-{scenario}"] = rs
            table.append(
                f"| {scenario} | {engine} | {span(col('ttft_ms', 'mean'), '{:.0f}')} | "
                f"{span(col('ttft_ms', 'p50'), '{:.0f}')} | {span(col('tpot_ms', 'mean'), '{:.1f}')} | "
                f"{span([s['output_token_throughput'] for s in rs], '{:.1f}')} | "
                f"{sum(s['failed'] for s in rs)} |")
    ratios = []
    for r, s in runs.get(("ours", "single"), []):
        if r in step_ms:
            ratios.append(step_ms[r] / s["tpot_ms"]["mean"])
    result["bench_decode_b1_step_ms"] = step_ms
    result["single_tpot_vs_bench_decode"] = ratios
    print("\n".join(table))
    if ratios:
        print(f"\nour bench_decode batch-1 step / our served single-stream TPOT: {span(ratios, '{:.2f}')}")
    with open(os.path.join(out, "serve.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
