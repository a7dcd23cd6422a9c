#!/usr/bin/env bash
# The KV transfer of P/D disaggregation on this machine, in one run: builds (Release,
# build/bench-xccl), then ROUNDS rounds (default 5), each running kv_transfer_bench (memcpy,
# shm link, UCX link over TCP loopback; see kv_transfer_bench.cc) and ucx_perftest's ucp_get
# (UCX_TLS=tcp, a server/client pair on 127.0.0.1) at the same message sizes. Prints the table
# of medians over rounds and writes bench-out/xccl/kv_transfer.{json,txt} (--save also copies
# them to bench/results/xccl/). The load average before and after goes into both.
#   bench/xccl/kv_transfer.sh [--quick] [--save] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/../.."
quick="" save=0 rounds=5
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=--quick ;;
    --save) save=1 ;;
    --rounds) rounds="$2"; shift ;;
    *) echo "usage: bench/xccl/kv_transfer.sh [--quick] [--save] [--rounds N] (unknown argument '$1')" >&2; exit 2 ;;
  esac
  shift
done
command -v ucx_perftest >/dev/null || { echo "ucx_perftest is missing (Debian: ucx-utils)" >&2; exit 2; }
build=build/bench-xccl
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target kv_transfer_bench >/dev/null
out=bench-out/xccl
mkdir -p "$out/perftest"
rm -f "$out/kv_transfer.jsonl" "$out"/perftest/*.txt
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
block=239616              # 16 tokens x 13 layers x (512 + 64) x 2 bytes
request=$((block * 256))  # 4096 tokens
if [ -n "$quick" ]; then n_block=50 n_request=2; else n_block=200 n_request=5; fi
# One ucx_perftest ucp_get run: server in the background, client prints the final numbers.
perftest() {  # SIZE ITERS WARMUP OUTFILE
  local port=$((20000 + RANDOM % 20000))
  UCX_TLS=tcp timeout 300 ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  UCX_TLS=tcp timeout 300 ucx_perftest 127.0.0.1 -p "$port" -t ucp_get -s "$1" -n "$2" -w "$3" -f \
    >"$4" 2>&1 || echo "ucx_perftest failed, see $4" >&2
  wait "$server" || true
}
for round in $(seq 1 "$rounds"); do
  "$build/bench/xccl/kv_transfer_bench" "$out/kv_transfer.jsonl" "$round" $quick
  perftest "$block" "$n_block" 20 "$out/perftest/r${round}_${block}.txt"
  perftest "$request" "$n_request" 1 "$out/perftest/r${round}_${request}.txt"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 bench/xccl/kv_transfer_report.py "$out/kv_transfer.jsonl" "$out/perftest" \
  "$out/kv_transfer.json" "$load_before" "$load_after" | tee "$out/kv_transfer.txt"
if [ "$save" = 1 ]; then
  mkdir -p bench/results/xccl
  cp "$out/kv_transfer.json" "$out/kv_transfer.txt" bench/results/xccl/
  echo "saved bench/results/xccl/kv_transfer.json and kv_transfer.txt"
fi
