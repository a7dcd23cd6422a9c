// panels_linear_bf16 (linear_panels.h): bf16 activations against BF16 panels with the
// AVX512-BF16 dot product, two columns per instruction.
//
// Columns c and c + 1 of a panel are 64 adjacent bytes, each 16 elements in the pair order
// of tensor/matrix.h (word 2j row j, word 2j + 1 row 8 + j). One vpermw interleaves them,
//   z.word[2i] = column c's word i,  z.word[2i + 1] = column c + 1's word i,
// and vdpbf16ps with the broadcast pair (x[t][c], x[t][c + 1]) adds
//   w[c][i] x[t][c] + w[c + 1][i] x[t][c + 1]
// to lane i: the lanes are in the fp32 tiles' order, so their accumulator loads and stores
// (panel_tiles.h) serve here too. Per two columns a tile of T tokens × P panels costs P
// loads, P permutes and T × P dot products; the fp32 tile spends 2P widening instructions
// and 2 T P fused multiply-adds on the same work (where the dot product runs at twice the
// FMA's rate, as on Zen 4/5).
//
// Sums: per lane, the pairs in ascending c, each added with the instruction's roundings;
// the k blocks and token blocks are the same for every n, so a token's result never
// depends on the other tokens of the call (bit-exact batch invariance, as the fp32 path).
// An odd last column pairs with zeros (weights and x both, so nothing is read past a row).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

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
// Tokens up to which the panels are read as one sequential stream (one panel at a time, no
// software prefetch), as panel_driver.h's kSingleStreamTokens for the fp32 kernels but to 4
// tokens: a dot product per pair of columns leaves more room. One thread on Zen 4, 1 GB of
// BF16 panels, GB/s with one stream against two panels and the prefetch: 2048 x 512 at 1-4
// tokens 31-34 vs 19-20, 512 x 2048 31-24 vs 26-24, 3072 x 768 31-27 vs 23-22; at 6 tokens
// the two panels win (24 vs 20 at 512 x 2048). A plain sum: 30-33.
constexpr int64_t kSingleStreamTokens = 4;
constexpr int64_t kColumnBytes = Bf16Format::kColumnBytes;
constexpr int64_t kAheadCols = panel_detail::kPrefetchCols<Bf16Format>;  // a single pass's

// Where and how often a tile prefetches: a line every `every` column pairs, `lines` in all,
// from `at` (and at + second_panel for two panels).
struct Prefetch {
  const char* at;
  int64_t every;
  int64_t lines;
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
// x (row stride ldx) and panels w, w + cols · 16 (P = 2).
template <int T, int P>
void dot_tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t kb,
              int64_t ke, bool first, float* y, int64_t ldy, Prefetch pf) {
  static_assert(P == 1 || P == 2);
  __m512 a0[T], a1[T];
  panel_detail::load_accumulators<T, P>(a0, a1, y, ldy, first);
  const uint16_t* w2 = w + cols * kPanelRows;
  const int64_t second_panel = cols * kColumnBytes;
  // Columns c and c + 1 (64 adjacent bytes) as 16 pairs (w[c][i], w[c + 1][i]).
  auto pair = [&](int64_t c, __mmask32 words, bool both) __attribute__((always_inline)) {
    const __m512bh v = reinterpret_cast<__m512bh>(
        interleave_halves(_mm512_maskz_loadu_epi16(words, w + c * kPanelRows)));
    __m512bh v2;
    if constexpr (P == 2)
      v2 = reinterpret_cast<__m512bh>(
          interleave_halves(_mm512_maskz_loadu_epi16(words, w2 + c * kPanelRows)));
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512bh xb =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(x_pair(x + t * ldx, c, both)));
      a0[t] = _mm512_dpbf16_ps(a0[t], v, xb);
      if constexpr (P == 2) a1[t] = _mm512_dpbf16_ps(a1[t], v2, xb);
    }
  };
  int64_t c = kb, countdown = pf.every;
  for (; c + 2 <= ke; c += 2) {
    if (pf.lines > 0 && --countdown == 0) {
      _mm_prefetch(pf.at, _MM_HINT_T0);
      if constexpr (P == 2) _mm_prefetch(pf.at + second_panel, _MM_HINT_T0);
      pf.at += kLineBytes;
      --pf.lines;
      countdown = pf.every;
    }
    pair(c, ~__mmask32{0}, true);
  }
  if (c < ke) pair(c, 0xffff, false);  // the odd last column, with zeros beside it
  panel_detail::store_accumulators<T, P>(a0, a1, y, ldy);
}

// (kMax: the most tokens a caller passes, which bounds the instantiations.)
template <int P, int kMax = kMaxTokens>
void tile(int tb, const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t cols, int64_t kb,
          int64_t ke, bool first, float* y, int64_t ldy, Prefetch pf) {
  const bool ran = dispatch_1_to<kMax>(
      tb, [&]<int T>() { dot_tile<T, P>(x, ldx, w, cols, kb, ke, first, y, ldy, pf); });
  XDS_CHECK(ran, "bf16 dot tile: {} tokens", tb);
}

// All n tokens against panels [p, p + P), accumulating into acc [n][16P] (stride ldacc).
// Up to kMaxTokens tokens: one pass along the panels, prefetching kAheadCols ahead (for
// two panels, the last stretch prefetches the next two panels' starts). More: blocks of
// kKBlock columns, each read by balanced tiles of at most kMaxTokens tokens; the first
// tile reads the block from memory, the others from L1, and all of them prefetch the next
// block in equal shares so that memory keeps streaming while they compute.
template <int P>
void dot_group(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
               int64_t ldacc) {
  const int64_t cols = w.cols;
  const uint16_t* wp = panel_detail::panel_ptr<Bf16Format>(w, p);
  const auto bytes = [](const uint16_t* at) { return reinterpret_cast<const char*>(at); };
  constexpr int64_t kEveryPair = 1;  // a pair of columns is one line per panel
  if (n <= kMaxTokens) {
    const int tb = static_cast<int>(n);
    const Prefetch ahead{bytes(wp + kAheadCols * kPanelRows), kEveryPair, INT64_MAX};
    if (P == 1 || cols <= kAheadCols) {
      tile<P>(tb, x, ldx, wp, cols, 0, cols, true, acc, ldacc, ahead);
      return;
    }
    const int64_t tail = (cols - kAheadCols) & ~int64_t{1};  // pairs stay aligned to kb
    tile<P>(tb, x, ldx, wp, cols, 0, tail, true, acc, ldacc, ahead);
    tile<P>(tb, x, ldx, wp, cols, tail, cols, false, acc, ldacc,
            Prefetch{bytes(panel_detail::panel_ptr<Bf16Format>(w, p + 2)), kEveryPair, INT64_MAX});
    return;
  }
  const int64_t passes = (n + kMaxTokens - 1) / kMaxTokens;
  for (int64_t kb = 0; kb < cols; kb += kKBlock) {
    const int64_t ke = std::min(cols, kb + kKBlock);
    // The next block: this panel's, or after the last block the next P panels' starts.
    const char* next = ke < cols ? bytes(wp + ke * kPanelRows)
                                 : bytes(panel_detail::panel_ptr<Bf16Format>(w, p + P));
    const int64_t next_cols = ke < cols ? std::min(kKBlock, cols - ke) : kKBlock;
    const int64_t lines = (next_cols * kColumnBytes + kLineBytes - 1) / kLineBytes;
    const int64_t share = (lines + passes - 1) / passes;
    const int64_t pairs = (ke - kb + 1) / 2;
    const int64_t every = std::max<int64_t>(1, pairs / share);
    int64_t t = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const int tb = static_cast<int>((n - t + passes - i - 1) / (passes - i));
      const Prefetch pf{next + i * share * kLineBytes, every, share};
      tile<P>(tb, x + t * ldx, ldx, wp, cols, kb, ke, kb == 0, acc + t * ldacc, ldacc, pf);
      t += tb;
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
  if (n <= 0 || p_begin >= p_end) return;
  const int64_t full_end = std::min(p_end, w.rows / kPanelRows);  // panels with 16 real rows
  int64_t p = p_begin;
  if (n <= kSingleStreamTokens) {  // one panel after the other, no prefetch
    for (; p < full_end; ++p)
      tile<1, kSingleStreamTokens>(static_cast<int>(n), x, ldx,
                                   panel_detail::panel_ptr<Bf16Format>(w, p), w.cols, 0, w.cols,
                                   true, y + p * kPanelRows, ldy, Prefetch{nullptr, 1, 0});
  }
  for (; p + 2 <= full_end; p += 2) dot_group<2>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  if (p < full_end) {
    dot_group<1>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
    ++p;
  }
  if (p < p_end) {  // the zero-padded last panel: accumulate aside, copy the real rows
    thread_local std::vector<float> tail;
    tail.resize(static_cast<size_t>(n * kPanelRows));
    dot_group<1>(x, n, ldx, w, p, tail.data(), kPanelRows);
    panel_detail::copy_padded_panel(tail.data(), n, w, p, y, ldy);
  }
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
