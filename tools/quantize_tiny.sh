#!/usr/bin/env bash
# Makes the default model's calibrated quantized copy, models/kjv-moe-tiny-<scheme> (not
# committed: made on demand), with `xdeepserve quantize` calibrated on the model's training
# chapters of the King James Bible (tools/train_tiny/corpus.py --write-train; never
# heldout.txt): w8a8 (default; SmoothQuant + GPTQ, per-channel INT8), w4a16 (GPTQ, 4-bit
# groups of 128, no smoothing) or w4a8 (SmoothQuant + GPTQ, 4-bit groups of 128).
# Usage: tools/quantize_tiny.sh [BUILD_DIR] [SCHEME]
#   BUILD_DIR: default build/release, built if missing; SCHEME: w8a8 | w4a16 | w4a8.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
scheme="${2:-w8a8}"
case "$scheme" in
  w8a8 | w4a16 | w4a8) ;;
  *)
    echo "quantize_tiny.sh: scheme '$scheme' (expected w8a8, w4a16 or w4a8)" >&2
    exit 2
    ;;
esac
if [[ ! -x "$build/src/cli/xdeepserve" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc)" --target xdeepserve
fi
out="models/kjv-moe-tiny-$scheme"
if [[ -d "$out" ]]; then
  echo "$out exists" >&2
  exit 0
fi
calib="$build/kjv-train.txt"
[[ -s "$calib" ]] || /usr/bin/python3 tools/train_tiny/corpus.py --write-train "$calib"
exec "$build/src/cli/xdeepserve" quantize --model models/kjv-moe-tiny --out "$out" \
  --calibration "$calib" --samples 64 --window 256 --smooth-alpha 0.5 --method gptq \
  --min-expert-samples 4 --scheme "$scheme"
