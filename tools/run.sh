#!/usr/bin/env bash
# Installs what is missing, builds the release binary and streams a generation from the
# default model shipped in models/.
#   tools/run.sh [--int8] [PROMPT]
# --int8: from the default model's INT8 (W8A8) copy, made by tools/quantize_tiny.sh on first
# use (models/kjv-moe-tiny-w8a8).
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/kjv-moe-tiny
if [[ "${1:-}" == "--int8" ]]; then
  model=models/kjv-moe-tiny-w8a8
  shift
fi
./tools/install_deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)" --target xdeepserve
if [[ ! -d "$model" ]]; then
  ./tools/quantize_tiny.sh build/release
fi
exec build/release/src/cli/xdeepserve generate --model "$model" --chat \
  --prompt "${1:-Tell me of the creation of the heaven and the earth.}" --max-tokens 96 --temperature 0.7 --top-p 0.9 --seed 1
