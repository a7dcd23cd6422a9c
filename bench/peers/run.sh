#!/usr/bin/env bash
# Our engine beside a llama.cpp-family peer (ik_llama.cpp's API: llama_kv_cache_seq_rm,
# repack_tensors) on bench-2.6b's shape: prefill 512 and decode at batches 1, 4, 16
# (context 512, a distinct random token per sequence per step), the engines alternated
# round by round in the same minutes.
#
#   bench/peers/run.sh PEER_SRC [ROUNDS]
#
# Environment (defaults in brackets):
#   PEER_BUILD   the peer's build directory, outside the repository [bench-out/peers/build]
#   MODELS       directory holding bench-2.6b and bench-2.6b-w8a8 [bench-out/models]
#   OUR_BUILD    our build directory with bench_decode [build/rel]
#   THREADS      threads of both engines [nproc]
#   OUT          where the runs go [bench-out/peers]; bench/peers/summarize.py folds them
#                into OUT/peers.json (copy to bench/results/peers/ to keep a run)
#
# Rounds: ours bf16, ours W8A8, peer Q8_0, peer Q8_0 with run-time repack (-rtr), repeated.
# The peer's GGUF has bench-2.6b's exact shape with random Q8_0 weights (make_gguf.py,
# written with the peer's own gguf-py); the peer runs bench/peers/batch_decode.cc, built
# against its libllama.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
peer_src=$(cd "${1:?PEER_SRC}" && pwd)
rounds=${2:-2}
peer_build=${PEER_BUILD:-$root/bench-out/peers/build}
models=${MODELS:-$root/bench-out/models}
our_build=${OUR_BUILD:-$root/build/rel}
threads=${THREADS:-$(nproc)}
out=${OUT:-$root/bench-out/peers}
mkdir -p "$out"

if [[ ! -x "$peer_build/bin/llama-bench" ]]; then
  "$here/build_peer.sh" "$peer_src" "$peer_build"
fi
driver=$peer_build/bin/peers-batch-decode
if [[ ! -x "$driver" || "$here/batch_decode.cc" -nt "$driver" ]]; then
  libdir=$(dirname "$(find "$peer_build" -name 'libllama.so' | head -1)")
  ggmldir=$(dirname "$(find "$peer_build" -name 'libggml.so' | head -1)")
  nice -n 19 g++ -std=c++17 -O2 -I"$peer_src/include" -I"$peer_src/ggml/include" \
    "$here/batch_decode.cc" -o "$driver" -L"$libdir" -L"$ggmldir" -lllama -lggml \
    -Wl,-rpath,"$libdir" -Wl,-rpath,"$ggmldir"
fi
gguf=$out/bench-2.6b-q8_0.gguf
if [[ ! -f "$gguf" ]]; then
  nice -n 19 /usr/bin/python3 "$here/make_gguf.py" --config "$models/bench-2.6b/config.json" \
    --gguf-py "$peer_src/gguf-py" --out "$gguf"
fi

uptime | tee "$out/load.txt"
for r in $(seq 1 "$rounds"); do
  for m in bench-2.6b bench-2.6b-w8a8; do
    "$our_build/bench/decode/bench_decode" --model "$models/$m" --compute-dtype bf16 \
      --batches 1,4,16 --prompt 512 --context 512 --json "$out/ours-$m-$r.json" \
      > "$out/ours-$m-$r.txt"
  done
  "$driver" "$gguf" --threads "$threads" > "$out/peer-q8_0-$r.jsonl" 2> "$out/peer-q8_0-$r.log"
  "$driver" "$gguf" --threads "$threads" --rtr > "$out/peer-q8_0-rtr-$r.jsonl" \
    2> "$out/peer-q8_0-rtr-$r.log"
  uptime | tee -a "$out/load.txt"
done
/usr/bin/python3 "$here/summarize.py" "$out" > "$out/peers.json"
cat "$out/peers.json"
