// Physical limits of this machine, measured in the same run as the benchmark they frame:
// memory read bandwidth (all threads streaming a buffer far larger than the caches, with and
// without software prefetch; the faster counts) and the compute peaks: fp32 FMA
// (independent accumulator chains of the widest vectors the build targets, no memory
// traffic) and, where the build has AVX512_BF16, the bf16 dot product `vdpbf16ps` (the same
// loop; two bf16 products summed into each fp32 lane).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/thread_pool.h"

namespace xds::bench {

struct MachineLimits {
  double read_gbps = 0;  // the faster of the two read loops below (their medians), GB/s (1e9 B)
  double read_plain_gbps = 0;     // median of `repeats`: AVX2 sum, hardware prefetch only
  double read_prefetch_gbps = 0;  // median of `repeats`: the same with software prefetch
  double f32_gflops = 0;  // median of `repeats`
  const char* f32_isa = "";  // the vectors of the FMA loop: "avx512" or "avx2"
  double bf16_gflops = 0;    // median of `repeats` of the vdpbf16ps loop; 0 without AVX512_BF16
};

// The peak a step computing in `compute_dtype` ("f32" or "bf16") is held to. bf16 inputs
// can go either way: widened to fp32 (exact) through the FMA loop's instruction, or in
// pairs through vdpbf16ps; the faster of the two is the machine's bf16 peak.
double compute_peak_gflops(const MachineLimits& m, const std::string& compute_dtype);

MachineLimits measure_machine_limits(ThreadPool& pool, int repeats = 5);

// The higher bandwidth and the higher peak of two measurements (e.g. before and after a
// row): a roofline built on them cannot be lowered by a moment when the machine was slow.
MachineLimits faster_of(const MachineLimits& a, const MachineLimits& b);

double median(std::vector<double> v);

}  // namespace xds::bench
