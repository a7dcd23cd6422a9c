#!/usr/bin/env bash
# Our engine beside ik_llama.cpp (a llama.cpp-family engine; its C API: llama_kv_cache_seq_rm,
# repack_tensors, mla_attn, fused_moe_up_gate) on bench-2.6b's shape: prefill 512 and decode
# at batches 1, 4, 16 (context 512, a distinct random token per sequence per step), the
# engines alternated round by round in the same minutes.
#
#   bench/peers/run.sh PEER_SRC [ROUNDS]
#
# Needs: cmake, ninja, a C++17 compiler, python3 with numpy (python3-numpy; bench-only, for
# make_gguf.py, which imports the peer tree's gguf-py), our release build's bench_decode,
# and bench-2.6b / bench-2.6b-w8a8 made by `xdeepserve mkmodel` (docs/benchmarks.md).
#
# Environment (defaults in brackets):
#   PEER_BUILD   the peer's build directory, outside the repository [bench-out/peers/build]
#   MODELS       directory holding bench-2.6b and bench-2.6b-w8a8; the peer's GGUFs are
#                written beside them [bench-out/models]
#   OUR_BENCH    our bench_decode binary [build/rel/bench/decode/bench_decode]
#   THREADS      the peer's threads [nproc]; bench_decode uses every core, so keep it nproc
#   PEER_TYPES   which of the peer's runs, in this order [q8_0 q8_0-rtr q8_k_r8]; also bf16,
#                iq4_k, iq4_k-rtr, iq4_ks, iq4_ks-rtr, q4_k_r4, q4_0-rtr
#   OUR_MODELS   which of our checkpoints under MODELS run, in this order
#                [bench-2.6b bench-2.6b-w8a8]; W4 copies are made by `xdeepserve mkmodel --from
#                bench-2.6b --weights-int4 sym --group-size 128 [--int4-int8-activations]`
#   FIRST_ROUND  the first round's number [1]; above 1, the rounds are added to OUT's
#   OUT          where the runs go [bench-out/peers]; bench/peers/summarize.py folds them
#                into OUT/peers.json (copy to bench/results/peers/ to keep a run)
# XDS_CACHE_DIR (our repack cache) is passed through to bench_decode as set.
#
# Each round: ours bf16, ours W8A8 (bench_decode --compute-dtype bf16), then the peer's
# (both engines: 8 timed decode steps after one warm-up step)
#   q8_0      random Q8_0 weights, mmapped, as loaded;
#   q8_0-rtr  the same file with run-time repack (-rtr: Q8_0 -> Q8_0_R8 at load);
#   q8_k_r8   a file written in Q8_K_R8 (its row-interleaved 8-bit type, a scale per 256;
#             what llama-quantize's Q8_K_R8 writes), the token embedding Q8_0;
#   bf16      every matrix BF16;
#   iq4_k, iq4_ks, q4_k_r4, q4_0   its 4-bit types, written by its own llama-quantize from the
#             Q8_0 file (--allow-requantize; its default choices for the token embedding and the
#             output matrix, as a user's quantization gets), -rtr repacking them at load;
# each with the fastest CPU settings for DeepSeek (-mla 3 -fa -fmoe; batch_decode.cc).
# `uptime` goes to OUT/load.txt before and after every round.
# The GGUFs have bench-2.6b's exact shape with random weights (make_gguf.py, written with
# the peer's own gguf-py); the peer runs bench/peers/batch_decode.cc, built against its
# libllama.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
peer_src=$(cd "${1:?PEER_SRC}" && pwd)
rounds=${2:-3}
first=${FIRST_ROUND:-1}
peer_build=${PEER_BUILD:-$root/bench-out/peers/build}
models=${MODELS:-$root/bench-out/models}
our_bench=${OUR_BENCH:-$root/build/rel/bench/decode/bench_decode}
threads=${THREADS:-$(nproc)}
peer_types=${PEER_TYPES:-q8_0 q8_0-rtr q8_k_r8}
our_models=${OUR_MODELS:-bench-2.6b bench-2.6b-w8a8}
out=${OUT:-$root/bench-out/peers}
mkdir -p "$out"

if [[ -z "$(find "$peer_build" -name 'libllama.so' 2>/dev/null | head -1)" ||
      ! -x $peer_build/bin/llama-quantize ]]; then
  "$here/build_peer.sh" "$peer_src" "$peer_build"
fi
driver=$peer_build/bin/peers-batch-decode
if [[ ! -x "$driver" || "$here/batch_decode.cc" -nt "$driver" ]]; then
  libdir=$(dirname "$(find "$peer_build" -name 'libllama.so' | head -1)")
  ggmldir=$(dirname "$(find "$peer_build" -name 'libggml.so' | head -1)")
  mkdir -p "$(dirname "$driver")"
  nice -n 19 g++ -std=c++17 -O2 -I"$peer_src/include" -I"$peer_src/ggml/include" \
    "$here/batch_decode.cc" -o "$driver" -L"$libdir" -L"$ggmldir" -lllama -lggml \
    -Wl,-rpath,"$libdir" -Wl,-rpath,"$ggmldir"
fi
gguf() {  # the GGUF of a peer run type
  case $1 in
    q8_0|q8_0-rtr|q8_k_r8|bf16|iq4_k|iq4_k-rtr|iq4_ks|iq4_ks-rtr|q4_k_r4|q4_0-rtr)
      echo "$models/bench-2.6b-${1%-rtr}.gguf" ;;
    *) echo "unknown peer type $1" >&2; exit 2 ;;
  esac
}
make_gguf() {  # make_gguf TYPE FILE: written directly (8-bit, bf16) or by the peer's quantizer
  case $1 in
    q8_0|q8_k_r8|bf16)
      nice -n 19 /usr/bin/python3 "$here/make_gguf.py" --config "$models/bench-2.6b/config.json" \
        --gguf-py "$peer_src/gguf-py" --out "$2" --type "$1" ;;
    *)
      local q8; q8=$(gguf q8_0)
      [[ -f $q8 ]] || make_gguf q8_0 "$q8"
      nice -n 19 "$peer_build/bin/llama-quantize" --allow-requantize "$q8" "$2" \
        "$(tr '[:lower:]' '[:upper:]' <<<"$1")" "$threads" > "$2.log" 2>&1 ;;
  esac
}
for t in $peer_types; do
  f=$(gguf "$t")
  [[ -f "$f" ]] || make_gguf "${t%-rtr}" "$f"
done

if [[ $first == 1 ]]; then : > "$out/load.txt"; fi
for r in $(seq "$first" $((first + rounds - 1))); do
  echo "round $r start: $(uptime)" | tee -a "$out/load.txt"
  for m in $our_models; do
    "$our_bench" --model "$models/$m" --compute-dtype bf16 \
      --batches 1,4,16 --prompt 512 --context 512 --steps 8 --json "$out/ours-$m-$r.json" \
      > "$out/ours-$m-$r.log" 2>&1 || echo "ours $m round $r failed" | tee -a "$out/load.txt"
  done
  for t in $peer_types; do
    rtr=(); [[ $t == *-rtr ]] && rtr=(--rtr)
    "$driver" "$(gguf "$t")" --threads "$threads" --steps 8 "${rtr[@]}" \
      > "$out/peer-$t-$r.jsonl" 2> "$out/peer-$t-$r.log" \
      || echo "peer $t round $r failed" | tee -a "$out/load.txt"
  done
  echo "round $r end: $(uptime)" | tee -a "$out/load.txt"
done
/usr/bin/python3 "$here/summarize.py" "$out" > "$out/peers.json"
cat "$out/peers.json"
