// Physical limits of this machine, measured in the same run as the benchmark they frame:
// memory read bandwidth (all threads streaming a buffer far larger than the caches) and the
// fp32 FMA compute peak (independent accumulator chains, no memory traffic).
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"

namespace xds::bench {

struct MachineLimits {
  double read_gbps = 0;   // median of `repeats`, GB/s (1e9 bytes)
  double f32_gflops = 0;  // median of `repeats`
};

MachineLimits measure_machine_limits(ThreadPool& pool, int repeats = 5);

double median(std::vector<double> v);

}  // namespace xds::bench
