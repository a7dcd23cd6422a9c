#!/usr/bin/python3
"""The table of bench/spec/run.sh: per run (k drafts, MTP layers used) the batch-1 decode
tokens/s of generate (median over rounds and prompts) and its ratio to k = 0, the served
single-stream TPOT and output tokens/s, the server's acceptance by draft position and tokens
per verify step; then the teacher-forced agreement lines. Writes summary.json and summary.txt
in --dir."""
import argparse
import glob
import json
import os
import platform
import statistics


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", required=True)
    args = ap.parse_args()

    gen = {}
    path = os.path.join(args.dir, "generate.jsonl")
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            gen.setdefault(r["run"], []).append(r["decode_tokens_per_s"])
    runs = sorted(set(gen) | {os.path.basename(p)[len("served_"):-len(".json")]
                              for p in glob.glob(os.path.join(args.dir, "served_*.json"))})
    base = statistics.median(gen["k0"]) if "k0" in gen else None
    rows = []
    for run in runs:
        row = {"run": run}
        if run in gen:
            row["generate_tokens_per_s"] = statistics.median(gen[run])
            row["generate_range"] = [min(gen[run]), max(gen[run])]
            if base:
                row["generate_vs_k0"] = row["generate_tokens_per_s"] / base
        sp = os.path.join(args.dir, f"served_{run}.json")
        if os.path.exists(sp):
            j = json.load(open(sp))
            s = j["summary"]
            row["served_tpot_ms_p50"] = s["tpot_ms"]["p50"]
            row["served_output_tokens_per_s"] = s["output_token_throughput"]
            if "speculative" in j:
                row["acceptance"] = j["speculative"]["acceptance"]
                row["tokens_per_step"] = j["speculative"]["tokens_per_step"]
        rows.append(row)

    lines = [f"MTP speculative decoding, {args.model}, compute {args.dtype}, {cpu_name()}, "
             f"{os.cpu_count()} cores",
             f"{'run':<12} {'generate tok/s':>15} {'x k0':>6} {'served TPOT ms':>15} "
             f"{'served tok/s':>13} {'tokens/step':>12}  acceptance by position"]
    for r in rows:
        g = r.get("generate_tokens_per_s")
        lines.append(
            f"{r['run']:<12} {(f'{g:.1f}' if g else '-'):>15} "
            f"{(format(r['generate_vs_k0'], '.2f') if 'generate_vs_k0' in r else '-'):>6} "
            f"{(format(r['served_tpot_ms_p50'], '.3f') if 'served_tpot_ms_p50' in r else '-'):>15} "
            f"{(format(r['served_output_tokens_per_s'], '.1f') if 'served_output_tokens_per_s' in r else '-'):>13} "
            f"{(format(r['tokens_per_step'], '.3f') if 'tokens_per_step' in r else '-'):>12}  "
            + " ".join(f"{a:.3f}" for a in r.get("acceptance", [])))
    agreement = {}
    for p in sorted(glob.glob(os.path.join(args.dir, "agreement_*.txt"))):
        key = os.path.basename(p)[len("agreement_"):-len(".txt")]
        agreement[key] = [l.strip() for l in open(p) if "agree" in l.lower() or "draft" in l.lower()]
        lines.append(f"teacher-forced, {key}:")
        lines += [f"  {l}" for l in agreement[key]]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(os.path.join(args.dir, "summary.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(args.dir, "summary.json"), "w") as f:
        json.dump({"model": args.model, "compute_dtype": args.dtype, "cpu": cpu_name(),
                   "cores": os.cpu_count(), "runs": rows, "agreement": agreement}, f, indent=1)


if __name__ == "__main__":
    main()
