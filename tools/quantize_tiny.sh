#!/usr/bin/env bash
# Makes the default model's calibrated INT8 copy, models/kjv-moe-tiny-w8a8 (not committed:
# made on demand), with `xdeepserve quantize` calibrated on the model's training chapters of
# the King James Bible (tools/train_tiny/corpus.py --write-train; never heldout.txt).
# Usage: tools/quantize_tiny.sh [BUILD_DIR] (default build/release, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
if [[ ! -x "$build/src/cli/xdeepserve" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc)" --target xdeepserve
fi
out=models/kjv-moe-tiny-w8a8
if [[ -d "$out" ]]; then
  echo "$out exists" >&2
  exit 0
fi
calib="$build/kjv-train.txt"
[[ -s "$calib" ]] || /usr/bin/python3 tools/train_tiny/corpus.py --write-train "$calib"
exec "$build/src/cli/xdeepserve" quantize --model models/kjv-moe-tiny --out "$out" \
  --calibration "$calib" --samples 64 --window 256 --smooth-alpha 0.5 --method gptq \
  --min-expert-samples 4
