#!/usr/bin/env bash
# Builds a llama.cpp-family source tree (ik_llama.cpp) CPU-only, Release, -march=native,
# into a build directory outside the source tree, at nice 19: only libllama (and libggml),
# which bench/peers/run.sh builds its batch driver against. The examples (the server among
# them, whose web UI a source archive may lack) and the tests are not configured.
#   usage: bench/peers/build_peer.sh SRC_DIR BUILD_DIR [JOBS]
set -euo pipefail
src=${1:?SRC_DIR}
build=${2:?BUILD_DIR}
jobs=${3:-2}
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON
nice -n 19 ninja -C "$build" -j"$jobs" llama
