#!/usr/bin/env bash
# XCCL vs Open MPI on this machine, in one run: builds (Release, build/bench-xccl), runs the
# XCCL bench (2 device processes pinned to cores 0 and 1) and the Open MPI bench (2 ranks
# bound to the 2 cores, btl self,vader; vader's single-copy mechanism is recorded), then 5
# interleaved 8 B latency rounds of each, prints the side-by-side table and writes
# bench-out/xccl/ (xccl.jsonl, mpi.jsonl, xccl_vs_mpi.json and the table, xccl_vs_mpi.txt).
# --save also copies the run into bench/results/xccl.json and xccl.txt.
#   bench/xccl/run.sh [--quick] [--save]
set -euo pipefail
cd "$(dirname "$0")/../.."
quick="" save=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=--quick ;;
    --save) save=1 ;;
    *) echo "usage: bench/xccl/run.sh [--quick] [--save] (unknown argument '$arg')" >&2; exit 2 ;;
  esac
done
build=build/bench-xccl
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target xccl_bench xccl_mpi_bench >/dev/null
out=bench-out/xccl
mkdir -p "$out"
rm -f "$out/xccl.jsonl" "$out/mpi.jsonl"
"$build/bench/xccl/xccl_bench" "$out/xccl.jsonl" $quick
single_copy=$(ompi_info --param btl vader --level 9 2>/dev/null |
  sed -n 's/.*btl_vader_single_copy_mechanism" (current value: "\([a-z]*\)".*/\1/p' | head -n1)
echo "{\"bench\":\"meta\",\"impl\":\"openmpi\",\"version\":\"$(ompi_info --version 2>/dev/null | head -n1)\",\"btl\":\"self,vader\",\"vader_single_copy\":\"${single_copy:-unknown}\"}" >> "$out/mpi.jsonl"
mpirun --allow-run-as-root -np 2 --bind-to core --map-by core --mca btl self,vader \
  "$build/bench/xccl/xccl_mpi_bench" "$out/mpi.jsonl" $quick
# 8 B latency in 5 interleaved rounds (xccl, Open MPI, xccl, ...): a virtual machine's
# cross-core line transfer time can change between process launches, so one pair of runs seconds apart can land
# in different states; alternating compares both sides under the same ones.
for round in 1 2 3 4 5; do
  "$build/bench/xccl/xccl_bench" "$out/xccl.jsonl" --quick lat "$round"
  mpirun --allow-run-as-root -np 2 --bind-to core --map-by core --mca btl self,vader \
    "$build/bench/xccl/xccl_mpi_bench" "$out/mpi.jsonl" --quick lat "$round"
done
/usr/bin/python3 bench/xccl/report.py "$out/xccl.jsonl" "$out/mpi.jsonl" "$out/xccl_vs_mpi.json" |
  tee "$out/xccl_vs_mpi.txt"
if [ "$save" = 1 ]; then
  cp "$out/xccl_vs_mpi.json" bench/results/xccl.json
  cp "$out/xccl_vs_mpi.txt" bench/results/xccl.txt
  echo "saved bench/results/xccl.json and bench/results/xccl.txt"
fi
