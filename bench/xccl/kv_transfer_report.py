#!/usr/bin/env python3
"""Table of the KV transfer bench: medians over rounds of kv_transfer_bench's JSON lines and of
ucx_perftest's ucp_get runs (files r<ROUND>_<SIZE>.txt), with the targets of P104:
shm >= 80% of memcpy, UCX-TCP within 20% of ucx_perftest at the same message size.

  kv_transfer_report.py BENCH.jsonl PERFTEST_DIR OUT.json LOAD_BEFORE LOAD_AFTER
"""
import json
import os
import statistics
import sys


def perftest_result(path):
    """(latency_us overall, bandwidth GB/s overall) from a ucx_perftest -f output, else None.

    The final line holds 8 numbers: iterations, latency p50 / average / overall (usec),
    bandwidth average / overall (MB/s, 2^20 bytes), message rate average / overall."""
    with open(path) as f:
        lines = f.read().splitlines()
    for line in reversed(lines):
        tokens = line.replace("Final:", "").split()
        try:
            values = [float(t) for t in tokens]
        except ValueError:
            continue
        if len(values) == 8:
            return values[3], values[5] * (1 << 20) / 1e9
    return None


def main():
    bench_path, perf_dir, out_path, load_before, load_after = sys.argv[1:6]
    rows = {}
    with open(bench_path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("bench") != "kv_transfer" or not r["ok"]:
                continue
            key = (r["case"], r["backend"])
            rows.setdefault(key, {"bytes_per_get": r["bytes_per_get"], "gets": r["gets"],
                                  "gbps": [], "latency_us": []})
            rows[key]["gbps"].append(r["gbps"])
            rows[key]["latency_us"].append(r["latency_us"])
    perf = {}
    for name in sorted(os.listdir(perf_dir)):
        if not name.endswith(".txt"):
            continue
        size = int(name[:-4].split("_")[1])
        got = perftest_result(os.path.join(perf_dir, name))
        if got is not None:
            perf.setdefault(size, {"gbps": [], "latency_us": []})
            perf[size]["latency_us"].append(got[0])
            perf[size]["gbps"].append(got[1])

    def med(v):
        return statistics.median(v) if v else float("nan")

    result = {"bench": "kv_transfer", "load_before": load_before, "load_after": load_after,
              "rows": [], "targets": {}}
    order = ["memcpy", "shm", "ucx", "ucx_seg64k"]
    print(f"KV transfer (block = 239,616 B; request = 256 blocks), medians over rounds; "
          f"load average {load_before} -> {load_after}")
    print(f"{'case':<15} {'backend':<13} {'bytes/get':>10} {'gets':>5} {'GB/s':>8} "
          f"{'us/transfer':>12} {'rounds':>6}")
    for case in ["block", "request", "request_blocks"]:
        for backend in order:
            r = rows.get((case, backend))
            if r is None:
                continue
            row = {"case": case, "backend": backend, "bytes_per_get": r["bytes_per_get"],
                   "gets": r["gets"], "gbps": med(r["gbps"]),
                   "latency_us": med(r["latency_us"]), "rounds": len(r["gbps"])}
            result["rows"].append(row)
            print(f"{case:<15} {backend:<13} {row['bytes_per_get']:>10} {row['gets']:>5} "
                  f"{row['gbps']:>8.3f} {row['latency_us']:>12.1f} {row['rounds']:>6}")
        size = rows.get((case, "ucx"), {}).get("bytes_per_get")
        if case != "request_blocks" and size in perf:
            p = perf[size]
            row = {"case": case, "backend": "ucx_perftest", "bytes_per_get": size, "gets": 1,
                   "gbps": med(p["gbps"]), "latency_us": med(p["latency_us"]),
                   "rounds": len(p["gbps"])}
            result["rows"].append(row)
            print(f"{case:<15} {'ucx_perftest':<13} {size:>10} {'':>5} {row['gbps']:>8.3f} "
                  f"{row['latency_us']:>12.1f} {row['rounds']:>6}")
    by = {(r["case"], r["backend"]): r for r in result["rows"]}
    print("targets:")
    for case in ["block", "request", "request_blocks"]:
        if (case, "shm") in by and (case, "memcpy") in by:
            ratio = by[(case, "shm")]["gbps"] / by[(case, "memcpy")]["gbps"]
            result["targets"][f"shm/memcpy {case}"] = ratio
            print(f"  shm / memcpy       {case:<15} {ratio:6.2f}  (target >= 0.80: "
                  f"{'met' if ratio >= 0.8 else 'MISSED'})")
        if (case, "ucx") in by and (case, "ucx_perftest") in by:
            ratio = by[(case, "ucx")]["gbps"] / by[(case, "ucx_perftest")]["gbps"]
            result["targets"][f"ucx/ucx_perftest {case}"] = ratio
            print(f"  ucx / ucx_perftest {case:<15} {ratio:6.2f}  (target >= 0.80: "
                  f"{'met' if ratio >= 0.8 else 'MISSED'})")
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
