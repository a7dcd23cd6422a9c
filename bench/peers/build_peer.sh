#!/usr/bin/env bash
# Builds a llama.cpp-family source tree (ik_llama.cpp) CPU-only, Release, -march=native,
# into a build directory outside the source tree, at nice 19: libllama (and libggml), which
# bench/peers/run.sh builds its batch driver against, llama-quantize (which writes the peer's
# 4-bit types) and llama-server (bench/peers/serve_compare.sh). The examples are configured
# (the server and the quantizer are among them) but only those two are built; the tests are
# not configured. Its flash attention is compiled for the default f16 KV cache only
# (GGML_IQK_FA_ALL_QUANTS off: the runs here use no quantized KV cache, and the kernels for all
# KV types take hours on two cores).
#   usage: [NICE=N] bench/peers/build_peer.sh SRC_DIR BUILD_DIR [JOBS]
set -euo pipefail
src=${1:?SRC_DIR}
build=${2:?BUILD_DIR}
jobs=${3:-2}
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=ON -DGGML_IQK_FA_ALL_QUANTS=OFF
nice -n "${NICE:-19}" ninja -C "$build" -j"$jobs" llama llama-quantize llama-server
