#!/usr/bin/env bash
# Our server beside the peer's (ik_llama.cpp's llama-server) on bench-2.6b's shape, both driven
# by `xdeepserve bench` with token-id prompts, one server at a time, alternated round by round:
#   single  one stream, 128 prompt tokens, 128 output tokens (8 requests): TTFT and TPOT
#   conc8   8 concurrent streams, 256 in, 64 out (24 requests): output tokens/s, TTFT, TPOT
# and, each round, our bench_decode's batch-1 step on the same model (the served stream's
# runtime cost: TPOT / bench_decode's step).
#
#   bench/peers/serve_compare.sh OUR_MODEL PEER_GGUF [ROUNDS]
#
# OUR_MODEL is one of our checkpoints (bf16, W8A8 or W4: `mkmodel --from bench-2.6b
# --weights-int8 | --weights-int4 ...`); PEER_GGUF the peer's GGUF of the same shape and bit
# width (run.sh writes them; 4-bit ones with PEER_TYPES=iq4_k etc.). Both vocabularies are
# 32,000 placeholder tokens, and prompts are random ids in [256, 32000), so neither side
# tokenizes. Requests ask for exactly max_tokens tokens (ignore_eos).
#
# Environment (defaults in brackets):
#   XDS          our xdeepserve [build/release/src/cli/xdeepserve]
#   OUR_BENCH    our bench_decode [build/release/bench/decode/bench_decode]
#   PEER_BUILD   the peer's build directory (bench/peers/build_peer.sh) [bench-out/peers/build]
#   THREADS      the peer's threads [nproc]; our server uses every core
#   PEER_RTR     1: the peer repacks at load (-rtr) [1]
#   COMPUTE      our --compute-dtype [bf16]
#   OUT          where the runs go [bench-out/peers/serve]
# Each run writes OUT/<engine>-<scenario>-<round>.json; serve_summarize.py prints the table
# and writes OUT/serve.json.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/common/serve_lib.sh"
our_model=$(cd "${1:?OUR_MODEL}" && pwd)
peer_gguf=${2:?PEER_GGUF}
rounds=${3:-2}
xds=${XDS:-$root/build/release/src/cli/xdeepserve}
our_bench=${OUR_BENCH:-$root/build/release/bench/decode/bench_decode}
peer_build=${PEER_BUILD:-$root/bench-out/peers/build}
threads=${THREADS:-$(nproc)}
compute=${COMPUTE:-bf16}
out=${OUT:-$root/bench-out/peers/serve}
peer_server=$peer_build/bin/llama-server
[[ -x $peer_server ]] || { echo "no $peer_server: run bench/peers/build_peer.sh" >&2; exit 2; }
[[ -f $peer_gguf ]] || { echo "no $peer_gguf" >&2; exit 2; }
mkdir -p "$out"
trap bench_stop_server EXIT

start_ours() {
  port=$(bench_free_port)
  "$xds" serve --model "$our_model" --dp 1 --compute-dtype "$compute" --host 127.0.0.1 \
    --port "$port" --served-model-name bench >"$out/server-ours-$1.log" 2>&1 &
  server_pid=$!
  bench_wait_healthy "$server_pid" "$port" "$out/server-ours-$1.log"
}
start_peer() {
  port=$(bench_free_port)
  local rtr=(); [[ ${PEER_RTR:-1} == 1 ]] && rtr=(-rtr)
  # 8 slots of 512 tokens each (-c is the total), MLA 3 with flash attention, fused MoE (its
  # default), the fastest CPU settings for DeepSeek.
  "$peer_server" -m "$peer_gguf" -np 8 -c 4096 -t "$threads" -mla 3 -fa on "${rtr[@]}" \
    --host 127.0.0.1 --port "$port" -a bench >"$out/server-peer-$1.log" 2>&1 &
  server_pid=$!
  bench_wait_healthy "$server_pid" "$port" "$out/server-peer-$1.log"
}
drive() {  # drive ENGINE ROUND
  local common=(--url "http://127.0.0.1:$port" --model bench --token-ids 256,32000 --seed 1
                --ignore-eos --no-progress)
  "$xds" bench "${common[@]}" --concurrency 1 --num-requests 8 --input-len 128 \
    --output-len 128 --json "$out/$1-single-$2.json" >"$out/$1-single-$2.txt"
  "$xds" bench "${common[@]}" --concurrency 8 --num-requests 24 --input-len 256 \
    --output-len 64 --json "$out/$1-conc8-$2.json" >"$out/$1-conc8-$2.txt"
}

: > "$out/load.txt"
for r in $(seq 1 "$rounds"); do
  echo "round $r start: $(uptime)" | tee -a "$out/load.txt"
  "$our_bench" --model "$our_model" --compute-dtype "$compute" --batches 1 --prompt 128 \
    --context 192 --steps 16 --json "$out/ours-bench_decode-$r.json" >"$out/ours-bench_decode-$r.log" 2>&1
  start_ours "$r"; drive ours "$r"; bench_stop_server
  start_peer "$r"; drive peer "$r"; bench_stop_server
  echo "round $r end: $(uptime)" | tee -a "$out/load.txt"
done
/usr/bin/python3 "$here/serve_summarize.py" "$out" | tee "$out/table.md"
