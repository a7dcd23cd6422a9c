#!/usr/bin/env bash
# Decode and prefill on a machine another process shares: bench_decode on each model quiet,
# then again while `stress-ng --cpu 1` (nice 0) keeps one core busy, alternated model by
# model and round by round; prints per model and row the quiet and loaded tokens/s (medians
# over rounds) and loaded ÷ quiet, and writes them as JSON.
#
#   bench/decode/loaded.sh [--rounds R] [--bench BENCH_DECODE] [--out DIR] MODEL_DIR...
#
# Rows: prefill of 128 tokens and decode at batches 1, 4 and 16 (context 256), bf16 compute.
# Needs stress-ng (tools/install_deps.sh). Writes DIR/loaded-<model>-<quiet|loaded>-<r>.json,
# DIR/loaded.json and the table in DIR/loaded.md [bench-out/loaded].
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rounds=2
bench=$root/build/release/bench/decode/bench_decode
out=$root/bench-out/loaded
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: loaded.sh [--rounds R] [--bench B] [--out DIR] MODEL_DIR..." >&2; exit 2; }
command -v stress-ng >/dev/null || { echo "loaded.sh: stress-ng is missing (tools/install_deps.sh)" >&2; exit 2; }
mkdir -p "$out"
stress_pid=""
trap '[[ -n $stress_pid ]] && kill "$stress_pid" 2>/dev/null; true' EXIT
run() {  # run MODEL MODE ROUND
  "$bench" --model "$1" --compute-dtype bf16 --prompt 128 --context 256 --batches 1,4,16 \
    --steps 8 --json "$out/loaded-$(basename "$1")-$2-$3.json" > "$out/loaded-$(basename "$1")-$2-$3.log" 2>&1
}
: > "$out/load.txt"
for r in $(seq 1 "$rounds"); do
  for m in "$@"; do
    echo "round $r $(basename "$m") quiet: $(uptime)" | tee -a "$out/load.txt"
    run "$m" quiet "$r"
    stress-ng --cpu 1 --quiet & stress_pid=$!
    sleep 1
    echo "round $r $(basename "$m") loaded: $(uptime)" | tee -a "$out/load.txt"
    run "$m" loaded "$r"
    kill "$stress_pid"; wait "$stress_pid" 2>/dev/null || true; stress_pid=""
  done
done
/usr/bin/python3 - "$out" "$@" <<'PY'
import glob, json, os, statistics, sys
out, models = sys.argv[1], [os.path.basename(m.rstrip("/")) for m in sys.argv[2:]]
def rows(path):
    r = {}
    for x in json.load(open(path))["rows"]:
        r["prefill" if x["phase"] == "prefill" else f"decode_b{x['batch']}"] = x["tokens_per_s"]
    return r
keys = ["prefill", "decode_b1", "decode_b4", "decode_b16"]
result, lines = {}, ["| model | row | quiet tok/s | loaded tok/s | loaded ÷ quiet |", "| --- | --- | --- | --- | --- |"]
for m in models:
    runs = {mode: [rows(p) for p in sorted(glob.glob(f"{out}/loaded-{m}-{mode}-*.json"))] for mode in ("quiet", "loaded")}
    for k in keys:
        q = [r[k] for r in runs["quiet"] if k in r]; l = [r[k] for r in runs["loaded"] if k in r]
        if not q or not l: continue
        qm, lm = statistics.median(q), statistics.median(l)
        result.setdefault(m, {})[k] = {"quiet": q, "loaded": l, "ratio": lm / qm}
        lines.append(f"| {m} | {k} | {qm:.1f} | {lm:.1f} | {lm / qm:.2f} |")
json.dump(result, open(f"{out}/loaded.json", "w"), indent=1)
open(f"{out}/loaded.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
