#!/usr/bin/python3
"""What a KV link fault costs a client under prefill/decode disaggregation (P116, P120).

Starts `xdeepserve serve --prefill-instances 1 --decode-instances 1 --fault-injection` on MODEL
and, per row, posts the fault (none for the first row), then runs N concurrent streamed greedy
completions. A link fault strikes the handoff between a request's first token (the prefill
instance's) and its second (the decode instance's, after the KV pull), so the figure is that
gap per stream (median and max), beside the fault-free row's:
  - link_delay: the prefill group's links hold their transfers but answer probes for
    --delay-ms: the decode side waits (saturated, not failed), then pulls;
  - link_drop: they answer nothing for --drop-ms: the decode side's probe goes unanswered
    (500 ms), the link is failed and the request recomputed on the decode group;
  - kv_corrupt: the decode group's next pull lands with one block corrupted: the checksum
    catches it, the block is retired and that request recomputed (one stream of N).
The decode side's counters moved meanwhile (saturated probes, links failed, checksum
mismatches, handoffs recomputed, blocks retired) and the streams that ended otherwise than
"length" are reported. Prints a table and writes JSON (--out).

    bench/faults/pd_fault_bench.py --xdeepserve build/release/src/cli/xdeepserve \\
        --model models/kjv-moe-tiny [--streams 8] [--max-tokens 32] [--out F.json] [-- FLAGS]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_bench import Stream, free_port, http, metric, prompt, start_serve, stop_serve  # noqa: E402,E501

COUNTERS = {"saturated": "xdeepserve_kv_probes_saturated_total",
            "links_failed": "xdeepserve_kv_links_failed_total",
            "mismatches": "xdeepserve_kv_checksum_mismatches_total",
            "recomputed": "xdeepserve_kv_handoffs_recomputed_total",
            "retired": "xdeepserve_kv_blocks_retired_total"}


def measure(base, name, fault, streams_n, max_tokens, ids):
    before = http("GET", base + "/metrics")[1]
    if fault:
        status, body = http("POST", base + "/admin/faults", fault)
        if status != 202:
            sys.exit(f"{name}: POST /admin/faults {fault}: {status} {body}")
    streams = [Stream(base, prompt(i, ids), max_tokens) for i in range(streams_n)]
    for s in streams:
        s.join()
    time.sleep(1.5)  # the groups' load reports reach the gateway
    after = http("GET", base + "/metrics")[1]
    gaps = sorted(s.times[1] - s.times[0] for s in streams if len(s.times) >= 2)
    row = {"fault": name, "gap_median_s": statistics.median(gaps) if gaps else None,
           "gap_max_s": gaps[-1] if gaps else None,
           "unfinished": sum(1 for s in streams if s.finish != "length")}
    for key, m in COUNTERS.items():
        row[key] = int(metric(after, m) - metric(before, m))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--delay-ms", type=int, default=1000)
    ap.add_argument("--drop-ms", type=int, default=3000)
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*", help="more serve flags (after --)")
    a = ap.parse_args()
    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [a.xdeepserve, "serve", "--model", a.model, "--port", str(port), "--instance-port",
            str(iport), "--prefill-instances", "1", "--decode-instances", "1",
            "--fault-injection", "--kv-transfer-timeout", "5"] + a.extra
    ids = not os.path.exists(os.path.join(a.model, "tokenizer.json"))
    server, _ = start_serve(argv, base)
    rows = []
    try:
        plan = [("none", None), ("none (again)", None),
                (f"link_delay {a.delay_ms} ms",
                 {"kind": "link_delay", "instance": 0, "duration_ms": a.delay_ms}),
                (f"link_drop {a.drop_ms} ms",
                 {"kind": "link_drop", "instance": 0, "duration_ms": a.drop_ms}),
                ("kv_corrupt (1 block)", {"kind": "kv_corrupt", "instance": 1, "blocks": 1})]
        for name, fault in plan:
            rows.append(measure(base, name, fault, a.streams, a.max_tokens, ids))
            print(json.dumps(rows[-1]), flush=True)
            if fault and fault["kind"] in ("link_delay", "link_drop"):
                time.sleep(fault["duration_ms"] / 1000)  # the fault runs out
    finally:
        stop_serve(server)
    load = os.getloadavg()[0]
    print(f"model {a.model}, 1 prefill + 1 decode instance, {a.streams} streams x "
          f"{a.max_tokens} tokens; load average {load:.2f}")
    print("| fault | 1st->2nd token median s | max s | saturated | links failed | "
          "checksum mismatches | recomputed | blocks retired | unfinished |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        med = "-" if r["gap_median_s"] is None else f"{r['gap_median_s']:.3f}"
        mx = "-" if r["gap_max_s"] is None else f"{r['gap_max_s']:.3f}"
        print(f"| {r['fault']} | {med} | {mx} | {r['saturated']} | {r['links_failed']} | "
              f"{r['mismatches']} | {r['recomputed']} | {r['retired']} | {r['unfinished']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "streams": a.streams, "max_tokens": a.max_tokens,
                       "load_average": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
