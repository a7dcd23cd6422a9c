#!/usr/bin/env bash
# Installs every Debian package xDeepServe needs to build, test, benchmark and train its
# default model. Idempotent: installs only what is missing. Run as root on Debian 12.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config clang-format clang-tidy
  # libraries
  libopenblas-dev libdnnl-dev nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libzmq3-dev cppzmq-dev libsodium-dev libboost-dev liblapacke-dev libucx-dev libxxhash-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin ucx-utils iproute2
  stress-ng  # bench/decode/loaded.sh: a competing process
  # operations: a Prometheus text parser (tests/e2e/serve_metrics_test.py), the Prometheus
  # server (serve_prometheus_test.py), YAML for deploy/ (its config and the k8s manifests)
  python3-prometheus-client prometheus python3-yaml
  etcd-server etcd-client  # membership in etcd: the tests start a real etcd
  # oracle, fixtures and the training recipe
  python3 python3-numpy python3-torch bible-kjv bible-kjv-text nodejs
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The official OpenAI client for the end-to-end tests (tests/e2e), pinned by tools/npm's lockfile.
[[ -d "$(dirname "$0")/npm/node_modules/openai" ]] || npm ci --prefix "$(dirname "$0")/npm" --no-audit --no-fund
echo "install_deps: all ${#packages[@]} packages present"
