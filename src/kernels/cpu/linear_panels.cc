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
// Software prefetch distance along a panel for a single pass (4 KB ahead, one line per two
// columns; it runs on into the next panel, which is what is read next). A cold two-thread
// A/B of 64-256 columns against none gave +10-25 % at 1, 3 and 6 tokens
// (docs/design/cpu_kernels.md).
constexpr int64_t kPrefetchCols = 128;
constexpr int64_t kLineBytes = 64;
constexpr int64_t kColumnBytes = kPanelRows * 2;  // one panel column: 16 bf16

inline const uint16_t* panel_ptr(const MatrixRef& w, int64_t p) {
  return static_cast<const uint16_t*>(w.data) + p * w.cols * kPanelRows;
}

// acc[t] (+)= Σ_{c in [kb, ke)} x[t][c] · panel[c] for T tokens and P adjacent panels, the
// accumulators being y[t][0 .. 16P) (loaded unless `first`, which starts from 0). Every G
// columns the pass prefetches the line at `pf` and steps it on by a line (for P = 2 the same
// line of the second panel too).
template <int T, int P, int G>
void panel_tile(const float* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t kb,
                int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
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
  auto column = [&](int64_t c) __attribute__((always_inline)) {
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
  };
  const int64_t second_panel = cols * kColumnBytes;
  int64_t c = kb;
  for (; c + G <= ke; c += G) {
    _mm_prefetch(pf, _MM_HINT_T0);
    if constexpr (P == 2) _mm_prefetch(pf + second_panel, _MM_HINT_T0);
    pf += kLineBytes;
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) column(c + g);
  }
  for (; c < ke; ++c) column(c);
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

template <int P, int G>
void tile(int tb, const float* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t kb,
          int64_t ke, bool first, float* y, int64_t ldy, const char* pf) {
  auto run = [&]<int T>() { panel_tile<T, P, G>(x, ldx, w, cols, kb, ke, first, y, ldy, pf); };
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
//
// Up to kMaxTokens tokens: one pass straight through the panel, prefetching kPrefetchCols
// columns ahead. More: the panel is walked in k blocks of kKBlock columns, each read by
// ceil(n / kMaxTokens) passes of balanced token blocks (7 tokens as 4 + 3, not 6 + 1).
// Only the first pass of a block reads it from memory, the others find it in L1, so the
// next block's lines are prefetched in equal shares by all the block's passes: the memory
// stream keeps flowing while the later passes compute. (Prefetching from the first pass
// only left memory idle during the others: at batch 64 the experts' time was close to
// their compute time plus their memory time.)
template <int P>
void panel_group(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
                 int64_t ldacc) {
  const int64_t cols = w.cols;
  const uint16_t* wp = panel_ptr(w, p);
  if (n <= kMaxTokens) {  // one line per two columns, kPrefetchCols ahead
    static_assert(kLineBytes / kColumnBytes == 2);
    tile<P, 2>(static_cast<int>(n), x, ldx, wp, cols, 0, cols, true, acc, ldacc,
               reinterpret_cast<const char*>(wp + kPrefetchCols * kPanelRows));
    return;
  }
  if constexpr (P == 1) {
    const int64_t passes = (n + kMaxTokens - 1) / kMaxTokens;
    for (int64_t kb = 0; kb < cols; kb += kKBlock) {
      const int64_t ke = std::min(cols, kb + kKBlock);
      // The next block starts right after this one (in the next panel after the last block).
      const char* next_block = reinterpret_cast<const char*>(wp + ke * kPanelRows);
      const int64_t lines = ((ke - kb) * kColumnBytes + kLineBytes - 1) / kLineBytes;
      const int64_t share = (lines + passes - 1) / passes;  // lines per pass
      // The widest spacing that still covers the share (at worst a line a pass too many,
      // which the next pass prefetches again).
      const int64_t room = (ke - kb) / share;
      int64_t t = 0;
      for (int64_t i = 0; i < passes; ++i) {
        const int tb = static_cast<int>((n - t + passes - i - 1) / (passes - i));
        const char* pf = next_block + i * share * kLineBytes;
        float* a = acc + t * ldacc;
        const float* xt = x + t * ldx;
        if (room >= 8) {
          tile<P, 8>(tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
        } else if (room >= 4) {
          tile<P, 4>(tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
        } else {
          tile<P, 2>(tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
        }
        t += tb;
      }
    }
  } else {
    XDS_CHECK(false, "panel group: {} tokens on {} panels", n, P);
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
