// panels_linear_bf16 (linear_panels.h): bf16 activations against BF16 panels with the
// AVX512-BF16 dot product, two columns per instruction.
//
// Columns c and c + 1 of a pair of panels are two adjacent 64-byte lines, each a column of
// the first panel (words 0-15, in the pair order of tensor/matrix.h: word 2j row j, word
// 2j + 1 row 8 + j) and of the second (words 16-31). One vpermt2w per panel interleaves its
// halves of the two lines,
//   z.word[2i] = column c's word i,  z.word[2i + 1] = column c + 1's word i,
// and vdpbf16ps with the broadcast pair (x[t][c], x[t][c + 1]) adds
//   w[c][i] x[t][c] + w[c + 1][i] x[t][c + 1]
// to lane i: the lanes are in the fp32 tiles' order, so their accumulator loads and stores
// (panel_tiles.h) serve here too. Per two columns a tile of T tokens costs two loads, two
// permutes and 2 T dot products; the fp32 tile spends four widening instructions and 4 T
// fused multiply-adds on the same work (where the CPU runs the dot product at twice the
// FMA's rate).
//
// Sums: per lane, the pairs in ascending c, each added with the instruction's roundings;
// the k blocks and token blocks are the same for every n, so a token's result never
// depends on the other tokens of the call (bit-exact batch invariance, as the fp32 path).
// An odd last column pairs with zeros (weights and x both).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/panel_driver.h"
#include "kernels/cpu/panel_tiles.h"
#include "kernels/cpu/static_dispatch.h"

namespace xds::kernels {

#if defined(__AVX512BF16__)

namespace {

using panel_detail::Bf16Format;
using panel_detail::kKBlock;  // columns per block when several tiles share it: 2 × 16 KB
using panel_detail::kLineBytes;

constexpr int kMaxTokens = 12;  // per tile: 12 × 2 panels = 24 accumulators
// Tokens up to which a pair is read with no software prefetch, the hardware prefetcher
// alone. At one token, with the weights in 2 MB pages, the prefetch is level here (the fp32
// kernels prefetch at every count: panel_driver.h); a pair is one stream with or without
// the prefetch, and from two tokens the prefetch wins (bench-2.6b's batch-4 decode; docs/
// benchmarks.md, "Measurements behind choices in the code").
constexpr int64_t kSingleStreamTokens = 1;
constexpr int64_t kAheadCols = panel_detail::kPrefetchCols<Bf16Format>;  // a single pass's

// Where and how often a tile prefetches: the two lines of a column pair every `every`
// column pairs, `pairs` times in all, from `at`.
struct Prefetch {
  const char* at;
  int64_t every;
  int64_t pairs;
};

// The pair (x[c], x[c + 1]) as one 32-bit value (one load, which the dot product takes
// as a broadcast operand); with only c in the row, (x[c], 0).
__attribute__((always_inline)) inline int32_t x_pair(const uint16_t* xr, int64_t c, bool both) {
  if (both) {
    int32_t v;
    std::memcpy(&v, xr + c, sizeof v);
    return v;
  }
  return xr[c];
}

// acc[t][lane i of panel p] (+)= Σ over column pairs in [kb, ke) as above, for T tokens of
// x (row stride ldx) and the pair of panels at w (its column 0).
template <int T>
void dot_tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t kb, int64_t ke, bool first,
              float* y, int64_t ldy, Prefetch pf) {
  __m512 a0[T], a1[T];
  panel_detail::load_accumulators<T, 2>(a0, a1, y, ldy, first);
  // Columns c and c + 1 (two lines; with only c, zeros beside it) as 16 pairs per panel.
  auto pair = [&](int64_t c, bool both) __attribute__((always_inline)) {
    const __m512i l0 = _mm512_loadu_si512(w + c * kPairStride);
    const __m512i l1 =
        both ? _mm512_loadu_si512(w + (c + 1) * kPairStride) : _mm512_setzero_si512();
    const auto v = reinterpret_cast<__m512bh>(interleave_pair_columns<0>(l0, l1));
    const auto v2 = reinterpret_cast<__m512bh>(interleave_pair_columns<1>(l0, l1));
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512bh xb =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(x_pair(x + t * ldx, c, both)));
      a0[t] = _mm512_dpbf16_ps(a0[t], v, xb);
      a1[t] = _mm512_dpbf16_ps(a1[t], v2, xb);
    }
  };
  int64_t c = kb, countdown = pf.every;
  for (; c + 2 <= ke; c += 2) {
    if (pf.pairs > 0 && --countdown == 0) {
      _mm_prefetch(pf.at, _MM_HINT_T0);
      _mm_prefetch(pf.at + kLineBytes, _MM_HINT_T0);
      pf.at += 2 * kLineBytes;
      --pf.pairs;
      countdown = pf.every;
    }
    pair(c, true);
  }
  if (c < ke) pair(c, false);  // the odd last column, with zeros beside it
  panel_detail::store_accumulators<T, 2>(a0, a1, y, ldy);
}

// (kMax: the most tokens a caller passes, which bounds the instantiations.)
template <int kMax = kMaxTokens>
void tile(int tb, const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t kb, int64_t ke,
          bool first, float* y, int64_t ldy, Prefetch pf) {
  const bool ran =
      dispatch_1_to<kMax>(tb, [&]<int T>() { dot_tile<T>(x, ldx, w, kb, ke, first, y, ldy, pf); });
  XDS_CHECK(ran, "bf16 dot tile: {} tokens", tb);
}

// All n tokens against the pair [p, p + 2), accumulating into acc [n][32] (stride ldacc).
// Up to kSingleStreamTokens: one pass, no software prefetch. Up to kMaxTokens: one pass,
// prefetching kAheadCols ahead (running on into the next pair). More: blocks of kKBlock
// columns, each read by balanced tiles of at most kMaxTokens tokens; the first tile reads
// the block from memory, the others from L1, and all of them prefetch the next block in
// equal shares so that memory keeps streaming while they compute.
void dot_pair(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
              int64_t ldacc) {
  const int64_t cols = w.cols;
  const uint16_t* wp = panel_detail::panel_ptr<Bf16Format>(w, p);
  const auto bytes = [](const uint16_t* at) { return reinterpret_cast<const char*>(at); };
  const int tb = static_cast<int>(std::min<int64_t>(n, kMaxTokens));
  if (n <= kSingleStreamTokens)
    return tile<kSingleStreamTokens>(tb, x, ldx, wp, 0, cols, true, acc, ldacc, {nullptr, 1, 0});
  if (n <= kMaxTokens) {
    return tile(tb, x, ldx, wp, 0, cols, true, acc, ldacc,
                {bytes(wp + kAheadCols * kPairStride), 1, INT64_MAX});
  }
  const int64_t passes = (n + kMaxTokens - 1) / kMaxTokens;
  for (int64_t kb = 0; kb < cols; kb += kKBlock) {
    const int64_t ke = std::min(cols, kb + kKBlock);
    // The next block: this pair's, or after the last block the next pair's start.
    const char* next = ke < cols ? bytes(wp + ke * kPairStride)
                                 : bytes(panel_detail::panel_ptr<Bf16Format>(w, p + 2));
    const int64_t next_cols = ke < cols ? std::min(kKBlock, cols - ke) : kKBlock;
    const int64_t share = ((next_cols + 1) / 2 + passes - 1) / passes;  // column pairs per pass
    const int64_t pairs = (ke - kb + 1) / 2;
    const int64_t every = std::max<int64_t>(1, pairs / share);
    int64_t t = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const int b = static_cast<int>((n - t + passes - i - 1) / (passes - i));
      const Prefetch pf{next + i * share * 2 * kLineBytes, every, share};
      tile(b, x + t * ldx, ldx, wp, kb, ke, kb == 0, acc + t * ldacc, ldacc, pf);
      t += b;
    }
  }
}

}  // namespace

bool panels_dot_available() {
  return true;
}

void panels_linear_bf16(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w,
                        int64_t p_begin, int64_t p_end, float* y, int64_t ldy) {
  XDS_CHECK(w.layout == MatrixLayout::kPanels16 && w.dtype == DType::kBF16,
            "panels_linear_bf16: weights are not BF16 panels");
  panel_detail::check_whole_pairs(w, p_begin, p_end);
  if (n <= 0 || p_begin >= p_end) return;
  panel_detail::each_pair(n, w, p_begin, p_end, y, ldy, [&](int64_t p, float* acc, int64_t ldacc) {
    dot_pair(x, n, ldx, w, p, acc, ldacc);
  });
}

#else

bool panels_dot_available() {
  return false;
}

void panels_linear_bf16(const uint16_t*, int64_t, int64_t, const MatrixRef&, int64_t, int64_t,
                        float*, int64_t) {
  XDS_CHECK(false, "panels_linear_bf16: this build has no AVX512_BF16");
}

#endif

bool panels_dot_for(const MatrixRef& w) {
  return w.layout == MatrixLayout::kPanels16 && w.dtype == DType::kBF16 && panels_dot_available() &&
         panel_isa() == PanelIsa::kAvx512;
}

}  // namespace xds::kernels
