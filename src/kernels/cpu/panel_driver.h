// The drivers of the panel linear layers (internal to linear_panels*.cc): token blocking,
// k blocks, prefetch shares and the wide path over the micro-kernels of panel_tiles.h, as
// templates on the weights' format. linear_panels.cc instantiates them for BF16 panels,
// linear_panels_fp8.cc for FP8 ones (apart: each set is dozens of tile instantiations).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/panel_tiles.h"

namespace xds::kernels::panel_detail {

inline constexpr int64_t kKBlock = 512;  // columns per pass when several token blocks share a
                                         // pair: 32 KB of BF16 pair + the tokens' x in L1
// Columns of a pair per 64-byte line (BF16 and F16: 1, FP8: 2).
template <class Fmt>
inline constexpr int kPairColumnsPerLine = static_cast<int>(kLineBytes / (2 * Fmt::kColumnBytes));

// Software prefetch distance along a pair for a single pass: 8 KB ahead, a line per line of
// columns; it runs on into the next pair, which is what is read next. Cold weights read
// faster with the prefetch than without at 1, 3 and 6 tokens; on the pair's one stream 4 KB
// ahead falls behind two separate panel streams at 2-4 tokens on long panels, and 8 KB (the
// bytes in flight of two 4 KB streams) catches up (docs/benchmarks.md, "Measurements behind
// choices in the code").
template <class Fmt>
inline constexpr int64_t kPrefetchCols = 8192 / (2 * Fmt::kColumnBytes);

// Every token count reads its pairs with the software prefetch. With the weights in 4 KB
// pages one token streams faster on the hardware prefetcher alone; with the weights in 2 MB
// pages (advise_huge_pages) the prefetch wins at one and two tokens too (docs/benchmarks.md,
// "Measurements behind choices in the code"). The sums are the same either way. (The bf16
// dot kernel keeps its own rule: linear_panels_dot.cc, kSingleStreamTokens.)

// Panel p's column 0 (p + 1 follows at + 16 when p is even: the pair's other half).
template <class Fmt>
inline const typename Fmt::Elem* panel_ptr(const MatrixRef& w, int64_t p) {
  return static_cast<const typename Fmt::Elem*>(w.data) + w.panel_column(p, 0);
}

// The prefetch of the next block while `passes` passes run over the block [kb, ke) of the
// pair at wp: each pass prefetches an equal share of the next block's lines (after the last
// block, the lines from `after_last`: the next pair's start), so memory keeps streaming
// while the passes that read the block from L1 compute. `room`: columns of this block per
// line of the share, which bounds the spacing a pass can take and still cover it.
struct BlockPrefetch {
  const char* next;
  int64_t share;  // lines per pass
  int64_t room;
  template <class Fmt>
  static BlockPrefetch of(const typename Fmt::Elem* wp, int64_t kb, int64_t ke, int64_t cols,
                          const char* after_last, int64_t passes) {
    const char* next =
        ke < cols ? reinterpret_cast<const char*>(wp + ke * kPairStride) : after_last;
    const int64_t lines = ((ke - kb) * 2 * Fmt::kColumnBytes + kLineBytes - 1) / kLineBytes;
    const int64_t share = (lines + passes - 1) / passes;
    return {next, share, (ke - kb) / share};
  }
  const char* at(int64_t pass) const { return next + pass * share * kLineBytes; }
};

// tile<Isa, P, G> for one pass of a block, G the widest spacing that still covers the
// pass's share (at worst a line a pass too many, which the next pass prefetches again):
// with two passes or more a whole block leaves room for a line every 2 BF16 columns (4 FP8
// ones), with more passes every 4 (8); each spacing is 8 to 12 tile instantiations per ISA
// (compile time under ASan), so two.
template <class Isa, int P, class Fmt>
void spaced_tile(const BlockPrefetch& bp, int64_t pass, const Fmt& f, int tb, const float* x,
                 int64_t ldx, const typename Fmt::Elem* w, int64_t kb, int64_t ke, float* y,
                 int64_t ldy) {
  constexpr int kG = kPairColumnsPerLine<Fmt>;
  if (bp.room >= 4 * kG) {
    tile<Isa, P, 4 * kG>(f, tb, x, ldx, w, kb, ke, kb == 0, y, ldy, bp.at(pass));
  } else {
    tile<Isa, P, 2 * kG>(f, tb, x, ldx, w, kb, ke, kb == 0, y, ldy, bp.at(pass));
  }
}

// All n tokens against the pair [p, p + 2) (p even), accumulating into acc [n][32] (row
// stride ldacc).
//
// Up to the two-panel tile's token limit (Isa::kMaxTokensTwoPanels): one pass
// straight through the pair, prefetching kPrefetchCols columns ahead. More: the pair is
// walked in k blocks of kKBlock columns, each read by ceil(n / limit) passes of balanced
// token blocks (7 tokens as 4 + 3, not 6 + 1).
// Only the first pass of a block reads it from memory, the others find it in L1, so the
// next block's lines are prefetched in equal shares by all the block's passes: the memory
// stream keeps flowing while the later passes compute. (Prefetching from the first pass
// only leaves memory idle during the others: at batch 64 the experts' time then comes close
// to their compute time plus their memory time.)
template <class Isa, class Fmt>
void panel_group(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
                 int64_t ldacc) {
  const int64_t cols = w.cols;
  const auto* wp = panel_ptr<Fmt>(w, p);
  const Fmt f = Fmt::of(w, p);
  constexpr int kG = kPairColumnsPerLine<Fmt>;  // a prefetch per line
  if (n <= Isa::kMaxTokensTwoPanels) {
    const char* ahead = reinterpret_cast<const char*>(wp + kPrefetchCols<Fmt> * kPairStride);
    tile<Isa, 2, kG>(f, static_cast<int>(n), x, ldx, wp, 0, cols, true, acc, ldacc, ahead);
    return;
  }
  constexpr int kPassTokens = Isa::kMaxTokensTwoPanels;
  const int64_t passes = (n + kPassTokens - 1) / kPassTokens;
  const char* next_pair = reinterpret_cast<const char*>(panel_ptr<Fmt>(w, p + 2));
  for (int64_t kb = 0; kb < cols; kb += kKBlock) {
    const int64_t ke = std::min(cols, kb + kKBlock);
    const auto bp = BlockPrefetch::of<Fmt>(wp, kb, ke, cols, next_pair, passes);
    int64_t t = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const int tb = static_cast<int>((n - t + passes - i - 1) / (passes - i));
      spaced_tile<Isa, 2>(bp, i, f, tb, x + t * ldx, ldx, wp, kb, ke, acc + t * ldacc, ldacc);
      t += tb;
    }
  }
}

// AVX2 above its two-panel tile's 3 tokens: one panel per tile, the pair's two halves block
// by block (kKBlock columns), so that a block's lines come from memory once and the second
// half's passes find them in L1/L2; a whole pass per half would read the pair twice, from
// memory where the pair outgrows L2. Every pass of both halves prefetches an equal share of
// the next block (as panel_group). Same sums: each row is still its ascending-column chain.
template <class Isa, class Fmt>
void pair_by_halves(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p,
                    float* acc, int64_t ldacc) {
  const int64_t cols = w.cols;
  const auto* wp = panel_ptr<Fmt>(w, p);
  const Fmt halves[2] = {Fmt::of(w, p), Fmt::of(w, p + 1)};
  const int64_t per_half = (n + Isa::kMaxTokens - 1) / Isa::kMaxTokens;
  const char* next_pair = reinterpret_cast<const char*>(panel_ptr<Fmt>(w, p + 2));
  for (int64_t kb = 0; kb < cols; kb += kKBlock) {
    const int64_t ke = std::min(cols, kb + kKBlock);
    const auto bp = BlockPrefetch::of<Fmt>(wp, kb, ke, cols, next_pair, 2 * per_half);
    for (int h = 0; h < 2; ++h) {
      int64_t t = 0;
      for (int64_t j = 0; j < per_half; ++j) {
        const int tb = static_cast<int>((n - t + per_half - j - 1) / (per_half - j));
        spaced_tile<Isa, 1>(bp, h * per_half + j, halves[h], tb, x + t * ldx, ldx,
                            wp + h * kPanelRows, kb, ke, acc + t * ldacc + h * kPanelRows, ldacc);
        t += tb;
      }
    }
  }
}

// The pair [p, p + 2) for all n tokens into acc [n][32]: panel_group on the pair, or its panels one
// per tile where the instruction set's two-panel tile takes too few tokens (AVX2 above 3:
// its 16 registers hold 6 tokens of one panel, 3 of two: pair_by_halves). At three tokens
// two panels reach more of the batch-16 roofline than one (docs/benchmarks.md,
// "Measurements behind choices in the code").
template <class Isa, class Fmt>
void pair_product(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
                  int64_t ldacc) {
  if constexpr (Isa::kTwoPanelPasses) {  // AVX-512: never one panel (nor its instantiations)
    panel_group<Isa, Fmt>(x, n, ldx, w, p, acc, ldacc);
  } else {
    if (n <= Isa::kMaxTokensTwoPanels) return panel_group<Isa, Fmt>(x, n, ldx, w, p, acc, ldacc);
    pair_by_halves<Isa, Fmt>(x, n, ldx, w, p, acc, ldacc);
  }
}

// The pair whose 32 rows are not all real, p its first panel (the zero-padded last panel,
// or the zero panel closing an odd count): the products accumulate aside in tail [n][32]
// and only the real rows are copied to y.
inline int64_t whole_pairs_end(const MatrixRef& w, int64_t p_end) {
  return std::min(p_end, w.rows / kPairStride * 2);
}
inline void copy_real_rows(const float* tail, int64_t n, const MatrixRef& w, int64_t p, float* y,
                           int64_t ldy) {
  const int64_t real = std::min(kPairStride, w.rows - p * kPanelRows);
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(y + t * ldy + p * kPanelRows, tail + t * kPairStride,
                sizeof(float) * static_cast<size_t>(real));
}

// product(p, acc, ldacc) for each pair of [p_begin, p_end) (whole pairs): into y at the
// pair's rows, except the pair with padding, which accumulates aside in tail [n][32] and
// has only its real rows copied to y.
template <class Product>
void each_pair(int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end, float* y, int64_t ldy,
               Product&& product) {
  const int64_t full_end = whole_pairs_end(w, p_end);
  int64_t p = p_begin;
  for (; p < full_end; p += 2) product(p, y + p * kPanelRows, ldy);
  if (p < p_end) {
    thread_local std::vector<float> tail;
    tail.resize(static_cast<size_t>(n * kPairStride));
    product(p, tail.data(), kPairStride);
    copy_real_rows(tail.data(), n, w, p, y, ldy);
  }
}

// A range of panels of whole pairs (linear_panels.h).
inline void check_whole_pairs(const MatrixRef& w, int64_t p_begin, int64_t p_end) {
  XDS_CHECK(p_begin % 2 == 0 && (p_end % 2 == 0 || p_end == w.panels()) && p_end <= w.panels(),
            "panel linear: panels [{}, {}) of {} are not whole pairs", p_begin, p_end, w.panels());
}

// The wide path's token tiles: ceil(n / 12) of balanced sizes (26 = 9 + 9 + 8); tile i
// holds tokens [first(i), first(i + 1)) and is packed at xp + first(i) * cols.
struct TokenTiles {
  int64_t n;
  int64_t count() const { return (n + kWideTileTokens - 1) / kWideTileTokens; }
  int64_t first(int64_t i) const { return i * n / count(); }
  int size(int64_t i) const { return static_cast<int>(first(i + 1) - first(i)); }
};

// Tokens and rows from which the AVX-512 kernel widens each weight block once for all the
// token tiles (panel_tiles.h, wide path) instead of once per tile: prompt-sized products.
// The narrow tile's widening costs little (it runs close to a core's fp32 peak from 6
// tokens), and below ~128 tokens the narrow passes are level or faster; at 512 the wide path
// still wins (docs/design/cpu_kernels.md, "The wide path"; docs/benchmarks.md).
inline constexpr int64_t kWideMinTokens = 128;
inline constexpr int64_t kWideMinRows = 256;

#if defined(__AVX512F__)
inline constexpr int64_t kWideKBlock =
    256;  // columns per widened block: 2 panels = 32 KB fp32 (L1)
// Tokens per block of the wide path: their packed rows (~768 KB) stay in L2 while the block
// runs over all the call's panels, so each x element is read from L2 once per panel pair;
// but at least 8 tiles, so that a widened block serves 96 tokens (at 6144 columns 768 KB
// are 2 tiles, and the widening would cost a fifth of the tiles' time; with 8 the packed
// rows spill to L3, which streams them fast enough: docs/benchmarks.md, "Measurements behind
// choices in the code").
inline constexpr int64_t kWideXBytes = 768 * 1024;
inline constexpr int64_t kWideMinTilesPerBlock = 8;

// The pair [p, p + 2) for the tiles [i0, i1) (xp, acc: the whole call's).
template <class Fmt>
void wide_pair(const float* xp, const TokenTiles& tiles, int64_t i0, int64_t i1, const MatrixRef& w,
               int64_t p, float* acc, int64_t ldacc, float* ws) {
  const int64_t cols = w.cols;
  const auto* wp = panel_ptr<Fmt>(w, p);
  const Fmt f = Fmt::of(w, p);
  for (int64_t kb = 0; kb < cols; kb += kWideKBlock) {
    const int64_t ke = std::min(cols, kb + kWideKBlock);
    // While the tiles run, the next block's lines (after the last block the next pair's
    // first) are prefetched in equal shares, as panel_group does: a line every 2 BF16
    // columns (4 FP8 ones), 128 lines per tile (BF16), enough for a share from 2 tiles on (a
    // lone tile leaves half the block to the hardware prefetcher; with 8 tiles, up to 3 in 4
    // prefetches find their line already on its way, which costs an instruction each). One
    // spacing, not two by the share: each spacing is 12 more tile instantiations, and the
    // files that include this one are already slow to compile under ASan.
    const char* next = ke < cols ? reinterpret_cast<const char*>(wp + ke * kPairStride)
                                 : reinterpret_cast<const char*>(panel_ptr<Fmt>(w, p + 2));
    const int64_t next_cols = ke < cols ? std::min(kWideKBlock, cols - ke) : kWideKBlock;
    const int64_t lines = (next_cols * 2 * Fmt::kColumnBytes + kLineBytes - 1) / kLineBytes;
    const int64_t share = (lines + (i1 - i0) - 1) / (i1 - i0);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = tiles.first(i);
      const int tb = tiles.size(i);
      const float* x = xp + t * cols;
      float* a = acc + t * ldacc;
      const char* pf = next + (i - i0) * share * kLineBytes;
      const bool first = kb == 0;
      constexpr int kG = 2 * kPairColumnsPerLine<Fmt>;
      if (i == i0) {  // widens the block into ws as it goes
        wide_tile<2, kG, true>(f, tb, x, wp, ws, kb, ke, first, a, ldacc, pf);
      } else {
        wide_tile<2, kG, false>(f, tb, x, wp, ws, kb, ke, first, a, ldacc, pf);
      }
    }
  }
}

// Panels [p_begin, p_end) (whole pairs) for all packed tokens, in blocks of tiles; a pair
// with padding accumulates aside and only its real rows are copied to y.
template <class Fmt>
void wide_linear(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end,
                 float* y, int64_t ldy) {
  check_whole_pairs(w, p_begin, p_end);
  alignas(64) thread_local float ws[kWideKBlock * 2 * kPanelRows];
  thread_local std::vector<float> tail;
  const int64_t full_end = whole_pairs_end(w, p_end);
  const TokenTiles tiles{n};
  const int64_t tile_bytes = kWideTileTokens * w.cols * static_cast<int64_t>(sizeof(float));
  const int64_t per_block = std::max(kWideMinTilesPerBlock, kWideXBytes / tile_bytes);
  for (int64_t i0 = 0; i0 < tiles.count(); i0 += per_block) {
    const int64_t i1 = std::min(tiles.count(), i0 + per_block);
    int64_t p = p_begin;
    for (; p < full_end; p += 2)
      wide_pair<Fmt>(xp, tiles, i0, i1, w, p, y + p * kPanelRows, ldy, ws);
    if (p < p_end) {
      tail.resize(static_cast<size_t>(n * kPairStride));
      wide_pair<Fmt>(xp, tiles, i0, i1, w, p, tail.data(), kPairStride, ws);
    }
  }
  if (full_end < p_end) copy_real_rows(tail.data(), n, w, full_end, y, ldy);
}
#endif

template <class Isa, class Fmt>
void panels_linear_on(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                      int64_t p_end, float* y, int64_t ldy) {
  check_whole_pairs(w, p_begin, p_end);
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Isa, Avx512>) {
    if (wide_path_for(n, w)) {
      thread_local std::vector<float> xp;
      xp.resize(static_cast<size_t>(n * w.cols));
      pack_token_tiles(x, n, ldx, w.cols, 0, token_tile_count(n), xp.data());
      return wide_linear<Fmt>(xp.data(), n, w, p_begin, p_end, y, ldy);
    }
  }
#endif
  each_pair(n, w, p_begin, p_end, y, ldy, [&](int64_t p, float* acc, int64_t ldacc) {
    pair_product<Isa, Fmt>(x, n, ldx, w, p, acc, ldacc);
  });
}

// panels_linear for weight format Fmt on the selected instruction set.
template <class Fmt>
void panels_linear_selected(const float* x, int64_t n, int64_t ldx, const MatrixRef& w,
                            int64_t p_begin, int64_t p_end, float* y, int64_t ldy) {
#if defined(__AVX512F__)
  if (panel_isa() == PanelIsa::kAvx512)
    return panels_linear_on<Avx512, Fmt>(x, n, ldx, w, p_begin, p_end, y, ldy);
#endif
  panels_linear_on<Avx2, Fmt>(x, n, ldx, w, p_begin, p_end, y, ldy);
}

// The wide path's product for weight format Fmt (only where wide_path_for allows it).
template <class Fmt>
void wide_linear_checked(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin,
                         int64_t p_end, float* y, int64_t ldy) {
#if defined(__AVX512F__)
  wide_linear<Fmt>(xp, n, w, p_begin, p_end, y, ldy);
#else
  (void)xp, (void)n, (void)w, (void)p_begin, (void)p_end, (void)y, (void)ldy;
  XDS_CHECK(false, "wide_linear: built without AVX-512");
#endif
}

// The F16 and FP8 instantiations of the two above, each compiled in its own file
// (linear_panels_f16.cc, linear_panels_fp8.cc) apart from the BF16 ones (linear_panels.cc).
void panels_linear_f16(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                       int64_t p_end, float* y, int64_t ldy);
void wide_linear_f16(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end,
                     float* y, int64_t ldy);
void panels_linear_fp8(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                       int64_t p_end, float* y, int64_t ldy);
void wide_linear_fp8(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end,
                     float* y, int64_t ldy);

}  // namespace xds::kernels::panel_detail
