#!/usr/bin/env bash
# Prefill/decode disaggregation against colocation at equal cores, same run, side by side.
# bench-2.6b made with a 16K context (mkmodel --max-position-embeddings 16384), bf16:
#   colo_short  `serve --dp 2`, short requests only (256 in, 128 out, Poisson 0.5/s)
#   colo_mix    the same plus long prompts (4096-8192 in, 32 out) one per 120 s
#   pd_short    `serve --prefill-instances 1 --decode-instances 1` (one device each), short only
#   pd_mix      the same with the long prompts
# Each run's short requests: TTFT and TPOT P50/P90/P99 and the share within TTFT <= 2 s and
# TPOT <= 150 ms (goodput: that share x their rate). Writes bench-out/pd/*.json, the servers'
# logs, then prints bench/pd/report.py's table (bench-out/pd/summary.json).
#
#   bench/pd/run.sh [--model DIR] [--duration S] [--runs colo_short,colo_mix,pd_short,pd_mix]
#                   [--build DIR] [--no-build] [--smoke]
# --smoke: the tiny model and runs of seconds (checks the script, measures nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common/serve_lib.sh

model=""
duration=240
runs="colo_short,colo_mix,pd_short,pd_mix"
build=build/bench-pd
do_build=1
smoke=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --smoke) smoke=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done

out=bench-out/pd
mkdir -p "$out"
if [[ $smoke == 1 ]]; then
  : "${model:=models/kjv-moe-tiny}"
  short="rate=2,in=32,out=16"; long="period=4,start=1,in=300-400,out=8"
  duration=10; kv_memory=64M; id_lo=1; id_hi=4000; dtype=f32
else
  : "${model:=bench-out/models/bench-2.6b-16k}"
  short="rate=0.5,in=256,out=128"; long="period=120,start=20,in=4096-8192,out=32"
  kv_memory=3G; id_lo=1000; id_hi=30000; dtype=bf16
fi

if [[ $do_build == 1 ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target xdeepserve >/dev/null
fi
xds="$build/src/cli/xdeepserve"
[[ -x $xds ]] || { echo "run.sh: $xds is not built" >&2; exit 1; }
if [[ ! -f $model/config.json ]]; then
  echo "making $model (bench-2.6b, 16K positions)"
  "$xds" mkmodel --out "$model" --preset bench-2.6b --max-position-embeddings 16384
fi

port=""
trap bench_stop_server EXIT

# start_server NAME [serve flags...]: on a free port; waits for /health (up to 15 min).
start_server() {
  local name=$1
  shift
  port=$(bench_free_port)
  local iport
  iport=$(bench_free_port)
  local log="$out/server_${name}.log"
  echo "serve ($name): $*  (log $log)"
  "$xds" serve --model "$model" --compute-dtype "$dtype" --host 127.0.0.1 --port "$port" \
    --instance-port "$iport" --kv-memory "$kv_memory" --max-num-batched-tokens 512 \
    --threads-per-device 1 "$@" >"$log" 2>&1 &
  server_pid=$!
  bench_wait_healthy "$server_pid" "$port" "$log" || { server_pid=""; return 1; }
}

bench() {
  "$xds" bench --url "http://127.0.0.1:$port" --token-ids "$id_lo,$id_hi" --seed 1 \
    --duration "$duration" --ignore-eos "$@"
}

want() { [[ ",$runs," == *",$1,"* ]]; }
for run in colo_short colo_mix pd_short pd_mix; do
  want "$run" || continue
  case "$run" in
    colo_*) start_server "$run" --dp 2 ;;
    pd_*) start_server "$run" --prefill-instances 1 --decode-instances 1 --dp 1 ;;
  esac
  case "$run" in
    *_short) bench --mix "$short" --json "$out/$run.json" ;;
    *_mix) bench --mix "$short;$long" --json "$out/$run.json" ;;
  esac
  curl -sf "http://127.0.0.1:$port/metrics" >"$out/${run}_metrics.txt" || true
  bench_stop_server
done

/usr/bin/python3 bench/pd/report.py "$out"
