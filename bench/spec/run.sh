#!/usr/bin/env bash
# MTP speculative decoding on the default model (models/kjv-moe-tiny), same run, side by side:
#   generate   batch-1 decode tokens/s of `xdeepserve generate --speculative-tokens k` for
#              each k (rounds alternate the k's; medians), temperature 0.7, held-out prompts
#   served     `xdeepserve serve --speculative-tokens k`, `xdeepserve bench` at concurrency 1
#              over held-out prompts (the openings of heldout.txt's verses), temperature 0.7:
#              TPOT, output tokens/s, and the server's acceptance by draft position and
#              tokens per verify step
#   agreement  teacher-forced draft agreement on heldout.txt (`perplexity --mtp-agreement`)
# k = 2 runs twice when the model has a second MTP layer: reusing the first
# (--speculative-mtp-layers 1) and with the trained one.
# Writes bench-out/spec/*.json and prints the table of bench/spec/report.py
# (bench-out/spec/summary.json and .txt).
#
#   bench/spec/run.sh [--model DIR] [--ks 0,1,2] [--compute-dtype bf16|f32] [--requests N]
#                     [--rounds R] [--build DIR] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/../.."

model=models/kjv-moe-tiny
ks="0,1,2"
dtype=bf16
requests=32
rounds=3
build=build/bench-spec
do_build=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --ks) ks="$2"; shift 2 ;;
    --compute-dtype) dtype="$2"; shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done

if [[ $do_build == 1 ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C "$build" xdeepserve >/dev/null
fi
xds="$build/src/cli/xdeepserve"
out=bench-out/spec
mkdir -p "$out"

# Held-out prompts: the first eight words of each verse ("N text" lines) of heldout.txt.
prompts="$out/heldout_prompts.txt"
awk '/^[0-9]+ / && c < 64 { n = NF - 1; if (n > 8) n = 8; s = $2
                            for (i = 3; i <= n + 1; ++i) s = s " " $i; print s; ++c }' \
  "$model/heldout.txt" >"$prompts"

mtp_layers=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_nextn_predict_layers'])" "$model/config.json")

# The runs: "k:layers" (layers 0: all the model has).
runs=()
IFS=, read -ra kk <<<"$ks"
for k in "${kk[@]}"; do
  runs+=("$k:0")
  if [[ $k -ge 2 && $mtp_layers -ge 2 ]]; then runs+=("$k:1"); fi
done
flags_of() {  # k:layers -> generate/serve flags
  local k=${1%%:*} l=${1##*:}
  echo "--speculative-tokens $k$([[ $l != 0 ]] && echo " --speculative-mtp-layers $l")"
}
name_of() { local k=${1%%:*} l=${1##*:}; echo "k${k}$([[ $l != 0 ]] && echo "_layers${l}")"; }

# generate: rounds alternate the runs; every prompt of the first 8, 400 tokens each.
: >"$out/generate.jsonl"
for ((r = 0; r < rounds; ++r)); do
  for run in "${runs[@]}"; do
    while read -r p; do
      # shellcheck disable=SC2046
      line=$("$xds" generate --model "$model" --prompt "$p" --max-tokens 400 --ignore-eos \
        --temperature 0.7 --seed "$r" --compute-dtype "$dtype" $(flags_of "$run") 2>&1 >/dev/null |
        grep '^prefill:')
      tps=$(sed -E 's/.*decode: [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tokens\/s\).*/\1/' <<<"$line")
      echo "{\"run\": \"$(name_of "$run")\", \"round\": $r, \"decode_tokens_per_s\": $tps}" >>"$out/generate.jsonl"
    done < <(sed -n 1,8p "$prompts")
  done
done

# served: one server per run, bench at concurrency 1.
port=8790
for run in "${runs[@]}"; do
  name=$(name_of "$run")
  # shellcheck disable=SC2046
  "$xds" serve --model "$model" --port "$port" --instance-port $((port + 1)) --kv-memory 64M \
    --compute-dtype "$dtype" $(flags_of "$run") >"$out/serve_$name.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.2
  done
  "$xds" bench --url "http://127.0.0.1:$port" --prompts "$prompts" --num-requests "$requests" \
    --concurrency 1 --output-len 128 --ignore-eos --temperature 0.7 --seed 1 --no-progress \
    --json "$out/served_$name.json" | tee "$out/served_$name.txt"
  kill "$server"
  wait "$server" || true
done

# agreement: teacher-forced on heldout.txt, reuse and (when present) the trained layer.
"$xds" perplexity --model "$model" --file "$model/heldout.txt" --compute-dtype "$dtype" \
  --mtp-agreement --speculative-mtp-layers 1 >"$out/agreement_layers1.txt" 2>&1
if [[ $mtp_layers -ge 2 ]]; then
  "$xds" perplexity --model "$model" --file "$model/heldout.txt" --compute-dtype "$dtype" \
    --mtp-agreement >"$out/agreement_layers${mtp_layers}.txt" 2>&1
fi

/usr/bin/python3 bench/spec/report.py --dir "$out" --model "$model" --dtype "$dtype"
