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
                                         // panel: 16 KB of panel + 6 × 2 KB of x stay in L1 (AVX2)
// Software prefetch distance along a panel for a single pass (4 KB ahead, a line per 64
// bytes of columns; it runs on into the next panel, which is what is read next). A cold
// two-thread A/B of 64-256 BF16 columns against none gave +10-25 % at 1, 3 and 6 tokens
// (docs/design/cpu_kernels.md).
template <class Fmt>
inline constexpr int64_t kPrefetchCols = 4096 / Fmt::kColumnBytes;

// Tokens up to which a call reads its panels as one sequential stream: one panel at a time
// (P = 1), no software prefetch, the hardware prefetcher alone. On Zen 4 one thread at one
// token streamed 1 GB of BF16 panels at 28-30 GB/s this way (the fp32 kernel; the dot-product
// kernel 31-34) against 20-26 with two panels and the 4 KB prefetch, a plain sum of the
// same bytes 31-33 (/tmp scratch runs, docs/design/cpu_kernels.md "One stream at one
// token"). At two tokens one stream still won on short panels (at most 768 columns: 2048 x
// 512 25.8 vs 19.6 GB/s, 3072 x 768 25.2 vs 21.5) and lost on long ones (2048 x 2048 22.0
// vs 25.4); from three tokens on two panels won or tied. The per-lane sums are the same
// either way, so a token's bits do not depend on it.
inline constexpr int64_t kSingleStreamTokens = 1;
inline constexpr int64_t kShortPanelCols = 768, kShortPanelStreamTokens = 2;
static_assert(kSingleStreamTokens <= kShortPanelStreamTokens);
inline bool single_stream(int64_t n, const MatrixRef& w) {
  return n <= kSingleStreamTokens || (n <= kShortPanelStreamTokens && w.cols <= kShortPanelCols);
}

template <class Fmt>
inline const typename Fmt::Elem* panel_ptr(const MatrixRef& w, int64_t p) {
  return static_cast<const typename Fmt::Elem*>(w.data) + p * w.cols * kPanelRows;
}

// All n tokens against panels [p, p + P), accumulating into acc [n][16P] (row stride ldacc).
//
// Up to the tile's token limit for P (Isa::kMaxTokens, kMaxTokensTwoPanels): one pass
// straight through the panels, prefetching kPrefetchCols columns ahead. More: the panels are
// walked in k blocks of kKBlock columns, each read by ceil(n / limit) passes of balanced
// token blocks (7 tokens as 4 + 3, not 6 + 1).
// Only the first pass of a block reads it from memory, the others find it in L1, so the
// next block's lines are prefetched in equal shares by all the block's passes: the memory
// stream keeps flowing while the later passes compute. (Prefetching from the first pass
// only left memory idle during the others: at batch 64 the experts' time was close to
// their compute time plus their memory time.)
template <class Isa, int P, class Fmt>
void panel_group(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
                 int64_t ldacc) {
  const int64_t cols = w.cols;
  const auto* wp = panel_ptr<Fmt>(w, p);
  const Fmt f = Fmt::of(w, p);
  constexpr int64_t kColumnBytes = Fmt::kColumnBytes, kAhead = kPrefetchCols<Fmt>;
  if (n <= (P == 1 ? Isa::kMaxTokens : Isa::kMaxTokensTwoPanels)) {
    constexpr int kG = kLineBytes / kColumnBytes;  // columns per line
    const int tb = static_cast<int>(n);
    const char* ahead = reinterpret_cast<const char*>(wp + kAhead * kPanelRows);
    if (P == 1 || cols <= kAhead) {  // one panel's prefetch runs on into the next one
      tile<Isa, P, kG>(f, tb, x, ldx, wp, cols, 0, cols, true, acc, ldacc, ahead);
      return;
    }
    // Two panels: while their last kPrefetchCols columns run, the prefetches go to the starts
    // of the next two panels (panel p's would run on into p + 1, which the second stream
    // has read by then, and p + 3's start would come unprefetched).
    const int64_t tail = cols - kAhead;
    tile<Isa, P, kG>(f, tb, x, ldx, wp, cols, 0, tail, true, acc, ldacc, ahead);
    tile<Isa, P, kG>(f, tb, x, ldx, wp, cols, tail, cols, false, acc, ldacc,
                     reinterpret_cast<const char*>(panel_ptr<Fmt>(w, p + 2)));
    return;
  }
  constexpr int kPassTokens = P == 1 ? Isa::kMaxTokens : Isa::kMaxTokensTwoPanels;
  const int64_t passes = (n + kPassTokens - 1) / kPassTokens;
  // After the last block: the next group's panels (p + P, and p + P + 1 at the second
  // panel's offset), which are read next.
  const char* next_group = reinterpret_cast<const char*>(panel_ptr<Fmt>(w, p + P));
  for (int64_t kb = 0; kb < cols; kb += kKBlock) {
    const int64_t ke = std::min(cols, kb + kKBlock);
    // The next block starts right after this one in each panel.
    const char* next_block =
        ke < cols ? reinterpret_cast<const char*>(wp + ke * kPanelRows) : next_group;
    const int64_t lines = ((ke - kb) * kColumnBytes + kLineBytes - 1) / kLineBytes;
    const int64_t share = (lines + passes - 1) / passes;  // lines per pass (per panel)
    // The widest spacing that still covers the share (at worst a line a pass too many,
    // which the next pass prefetches again).
    const int64_t room = (ke - kb) / share;
    int64_t t = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const int tb = static_cast<int>((n - t + passes - i - 1) / (passes - i));
      const char* pf = next_block + i * share * kLineBytes;
      float* a = acc + t * ldacc;
      const float* xt = x + t * ldx;
      // With two passes or more a whole block leaves room for a line every 4 BF16 columns
      // (8 FP8 ones); only a short last block would take a denser spacing, not worth its
      // tile instantiations (each spacing is 8 per ISA: compile time under ASan).
      if (Fmt::kColumnBytes < 32 || room >= 8) {
        tile<Isa, P, 8>(f, tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
      } else {
        tile<Isa, P, 4>(f, tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
      }
      t += tb;
    }
  }
}

// The real rows of the zero-padded last panel p, accumulated aside in tail [n][16], to y.
inline void copy_padded_panel(const float* tail, int64_t n, const MatrixRef& w, int64_t p, float* y,
                              int64_t ldy) {
  const int64_t real = w.rows - p * kPanelRows;
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(y + t * ldy + p * kPanelRows, tail + t * kPanelRows,
                sizeof(float) * static_cast<size_t>(real));
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
// token tiles (panel_tiles.h, wide path) instead of once per tile.
inline constexpr int64_t kWideMinTokens = 16;
inline constexpr int64_t kWideMinRows = 256;

#if defined(__AVX512F__)
inline constexpr int64_t kWideKBlock =
    256;  // columns per widened block: 2 panels = 32 KB fp32 (L1)
// Tokens per block of the wide path: their packed rows (~768 KB) stay in L2 while the block
// runs over all the call's panels, so each x element is read from L2 once per panel pair;
// but at least 8 tiles, so that a widened block serves 96 tokens (at 6144 columns 768 KB
// were 2 tiles, and the widening cost a fifth of the tiles' time; with 8 the packed rows
// spill to L3, which streams them fast enough: one-thread 256 x 6144, 96 tokens, 109 ->
// 125 GFLOP/s).
inline constexpr int64_t kWideXBytes = 768 * 1024;
inline constexpr int64_t kWideMinTilesPerBlock = 8;

// Panels [p, p + P) for the tiles [i0, i1) (xp, acc: the whole call's).
template <int P, class Fmt>
void wide_panels(const float* xp, const TokenTiles& tiles, int64_t i0, int64_t i1,
                 const MatrixRef& w, int64_t p, float* acc, int64_t ldacc, float* ws) {
  const int64_t cols = w.cols;
  const auto* wp = panel_ptr<Fmt>(w, p);
  const Fmt f = Fmt::of(w, p);
  constexpr int64_t kColumnBytes = Fmt::kColumnBytes;
  for (int64_t kb = 0; kb < cols; kb += kWideKBlock) {
    const int64_t ke = std::min(cols, kb + kWideKBlock);
    // While the tiles run, the next block's lines (of each panel; after the last block the
    // next P panels' first) are prefetched in equal shares, as panel_group does: a line
    // every 4 columns, 64 lines per panel and tile, enough for a share from 2 tiles on (a
    // lone tile leaves half the block to the hardware prefetcher; with 8 tiles, up to 3 in 4
    // prefetches find their line already on its way, which costs an instruction each). One
    // spacing, not 8 or 4 by the share: each spacing is 24 more tile instantiations, and
    // this file took 150 s to compile under ASan.
    const char* next = ke < cols ? reinterpret_cast<const char*>(wp + ke * kPanelRows)
                                 : reinterpret_cast<const char*>(panel_ptr<Fmt>(w, p + P));
    const int64_t next_cols = ke < cols ? std::min(kWideKBlock, cols - ke) : kWideKBlock;
    const int64_t lines = (next_cols * kColumnBytes + kLineBytes - 1) / kLineBytes;
    const int64_t share = (lines + (i1 - i0) - 1) / (i1 - i0);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = tiles.first(i);
      const int tb = tiles.size(i);
      const float* x = xp + t * cols;
      float* a = acc + t * ldacc;
      const char* pf = next + (i - i0) * share * kLineBytes;
      const bool first = kb == 0;
      // A line every 4 columns. For FP8 that is twice the lines a block has (the later
      // tiles' prefetches find theirs in flight, an instruction each); a spacing of 8 for
      // FP8 took this file's ASan compile from ~100 to ~170 s.
      constexpr int kG = 4;
      if (i == i0) {  // widens the block into ws as it goes
        wide_tile<P, kG, true>(f, tb, x, wp, cols, ws, kb, ke, first, a, ldacc, pf);
      } else {
        wide_tile<P, kG, false>(f, tb, x, wp, cols, ws, kb, ke, first, a, ldacc, pf);
      }
    }
  }
}

// Panels [p_begin, p_end) for all packed tokens, in blocks of tiles; a zero-padded last
// panel accumulates aside and only its real rows are copied to y.
template <class Fmt>
void wide_linear(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end,
                 float* y, int64_t ldy) {
  alignas(64) thread_local float ws[kWideKBlock * 2 * kPanelRows];
  thread_local std::vector<float> tail;
  const int64_t full_end = std::min(p_end, w.rows / kPanelRows);
  const TokenTiles tiles{n};
  const int64_t tile_bytes = kWideTileTokens * w.cols * static_cast<int64_t>(sizeof(float));
  const int64_t per_block = std::max(kWideMinTilesPerBlock, kWideXBytes / tile_bytes);
  for (int64_t i0 = 0; i0 < tiles.count(); i0 += per_block) {
    const int64_t i1 = std::min(tiles.count(), i0 + per_block);
    int64_t p = p_begin;
    for (; p + 2 <= full_end; p += 2)
      wide_panels<2, Fmt>(xp, tiles, i0, i1, w, p, y + p * kPanelRows, ldy, ws);
    if (p < full_end) {
      wide_panels<1, Fmt>(xp, tiles, i0, i1, w, p, y + p * kPanelRows, ldy, ws);
      ++p;
    }
    if (p < p_end) {
      tail.resize(static_cast<size_t>(n * kPanelRows));
      wide_panels<1, Fmt>(xp, tiles, i0, i1, w, p, tail.data(), kPanelRows, ws);
    }
  }
  if (full_end < p_end) copy_padded_panel(tail.data(), n, w, full_end, y, ldy);
}
#endif

template <class Isa, class Fmt>
void panels_linear_on(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                      int64_t p_end, float* y, int64_t ldy) {
  const int64_t full_end = std::min(p_end, w.rows / kPanelRows);  // panels with 16 real rows
  int64_t p = p_begin;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Isa, Avx512>) {
    if (wide_path_for(n, w)) {
      thread_local std::vector<float> xp;
      xp.resize(static_cast<size_t>(n * w.cols));
      pack_token_tiles(x, n, ldx, w.cols, 0, token_tile_count(n), xp.data());
      return wide_linear<Fmt>(xp.data(), n, w, p, p_end, y, ldy);
    }
  }
#endif
  // Two panels per tile (two streams) for few tokens, and with AVX-512 for any count that
  // does not take the wide path (kTwoPanelPasses: with 32 registers a two-panel pass holds
  // 12 tokens, and loads one widened column per 12 FMAs against one per 8). AVX2, three
  // tokens on two panels against one: 56.7/57.2/57.7 % vs 53.7/50.6/54.5 % of the batch-16
  // roofline in three interleaved pairs (19:03 UTC, 2026-12-02).
  if (single_stream(n, w)) {  // one panel after the other, no software prefetch
    for (; p < full_end; ++p) {
      tile<Isa, 1, kNoPrefetch, kShortPanelStreamTokens>(Fmt::of(w, p), static_cast<int>(n), x, ldx,
                                                         panel_ptr<Fmt>(w, p), w.cols, 0, w.cols,
                                                         true, y + p * kPanelRows, ldy, nullptr);
    }
  }
  if (n <= Isa::kMaxTokensTwoPanels || Isa::kTwoPanelPasses) {
    for (; p + 2 <= full_end; p += 2)
      panel_group<Isa, 2, Fmt>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  }
  for (; p < full_end; ++p) panel_group<Isa, 1, Fmt>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  if (p < p_end) {  // the zero-padded last panel: accumulate aside, copy the real rows
    thread_local std::vector<float> tail;
    tail.resize(static_cast<size_t>(n * kPanelRows));
    panel_group<Isa, 1, Fmt>(x, n, ldx, w, p, tail.data(), kPanelRows);
    copy_padded_panel(tail.data(), n, w, p, y, ldy);
  }
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
