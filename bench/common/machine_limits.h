// Physical limits of this machine, measured in the same run as the benchmark they frame:
// memory read bandwidth (all threads streaming a buffer far larger than the caches, with and
// without software prefetch; the faster counts) and the
// fp32 FMA compute peak (independent accumulator chains of the widest vectors the build
// targets, no memory traffic).
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"

namespace xds::bench {

struct MachineLimits {
  double read_gbps = 0;  // the faster of the two read loops below (their medians), GB/s (1e9 B)
  double read_plain_gbps = 0;     // median of `repeats`: AVX2 sum, hardware prefetch only
  double read_prefetch_gbps = 0;  // median of `repeats`: the same with software prefetch
  double f32_gflops = 0;  // median of `repeats`
  const char* f32_isa = "";  // the vectors of the FMA loop: "avx512" or "avx2"
};

MachineLimits measure_machine_limits(ThreadPool& pool, int repeats = 5);

// The higher bandwidth and the higher peak of two measurements (e.g. before and after a
// row): a roofline built on them cannot be lowered by a moment when the VM was slow.
MachineLimits faster_of(const MachineLimits& a, const MachineLimits& b);

double median(std::vector<double> v);

}  // namespace xds::bench
