#include "int8_peak.h"

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "base/clock.h"
#include "machine_limits.h"

namespace xds::bench {
namespace {

// The int8 peak of a path, in int ops (2 per multiply-add) a second on every thread: 16
// independent chains of vpdpbusd (64 multiply-adds each) or, for AVX2, 12 of vpmaddwd +
// vpaddd (16 each), with no memory traffic. The products are inline assembly: from the
// intrinsics GCC 12 copied every accumulator twice an iteration (vpdpbusd) or hoisted the
// loop-invariant product out of the loop (vpmaddwd).
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
int32_t vnni_loop(int64_t iters, int seed) {
  __m512i acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(seed + i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) asm("vpdpbusd %2, %1, %0" : "+v"(acc[i]) : "v"(a), "v"(b));
  }
  __m512i s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < 16; ++i) s = _mm512_add_epi32(s, acc[i]);
  int32_t out[16];
  _mm512_storeu_si512(out, s);
  return out[0];
}
#endif
int32_t avx2_loop(int64_t iters, int seed) {
  __m256i acc[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(seed + i);
  const __m256i a = _mm256_set1_epi16(3), b = _mm256_set1_epi16(-2);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      __m256i p;
      asm("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+v"(acc[i]), "=&v"(p) : "v"(a), "v"(b));
    }
  }
  __m256i s = acc[0];
#pragma GCC unroll 12
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  return _mm256_extract_epi32(s, 0);
}

}  // namespace

double int8_peak_gops(ThreadPool& pool, kernels::Int8Isa isa) {
  const int64_t iters = 10'000'000;
  std::vector<double> v;
  volatile int32_t sink = 0;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = Clock::now();
    double ops = 0;
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    if (isa == kernels::Int8Isa::kAvx512Vnni) {
      pool.run_on_all([&](int t) { sink = sink + vnni_loop(iters, t); });
      ops = 16.0 * 64 * 2 * static_cast<double>(iters);
    }
#endif
    if (ops == 0) {
      pool.run_on_all([&](int t) { sink = sink + avx2_loop(iters, t); });
      ops = 12.0 * 16 * 2 * static_cast<double>(iters);
    }
    if (r > 0) v.push_back(ops * pool.num_threads() / seconds_since(t0) / 1e9);
  }
  return median(v);
}

}  // namespace xds::bench
