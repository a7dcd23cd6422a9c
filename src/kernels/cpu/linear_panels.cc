#include "kernels/cpu/linear_panels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"

// AVX2 + FMA (16 ymm registers). Register budget of a tile: T tokens × P panels × 2 halves
// accumulators + the panel's widened halves + one broadcast: T ≤ 6 for P = 1 (12 + 3),
// T ≤ 3 for P = 2 (12 + 4 + 1 > 16: GCC keeps two of the accumulators on the stack, which
// costs less than the second stream gains; see panels_linear).

namespace xds::kernels {
namespace {

constexpr int kMaxTokens = 6;     // tokens per tile
constexpr int64_t kKBlock = 512;  // columns per pass when several token blocks share a panel:
                                  // 16 KB of panel + 6 × 2 KB of x stay in L1
// Software prefetch distance along a panel (4 KB ahead, one line per two columns; it runs
// on into the next panel, which is what is read next). A cold two-thread A/B of 64-256
// columns against none gave +10-25 % at 1, 3 and 6 tokens (docs/design/cpu_kernels.md).
constexpr int64_t kPrefetchCols = 128;

inline const uint16_t* panel_ptr(const MatrixRef& w, int64_t p) {
  return static_cast<const uint16_t*>(w.data) + p * w.cols * kPanelRows;
}

// acc[t] (+)= Σ_{c in [kb, ke)} x[t][c] · panel[c] for T tokens and P adjacent panels, the
// accumulators being y[t][0 .. 16P) (loaded unless `first`, which starts from 0).
template <int T, int P>
void panel_tile(const float* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t kb,
                int64_t ke, bool first, float* y, int64_t ldy) {
  static_assert(P == 1 || P == 2);
  __m256 a0[T], a1[T], a2[T], a3[T];
  const uint16_t* w2 = w + cols * kPanelRows;
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const float* yt = y + t * ldy;
    a0[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt);
    a1[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + 8);
    if constexpr (P == 2) {
      a2[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + 16);
      a3[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + 24);
    }
  }
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t c = kb; c < ke; ++c) {
    if ((c & 1) == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (c + kPrefetchCols) * kPanelRows),
                   _MM_HINT_T0);
      if constexpr (P == 2)
        _mm_prefetch(reinterpret_cast<const char*>(w2 + (c + kPrefetchCols) * kPanelRows),
                     _MM_HINT_T0);
    }
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * kPanelRows));
    const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, high));
    __m256 lo2, hi2;
    if constexpr (P == 2) {
      const __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w2 + c * kPanelRows));
      lo2 = _mm256_castsi256_ps(_mm256_slli_epi32(v2, 16));
      hi2 = _mm256_castsi256_ps(_mm256_and_si256(v2, high));
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + t * ldx + c);
      a0[t] = _mm256_fmadd_ps(xb, lo, a0[t]);
      a1[t] = _mm256_fmadd_ps(xb, hi, a1[t]);
      if constexpr (P == 2) {
        a2[t] = _mm256_fmadd_ps(xb, lo2, a2[t]);
        a3[t] = _mm256_fmadd_ps(xb, hi2, a3[t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
    _mm256_storeu_ps(yt, a0[t]);
    _mm256_storeu_ps(yt + 8, a1[t]);
    if constexpr (P == 2) {
      _mm256_storeu_ps(yt + 16, a2[t]);
      _mm256_storeu_ps(yt + 24, a3[t]);
    }
  }
}

template <int P>
void tile(int tb, const float* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t kb,
          int64_t ke, bool first, float* y, int64_t ldy) {
  auto run = [&]<int T>() { panel_tile<T, P>(x, ldx, w, cols, kb, ke, first, y, ldy); };
  switch (tb) {
    case 1:
      return run.template operator()<1>();
    case 2:
      return run.template operator()<2>();
    case 3:
      return run.template operator()<3>();
  }
  if constexpr (P == 1) {
    switch (tb) {
      case 4:
        return run.template operator()<4>();
      case 5:
        return run.template operator()<5>();
      case 6:
        return run.template operator()<6>();
    }
  }
  XDS_CHECK(false, "panel tile: {} tokens for {} panels", tb, P);
}

// All n tokens against panels [p, p + P), accumulating into acc [n][16P] (row stride ldacc).
template <int P>
void panel_group(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
                 int64_t ldacc) {
  const int64_t cols = w.cols;
  const uint16_t* wp = panel_ptr(w, p);
  // One token block reads the panel once, straight through; several blocks walk it in k
  // blocks so that every block after the first finds the slice in L1.
  const int64_t kblock = n <= kMaxTokens ? cols : kKBlock;
  for (int64_t kb = 0; kb < cols; kb += kblock) {
    const int64_t ke = std::min(cols, kb + kblock);
    for (int64_t t = 0; t < n; t += kMaxTokens) {
      const int tb = static_cast<int>(std::min<int64_t>(kMaxTokens, n - t));
      tile<P>(tb, x + t * ldx, ldx, wp, cols, kb, ke, kb == 0, acc + t * ldacc, ldacc);
    }
  }
}

}  // namespace

void pack_panels16(const uint16_t* w, int64_t rows, int64_t cols, int64_t panel_begin,
                   int64_t panel_end, uint16_t* out) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    uint16_t* dst = out + p * cols * kPanelRows;
    for (int j = 0; j < 16; ++j) {
      const int64_t r = p * kPanelRows + j;
      const int slot = j < 8 ? 2 * j : 2 * (j - 8) + 1;
      if (r >= rows) {
        for (int64_t c = 0; c < cols; ++c) dst[c * kPanelRows + slot] = 0;
        continue;
      }
      const uint16_t* src = w + r * cols;
      for (int64_t c = 0; c < cols; ++c) dst[c * kPanelRows + slot] = src[c];
    }
  }
}

void panels_linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                   int64_t p_end, float* y, int64_t ldy) {
  XDS_CHECK(w.layout == MatrixLayout::kPanels16 && w.dtype == DType::kBF16,
            "panels_linear: weights are not BF16 panels");
  if (n <= 0 || p_begin >= p_end) return;
  const int64_t full_end = std::min(p_end, w.rows / kPanelRows);  // panels with 16 real rows
  int64_t p = p_begin;
  // Up to three tokens: two panels per tile (two streams; 12 accumulators at 3 tokens).
  // Three tokens on two panels against one: 56.7/57.2/57.7 % vs 53.7/50.6/54.5 % of the
  // batch-16 roofline in three interleaved pairs (19:03 UTC).
  if (n <= 3) {
    for (; p + 2 <= full_end; p += 2) panel_group<2>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  }
  for (; p < full_end; ++p) panel_group<1>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  if (p < p_end) {  // the zero-padded last panel: accumulate aside, copy the real rows
    thread_local std::vector<float> tail;
    tail.resize(static_cast<size_t>(n * kPanelRows));
    panel_group<1>(x, n, ldx, w, p, tail.data(), kPanelRows);
    const int64_t real = w.rows - p * kPanelRows;
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(y + t * ldy + p * kPanelRows, tail.data() + t * kPanelRows,
                  sizeof(float) * static_cast<size_t>(real));
  }
}

}  // namespace xds::kernels
