#!/usr/bin/env bash
# The serving targets, measured through HTTP with `xdeepserve bench` against `xdeepserve serve`
# on bench-2.6b (made with mkmodel when missing):
#   single   single-stream decode tokens/s through HTTP vs `xdeepserve generate`
#   peak     `bench --peak-decode` at 16 and 64 streams (context ~512, bench_decode's) vs
#            bench_decode at the same batches
#   chunked  short requests (128 in, 64 out) at 1/s plus one 3,900-token prompt every 60 s with
#            --max-num-batched-tokens 256; the same without the long prompts; the mix again
#            with chunking off (--no-chunked-prefill)
#   goodput  a Poisson rate sweep; goodput at TTFT P99 <= 2 s and TPOT P99 <= 150 ms (and the
#            rate at which >= 90% of requests meet both)
# Writes bench-out/serve/*.json (one per run, named by scenario, --dp and dtype), the servers'
# logs, then prints the table of bench/serve/report.py and writes bench-out/serve/summary.json.
#
#   bench/serve/run.sh [--dp 1[,2]] [--compute-dtype f32|bf16] [--scenarios single,peak,chunked,goodput]
#                      [--model DIR] [--build DIR] [--no-build] [--chunked-duration S]
#                      [--goodput-rates R1,R2,...] [--goodput-duration S] [--smoke]
# --smoke: the tiny preset and runs of seconds (checks the script, measures nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common/serve_lib.sh

dps="1"
dtype="f32"
scenarios="single,peak,chunked,goodput"
model=""
build="build/bench-serve"
do_build=1
chunked_duration=300
goodput_rates="0.25,0.5,1,2,3"
goodput_duration=120
smoke=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dp) dps="$2"; shift 2 ;;
    --compute-dtype) dtype="$2"; shift 2 ;;
    --scenarios) scenarios="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --chunked-duration) chunked_duration="$2"; shift 2 ;;
    --goodput-rates) goodput_rates="$2"; shift 2 ;;
    --goodput-duration) goodput_duration="$2"; shift 2 ;;
    --smoke) smoke=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done

out=bench-out/serve
mkdir -p "$out"

# Sizes of every scenario; --smoke shrinks them to fit the tiny model (512 positions).
if [[ $smoke == 1 ]]; then
  preset=tiny
  single_in=32; single_out=24
  peak_streams="2 4"; peak_in=64; peak_out=16; peak_context=64
  short_in=32; short_out=8; long_in=400; long_out=8; long_period=5; chunked_duration=12
  goodput_rates="1,2"; goodput_duration=5; goodput_in=32-64; goodput_out=8-16
  batched_tokens=64
  kv_memory=256M
  id_lo=1; id_hi=500
else
  preset=bench-2.6b
  single_in=128; single_out=256
  peak_streams="16 64"; peak_in=448; peak_out=128; peak_context=512
  short_in=128; short_out=64; long_in=3900; long_out=32; long_period=60
  goodput_in=128-512; goodput_out=64-256
  batched_tokens=256
  id_lo=1000; id_hi=30000  # token-id prompts: bench-2.6b has no tokenizer (vocabulary 32000)
  kv_memory=2G  # 64 streams x 576 positions x 27.6 KB (12 layers x 576 f32) = 1.0 GB, and room
fi
: "${model:=bench-out/models/$preset}"

if [[ $do_build == 1 ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target xdeepserve bench_decode >/dev/null
fi
xds="$build/src/cli/xdeepserve"
bench_decode="$build/bench/decode/bench_decode"
[[ -x $xds ]] || { echo "run.sh: $xds is not built" >&2; exit 1; }

if [[ ! -f $model/config.json ]]; then
  mk=("$xds" mkmodel --out "$model" --preset "$preset")
  if "$xds" mkmodel --help 2>&1 | grep -q -- --max-position-embeddings; then
    mk+=(--max-position-embeddings 8192)
  fi
  echo "making $model: ${mk[*]}"
  "${mk[@]}"
fi

serve_help=$("$xds" serve --help 2>&1 || true)
has_serve_flag() { grep -q -- "$1" <<<"$serve_help"; }

port=""
trap bench_stop_server EXIT

# start_server NAME DP [serve flags...]: on a free port, waits for /health (up to 15 min: a
# cold page cache reads the weights from disk).
start_server() {
  local name=$1 dp=$2
  shift 2
  port=$(bench_free_port)
  local log="$out/server_${name}.log"
  echo "serve ($name): --dp $dp --compute-dtype $dtype $*  (log $log)"
  "$xds" serve --model "$model" --dp "$dp" --compute-dtype "$dtype" --host 127.0.0.1 \
    --port "$port" "$@" >"$log" 2>&1 &
  server_pid=$!
  bench_wait_healthy "$server_pid" "$port" "$log" || { server_pid=""; return 1; }
}

bench() {
  "$xds" bench --url "http://127.0.0.1:$port" --token-ids "$id_lo,$id_hi" --seed 1 "$@"
}

tag() { echo "dp$1_$dtype"; }
want() { [[ ",$scenarios," == *",$1,"* ]]; }

# bench_decode once per dtype (it does not depend on --dp).
if want peak; then
  batches=$(tr ' ' ',' <<<"$peak_streams")
  echo "bench_decode --batches $batches --context $peak_context --compute-dtype $dtype"
  "$bench_decode" --model "$model" --context "$peak_context" --batches "$batches" \
    --compute-dtype "$dtype" --json "$out/bench_decode_$dtype.json" >"$out/bench_decode_$dtype.txt" 2>&1
fi
if want single; then
  prompt_ids=$(seq -s, "$id_lo" $((id_lo + single_in - 1)))
  echo "generate --max-tokens $single_out"
  if ! "$xds" generate --model "$model" --prompt-ids "$prompt_ids" --max-tokens "$single_out" \
    --ignore-eos --compute-dtype "$dtype" >/dev/null 2>"$out/generate_$dtype.txt"; then
    echo "run.sh: generate failed:" >&2
    tail -n 5 "$out/generate_$dtype.txt" >&2
    exit 1
  fi
  grep -o 'decode: .*' "$out/generate_$dtype.txt" || true
fi

for dp in ${dps//,/ }; do
  t=$(tag "$dp")
  max_seqs=64
  for b in $peak_streams; do
    if [[ $b -gt $max_seqs ]]; then max_seqs=$b; fi
  done
  if want single || want peak || want goodput; then
    start_server "$t" "$dp" --max-num-seqs "$max_seqs" --kv-memory "$kv_memory"
    if want single; then
      bench --peak-decode --streams 1 --input-len "$single_in" --output-len "$single_out" \
        --json "$out/single_$t.json" --no-progress
    fi
    if want peak; then
      for b in $peak_streams; do
        bench --peak-decode --streams "$b" --devices "$dp" --input-len "$peak_in" \
          --output-len "$peak_out" --json "$out/peak${b}_$t.json" --no-progress
      done
    fi
    if want goodput; then
      bench --sweep-rates "$goodput_rates" --duration "$goodput_duration" \
        --input-len-dist "$goodput_in" --output-len-dist "$goodput_out" --ignore-eos \
        --goodput-ttft-ms 2000 --goodput-tpot-ms 150 --json "$out/goodput_$t.json"
    fi
    bench_stop_server
  fi
  if want chunked; then
    mix="rate=1,in=$short_in,out=$short_out;period=$long_period,start=$((long_period / 6)),in=$long_in,out=$long_out"
    start_server "chunked_on_$t" "$dp" --max-num-batched-tokens "$batched_tokens" --kv-memory "$kv_memory"
    bench --mix "$mix" --duration "$chunked_duration" --ignore-eos --json "$out/chunked_mix_$t.json"
    bench --request-rate 1 --input-len "$short_in" --output-len "$short_out" \
      --duration "$chunked_duration" --ignore-eos --json "$out/chunked_short_$t.json"
    bench_stop_server
    if has_serve_flag --no-chunked-prefill; then
      start_server "chunked_off_$t" "$dp" --max-num-batched-tokens "$batched_tokens" \
        --kv-memory "$kv_memory" --no-chunked-prefill
      bench --mix "$mix" --duration "$chunked_duration" --ignore-eos --json "$out/chunked_off_$t.json"
      bench_stop_server
    else
      echo "run.sh: serve has no --no-chunked-prefill; the chunking-off run is skipped" >&2
    fi
  fi
done

/usr/bin/python3 bench/serve/report.py "$out" --dtype "$dtype"
