#include "kernels/cpu/linear_panels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/panel_tiles.h"

namespace xds::kernels {
namespace {

using panel_detail::kColumnBytes;
using panel_detail::kLineBytes;

constexpr int64_t kKBlock = 512;  // columns per pass when several token blocks share a panel:
                                  // 16 KB of panel + 6 × 2 KB of x stay in L1 (AVX2)
// Software prefetch distance along a panel for a single pass (4 KB ahead, one line per two
// columns; it runs on into the next panel, which is what is read next). A cold two-thread
// A/B of 64-256 columns against none gave +10-25 % at 1, 3 and 6 tokens
// (docs/design/cpu_kernels.md).
constexpr int64_t kPrefetchCols = 128;

std::atomic<PanelIsa> g_isa{panel_detail::kHaveAvx512 ? PanelIsa::kAvx512 : PanelIsa::kAvx2};

inline const uint16_t* panel_ptr(const MatrixRef& w, int64_t p) {
  return static_cast<const uint16_t*>(w.data) + p * w.cols * kPanelRows;
}

// All n tokens against panels [p, p + P), accumulating into acc [n][16P] (row stride ldacc).
//
// Up to Isa::kMaxTokens tokens: one pass straight through the panel, prefetching kPrefetchCols
// columns ahead. More: the panel is walked in k blocks of kKBlock columns, each read by
// ceil(n / Isa::kMaxTokens) passes of balanced token blocks (7 tokens as 4 + 3, not 6 + 1).
// Only the first pass of a block reads it from memory, the others find it in L1, so the
// next block's lines are prefetched in equal shares by all the block's passes: the memory
// stream keeps flowing while the later passes compute. (Prefetching from the first pass
// only left memory idle during the others: at batch 64 the experts' time was close to
// their compute time plus their memory time.)
template <class Isa, int P>
void panel_group(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p, float* acc,
                 int64_t ldacc) {
  const int64_t cols = w.cols;
  const uint16_t* wp = panel_ptr(w, p);
  using panel_detail::tile;
  if (n <= (P == 1 ? Isa::kMaxTokens : Isa::kMaxTokensTwoPanels)) {
    static_assert(kLineBytes / kColumnBytes == 2);  // one line per two columns
    const int tb = static_cast<int>(n);
    const char* ahead = reinterpret_cast<const char*>(wp + kPrefetchCols * kPanelRows);
    if (P == 1 || cols <= kPrefetchCols) {  // one panel's prefetch runs on into the next one
      tile<Isa, P, 2>(tb, x, ldx, wp, cols, 0, cols, true, acc, ldacc, ahead);
      return;
    }
    // Two panels: while their last kPrefetchCols columns run, the prefetches go to the starts
    // of the next two panels (panel p's would run on into p + 1, which the second stream
    // has read by then, and p + 3's start would come unprefetched).
    const int64_t tail = cols - kPrefetchCols;
    tile<Isa, P, 2>(tb, x, ldx, wp, cols, 0, tail, true, acc, ldacc, ahead);
    tile<Isa, P, 2>(tb, x, ldx, wp, cols, tail, cols, false, acc, ldacc,
                    reinterpret_cast<const char*>(panel_ptr(w, p + 2)));
    return;
  }
  if constexpr (P == 1) {
    const int64_t passes = (n + Isa::kMaxTokens - 1) / Isa::kMaxTokens;
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
          tile<Isa, P, 8>(tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
        } else if (room >= 4) {
          tile<Isa, P, 4>(tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
        } else {
          tile<Isa, P, 2>(tb, xt, ldx, wp, cols, kb, ke, kb == 0, a, ldacc, pf);
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

bool panel_isa_available(PanelIsa isa) {
  return isa == PanelIsa::kAvx2 || panel_detail::kHaveAvx512;
}

PanelIsa panel_isa() {
  return g_isa.load(std::memory_order_relaxed);
}

void set_panel_isa(PanelIsa isa) {
  XDS_CHECK(panel_isa_available(isa), "set_panel_isa: this build has no {}", panel_isa_name(isa));
  g_isa.store(isa, std::memory_order_relaxed);
}

const char* panel_isa_name(PanelIsa isa) {
  return isa == PanelIsa::kAvx512 ? "avx512" : "avx2";
}

namespace {

// The real rows of the zero-padded last panel p, accumulated aside in tail [n][16], to y.
void copy_padded_panel(const float* tail, int64_t n, const MatrixRef& w, int64_t p, float* y,
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
  int64_t count() const {
    return (n + panel_detail::kWideTileTokens - 1) / panel_detail::kWideTileTokens;
  }
  int64_t first(int64_t i) const { return i * n / count(); }
  int size(int64_t i) const { return static_cast<int>(first(i + 1) - first(i)); }
};

// Tokens and rows from which the AVX-512 kernel widens each weight block once for all the
// token tiles (panel_tiles.h, wide path) instead of once per tile.
constexpr int64_t kWideMinTokens = 16;
constexpr int64_t kWideMinRows = 256;

#if defined(__AVX512F__)
constexpr int64_t kWideKBlock = 256;  // columns per widened block: 2 panels = 32 KB fp32 (L1)
// Tokens per block of the wide path: their packed rows (~768 KB) stay in L2 while the block
// runs over all the call's panels, so each x element is read from L2 once per panel pair;
// but at least 8 tiles, so that a widened block serves 96 tokens (at 6144 columns 768 KB
// were 2 tiles, and the widening cost a fifth of the tiles' time; with 8 the packed rows
// spill to L3, which streams them fast enough: one-thread 256 x 6144, 96 tokens, 109 ->
// 125 GFLOP/s).
constexpr int64_t kWideXBytes = 768 * 1024;
constexpr int64_t kWideMinTilesPerBlock = 8;

// Panels [p, p + P) for the tiles [i0, i1) (xp, acc: the whole call's).
template <int P>
void wide_panels(const float* xp, const TokenTiles& tiles, int64_t i0, int64_t i1,
                 const MatrixRef& w, int64_t p, float* acc, int64_t ldacc, float* ws) {
  using namespace panel_detail;
  const int64_t cols = w.cols;
  const uint16_t* wp = panel_ptr(w, p);
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
                                 : reinterpret_cast<const char*>(panel_ptr(w, p + P));
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
      if (i == i0) {  // widens the block into ws as it goes
        wide_tile<P, 4, true>(tb, x, wp, cols, ws, kb, ke, first, a, ldacc, pf);
      } else {
        wide_tile<P, 4, false>(tb, x, wp, cols, ws, kb, ke, first, a, ldacc, pf);
      }
    }
  }
}

// Panels [p_begin, p_end) for all packed tokens, in blocks of tiles; a zero-padded last
// panel accumulates aside and only its real rows are copied to y.
void wide_linear(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end,
                 float* y, int64_t ldy) {
  alignas(64) thread_local float ws[kWideKBlock * 2 * kPanelRows];
  thread_local std::vector<float> tail;
  const int64_t full_end = std::min(p_end, w.rows / kPanelRows);
  const TokenTiles tiles{n};
  const int64_t tile_bytes =
      panel_detail::kWideTileTokens * w.cols * static_cast<int64_t>(sizeof(float));
  const int64_t per_block = std::max(kWideMinTilesPerBlock, kWideXBytes / tile_bytes);
  for (int64_t i0 = 0; i0 < tiles.count(); i0 += per_block) {
    const int64_t i1 = std::min(tiles.count(), i0 + per_block);
    int64_t p = p_begin;
    for (; p + 2 <= full_end; p += 2)
      wide_panels<2>(xp, tiles, i0, i1, w, p, y + p * kPanelRows, ldy, ws);
    if (p < full_end) {
      wide_panels<1>(xp, tiles, i0, i1, w, p, y + p * kPanelRows, ldy, ws);
      ++p;
    }
    if (p < p_end) {
      tail.resize(static_cast<size_t>(n * kPanelRows));
      wide_panels<1>(xp, tiles, i0, i1, w, p, tail.data(), kPanelRows, ws);
    }
  }
  if (full_end < p_end) copy_padded_panel(tail.data(), n, w, full_end, y, ldy);
}
#endif

template <class Isa>
void panels_linear_on(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                      int64_t p_end, float* y, int64_t ldy) {
  const int64_t full_end = std::min(p_end, w.rows / kPanelRows);  // panels with 16 real rows
  int64_t p = p_begin;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Isa, panel_detail::Avx512>) {
    if (wide_path_for(n, w)) {
      thread_local std::vector<float> xp;
      xp.resize(static_cast<size_t>(n * w.cols));
      pack_token_tiles(x, n, ldx, w.cols, 0, token_tile_count(n), xp.data());
      return wide_linear(xp.data(), n, w, p, p_end, y, ldy);
    }
  }
#endif
  // Few tokens: two panels per tile (two streams). AVX2, three tokens on two panels against
  // one: 56.7/57.2/57.7 % vs 53.7/50.6/54.5 % of the batch-16 roofline in three
  // interleaved pairs (19:03 UTC, 2026-12-02).
  if (n <= Isa::kMaxTokensTwoPanels) {
    for (; p + 2 <= full_end; p += 2) panel_group<Isa, 2>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  }
  for (; p < full_end; ++p) panel_group<Isa, 1>(x, n, ldx, w, p, y + p * kPanelRows, ldy);
  if (p < p_end) {  // the zero-padded last panel: accumulate aside, copy the real rows
    thread_local std::vector<float> tail;
    tail.resize(static_cast<size_t>(n * kPanelRows));
    panel_group<Isa, 1>(x, n, ldx, w, p, tail.data(), kPanelRows);
    copy_padded_panel(tail.data(), n, w, p, y, ldy);
  }
}

}  // namespace

bool wide_path_for(int64_t n, const MatrixRef& w) {
  return panel_detail::kHaveAvx512 && panel_isa() == PanelIsa::kAvx512 && n >= kWideMinTokens &&
         w.rows >= kWideMinRows;
}

int64_t token_tile_count(int64_t n) {
  return TokenTiles{n}.count();
}

void pack_token_tiles(const float* x, int64_t n, int64_t ldx, int64_t cols, int64_t tile_begin,
                      int64_t tile_end, float* xp) {
  const TokenTiles tiles{n};
  for (int64_t i = tile_begin; i < tile_end; ++i) {
    const int64_t t = tiles.first(i);
    const int tb = tiles.size(i);
    float* dst = xp + t * cols;
    for (int64_t c = 0; c < cols; ++c)
      for (int j = 0; j < tb; ++j) dst[c * tb + j] = x[(t + j) * ldx + c];
  }
}

void panels_linear_packed(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin,
                          int64_t p_end, float* y, int64_t ldy) {
  XDS_CHECK(w.layout == MatrixLayout::kPanels16 && w.dtype == DType::kBF16,
            "panels_linear_packed: weights are not BF16 panels");
  XDS_CHECK(wide_path_for(n, w), "panels_linear_packed: no wide path for {} tokens x {} rows", n,
            w.rows);
  if (p_begin >= p_end) return;
#if defined(__AVX512F__)
  wide_linear(xp, n, w, p_begin, p_end, y, ldy);
#else
  (void)xp, (void)y, (void)ldy;
#endif
}

void panels_linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                   int64_t p_end, float* y, int64_t ldy) {
  XDS_CHECK(w.layout == MatrixLayout::kPanels16 && w.dtype == DType::kBF16,
            "panels_linear: weights are not BF16 panels");
  if (n <= 0 || p_begin >= p_end) return;
#if defined(__AVX512F__)
  if (panel_isa() == PanelIsa::kAvx512)
    return panels_linear_on<panel_detail::Avx512>(x, n, ldx, w, p_begin, p_end, y, ldy);
#endif
  panels_linear_on<panel_detail::Avx2>(x, n, ldx, w, p_begin, p_end, y, ldy);
}

}  // namespace xds::kernels
