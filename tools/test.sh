#!/usr/bin/env bash
# Installs what is missing, builds and runs the whole test suite:
#   build/asan: every test under AddressSanitizer + UndefinedBehaviorSanitizer;
#   build/tsan: the thread-backed protocol tests (CTest label 'tsan') under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
jobs=$(nproc)
# Checkpoints that tests write get their repack files (FP8 dequantized, BF16 panels) in a
# cache of the build tree, emptied per run, not in the user's ~/.cache.
export XDS_CACHE_DIR="$PWD/build/test-repack-cache"
rm -rf "$XDS_CACHE_DIR"

cmake -S . -B build/asan -G Ninja -DXDS_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/asan -j "$jobs"
ctest --test-dir build/asan --output-on-failure -j "$jobs" --timeout 900

cmake -S . -B build/tsan -G Ninja -DXDS_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/tsan -j "$jobs" --target tsan_tests
if ctest --test-dir build/tsan -N -L tsan | grep -q "Total Tests: [1-9]"; then
  ctest --test-dir build/tsan --output-on-failure -j "$jobs" -L tsan --timeout 900
fi
