#include "machine_limits.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "base/clock.h"

namespace xds::bench {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

// Sums n floats with 4 AVX2 accumulators. kPrefetch adds a software prefetch 4 KB ahead (one
// per line), as the weight-streaming kernels do: in some machine states that reads faster than
// hardware prefetch alone, so the plain loop alone could put the "limit" below the engine.
template <bool kPrefetch>
float stream_sum(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 1040), _MM_HINT_T0);
    }
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

// 12 independent FMA chains of the widest vectors the build targets (16 lanes with AVX-512,
// 8 with AVX2): kFmaLoopFlops flops per iteration. Kernels that use narrower vectors than
// this loop cannot reach it; that is the point: the peak is the machine's, not our code's.
#if defined(__AVX512F__)
constexpr const char* kFmaIsa = "avx512";
constexpr double kFmaLoopFlops = 12 * 16 * 2;
float fma_loop(int64_t iters, float seed) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}
#else
constexpr const char* kFmaIsa = "avx2";
constexpr double kFmaLoopFlops = 12 * 8 * 2;
float fma_loop(int64_t iters, float seed) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(seed + static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}
#endif

#if defined(__AVX512BF16__)
// The FMA loop's shape with vdpbf16ps (per instruction 16 lanes × 2 products, 64 flops), but
// 16 chains: its latency needs more in flight than the FMA's (12 chains fall short, 24 add
// nothing; the FMA loop is level from 12 on: docs/benchmarks.md).
constexpr int kDotChains = 16;
constexpr double kDotLoopFlops = kDotChains * 16 * 2 * 2;
float bf16_dot_loop(int64_t iters, float seed) {
  __m512 acc[kDotChains];
  for (int i = 0; i < kDotChains; ++i) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3400));  // 2^-23
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kDotChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kDotChains; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}
#endif

// Median GFLOP/s of `repeats` timed runs (after one warm-up) of `loop` on every thread.
template <class Loop>
double loop_gflops(ThreadPool& pool, int repeats, double flops_per_iter, Loop loop) {
  const int64_t iters = 20'000'000;
  std::vector<double> fl;
  volatile float sink = 0;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto t0 = Clock::now();
    pool.run_on_all([&](int t) { sink = sink + loop(iters, static_cast<float>(t)); });
    const double s = seconds_since(t0);
    if (r > 0)
      fl.push_back(flops_per_iter * static_cast<double>(iters) * pool.num_threads() / s / 1e9);
  }
  return median(fl);
}

}  // namespace

double compute_peak_gflops(const MachineLimits& m, const std::string& compute_dtype) {
  return compute_dtype == "bf16" ? std::max(m.f32_gflops, m.bf16_gflops) : m.f32_gflops;
}

MachineLimits measure_machine_limits(ThreadPool& pool, int repeats) {
  MachineLimits m;
  const int64_t n = int64_t{1} << 28;  // 1 GiB of floats
  float* buf = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = 1.0f;
  });
  std::vector<double> bw, bw_pf;
  volatile float sink = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the two read loops interleaved
    for (const bool prefetch : {false, true}) {
      const auto t0 = Clock::now();
      pool.parallel_for(n / 1024, [&](int64_t b, int64_t e, int) {
        const float* p = buf + b * 1024;
        sink = sink + (prefetch ? stream_sum<true>(p, (e - b) * 1024)
                                : stream_sum<false>(p, (e - b) * 1024));
      });
      const double s = seconds_since(t0);
      if (r > 0)
        (prefetch ? bw_pf : bw).push_back(static_cast<double>(n) * sizeof(float) / s / 1e9);
    }
  }
  std::free(buf);
  m.f32_gflops = loop_gflops(pool, repeats, kFmaLoopFlops, fma_loop);
#if defined(__AVX512BF16__)
  m.bf16_gflops = loop_gflops(pool, repeats, kDotLoopFlops, bf16_dot_loop);
#endif
  m.read_plain_gbps = median(bw);
  m.read_prefetch_gbps = median(bw_pf);
  m.read_gbps = std::max(m.read_plain_gbps, m.read_prefetch_gbps);
  m.f32_isa = kFmaIsa;
  return m;
}

MachineLimits faster_of(const MachineLimits& a, const MachineLimits& b) {
  MachineLimits m;
  m.read_plain_gbps = std::max(a.read_plain_gbps, b.read_plain_gbps);
  m.read_prefetch_gbps = std::max(a.read_prefetch_gbps, b.read_prefetch_gbps);
  m.read_gbps = std::max(m.read_plain_gbps, m.read_prefetch_gbps);
  m.f32_gflops = std::max(a.f32_gflops, b.f32_gflops);
  m.f32_isa = a.f32_isa;
  m.bf16_gflops = std::max(a.bf16_gflops, b.bf16_gflops);
  return m;
}

}  // namespace xds::bench
