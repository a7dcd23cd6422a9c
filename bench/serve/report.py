#!/usr/bin/env python3
"""The serving targets' table from the JSON that bench/serve/run.sh wrote.

    report.py OUT_DIR [--dtype f32]

Reads OUT_DIR/{single,peak16,peak64,chunked_mix,chunked_short,chunked_off,goodput}_dp*_DTYPE.json,
bench_decode_DTYPE.json and generate_DTYPE.txt; prints one row per figure with its target and
writes OUT_DIR/summary.json. A missing file is a missing row, not an error.
"""
import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def dps_of(out, dtype):
    found = set()
    for p in glob.glob(os.path.join(out, f"*_dp*_{dtype}.json")):
        m = re.search(r"_dp(\d+)_", os.path.basename(p))
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    out = args[0]
    dtype = "f32"
    if "--dtype" in args:
        dtype = args[args.index("--dtype") + 1]
    rows = []

    def row(scenario, dp, figure, value, reference=None, ratio=None, target="", ok=None):
        rows.append({"scenario": scenario, "dp": dp, "compute_dtype": dtype, "figure": figure,
                     "value": value, "reference": reference, "ratio": ratio, "target": target,
                     "meets": ok})

    generate_tps = None
    try:
        with open(os.path.join(out, f"generate_{dtype}.txt")) as f:
            m = re.search(r"decode: \d+ tokens in [\d.]+ s \(([\d.]+) tokens/s\)", f.read())
            if m:
                generate_tps = float(m.group(1))
    except OSError:
        pass
    bench_decode = {}
    bd = load(os.path.join(out, f"bench_decode_{dtype}.json"))
    if bd:
        for r in bd.get("rows", []):
            if r.get("phase") == "decode":
                bench_decode.setdefault(r["batch"], []).append(r["tokens_per_s"])
    bench_decode = {b: sorted(v)[len(v) // 2] for b, v in bench_decode.items()}  # median

    for dp in dps_of(out, dtype):
        t = f"dp{dp}_{dtype}"
        s = load(os.path.join(out, f"single_{t}.json"))
        if s and "peak_decode" in s and s["peak_decode"].get("valid"):
            v = s["peak_decode"]["tokens_per_s"]
            ratio = v / generate_tps if generate_tps else None
            row("single-stream decode", dp, "HTTP decode tokens/s", v, generate_tps, ratio,
                ">= 0.95 x generate", ratio >= 0.95 if ratio else None)
        for b in (16, 64, 2, 4):
            p = load(os.path.join(out, f"peak{b}_{t}.json"))
            if not (p and "peak_decode" in p and p["peak_decode"].get("valid")):
                continue
            pd = p["peak_decode"]
            ref = bench_decode.get(b)
            ratio = pd["tokens_per_s"] / ref if ref else None
            row(f"peak decode, {b} streams", dp, "decode tokens/s (all devices)",
                pd["tokens_per_s"], ref, ratio, ">= 0.90 x bench_decode (dp 1)",
                (ratio >= 0.90 if ratio else None) if dp == 1 else None)
            row(f"peak decode, {b} streams", dp, "decode tokens/s per device",
                pd["tokens_per_s_per_device"])
            row(f"peak decode, {b} streams", dp, "TPOT ms", pd["tpot_ms"])
        mix = load(os.path.join(out, f"chunked_mix_{t}.json"))
        short = load(os.path.join(out, f"chunked_short_{t}.json"))
        off = load(os.path.join(out, f"chunked_off_{t}.json"))
        base = short["summary"]["itl_ms"]["p99"] if short and "summary" in short else None
        for name, run in (("chunking on", mix), ("chunking off", off)):
            if not (run and run.get("classes")):
                continue
            short_cls, long_cls = run["classes"][0], run["classes"][-1]
            v = short_cls["itl_ms"]["p99"]
            ratio = v / base if base else None
            row(f"chunked prefill mix, {name}", dp, "short ITL P99 ms", v, base, ratio,
                "<= 2 x without long prompts" if name == "chunking on" else "(shows the stall)",
                (ratio <= 2.0 if ratio else None) if name == "chunking on" else None)
            row(f"chunked prefill mix, {name}", dp, "short TTFT P99 ms", short_cls["ttft_ms"]["p99"])
            row(f"chunked prefill mix, {name}", dp, "long TTFT P99 ms", long_cls["ttft_ms"]["p99"])
        if base is not None:
            row("chunked prefill, short only", dp, "short ITL P99 ms", base)
            row("chunked prefill, short only", dp, "short TTFT P99 ms",
                short["summary"]["ttft_ms"]["p99"])
        g = load(os.path.join(out, f"goodput_{t}.json"))
        if g and "goodput" in g:
            row("goodput", dp, "req/s, TTFT P99 <= 2 s and TPOT P99 <= 150 ms",
                g["goodput"].get("rate_p99"))
            row("goodput", dp, "req/s, >= 90% within TTFT <= 2 s and TPOT <= 150 ms",
                g["goodput"].get("rate"))

    def fmt(x):
        if x is None:
            return "-"
        if isinstance(x, float):
            return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"
        return str(x)

    print(f"\n{'scenario':<34} {'dp':>3} {'figure':<48} {'value':>10} {'reference':>10} "
          f"{'ratio':>7}  target")
    for r in rows:
        mark = "" if r["meets"] is None else (" ok" if r["meets"] else " SHORT")
        print(f"{r['scenario']:<34} {r['dp']:>3} {r['figure']:<48} {fmt(r['value']):>10} "
              f"{fmt(r['reference']):>10} {fmt(r['ratio']):>7}  {r['target']}{mark}")
    summary = os.path.join(out, "summary.json")
    with open(summary + ".tmp", "w") as f:
        json.dump({"compute_dtype": dtype, "rows": rows}, f, indent=2)
    os.replace(summary + ".tmp", summary)
    print(f"wrote {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
