#!/usr/bin/env bash
# Soak test: `xdeepserve serve` under 80 % of its measured capacity for an hour (Poisson
# arrivals, a third of the clients disconnecting mid-stream), sampling every process's RSS and
# fds, the shared memory they hold and the KV blocks in use; bench/soak/soak.py says what it
# measures and judges. Writes bench-out/soak/soak.json, soak.txt (the table and the verdict) and
# the server's log; exits 1 when a check fails.
#
#   bench/soak/run.sh [--xdeepserve BIN] [--model DIR] [--dp N] [--save] [soak.py flags...]
#
# --xdeepserve: default build/release/src/cli/xdeepserve (built elsewhere; this builds nothing)
# --model: default models/kjv-moe-tiny (its heldout.txt gives the prompts)
# --dp: DP groups, default 2 (the groups' shared-memory exchange and one output process each
#       exist only with more than one)
# --save: also copy soak.json and soak.txt into bench/results/soak/
# soak.py flags, e.g. --duration 600 (default 3600), --rate R (instead of 80 % of the probe's),
# --sample-every S, --warmup S; `/usr/bin/python3 bench/soak/soak.py --help` lists them.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common/serve_lib.sh

xds=build/release/src/cli/xdeepserve
model=models/kjv-moe-tiny
dp=2
save=0
pass=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --xdeepserve) xds="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --dp) dp="$2"; shift 2 ;;
    --save) save=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[[ -x $xds ]] || { echo "run.sh: $xds is not built" >&2; exit 1; }

out=bench-out/soak
mkdir -p "$out"
log="$out/server.log"
port=$(bench_free_port)
trap bench_stop_server EXIT
echo "serve: --model $model --dp $dp on 127.0.0.1:$port (log $log)"
"$xds" serve --model "$model" --dp "$dp" --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
server_pid=$!
bench_wait_healthy "$server_pid" "$port" "$log"

rc=0
/usr/bin/python3 bench/soak/soak.py --url "http://127.0.0.1:$port" --server-pid "$server_pid" \
  --server-log "$log" --prompts "$model/heldout.txt" --json "$out/soak.json" \
  --txt "$out/soak.txt" "${pass[@]}" || rc=$?
if [[ $save == 1 ]]; then
  mkdir -p bench/results/soak
  cp "$out/soak.json" "$out/soak.txt" bench/results/soak/
fi
exit "$rc"
