#!/usr/bin/env bash
# Installs what is missing, builds the release binary and streams a generation from the
# default model shipped in models/.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)" --target xdeepserve
exec build/release/src/cli/xdeepserve generate --model models/kjv-moe-tiny --chat \
  --prompt "${1:-Tell me of the creation of the heaven and the earth.}" --max-tokens 96 --temperature 0.7 --top-p 0.9 --seed 1
