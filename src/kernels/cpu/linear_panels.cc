#include "kernels/cpu/linear_panels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/panel_driver.h"

namespace xds::kernels {
namespace {

using panel_detail::Bf16Format;

std::atomic<PanelIsa> g_isa{panel_detail::kHaveAvx512 ? PanelIsa::kAvx512 : PanelIsa::kAvx2};

template <typename T>
void pack_panels(const T* w, int64_t rows, int64_t cols, int64_t panel_begin, int64_t panel_end,
                 T* out) {
  const MatrixRef shape{DType::kBF16, nullptr, rows, cols, MatrixLayout::kPanels16};
  // The last panel of an odd count also writes the zero panel that closes its pair.
  const int64_t end = panel_end == shape.panels() ? shape.stored_panels() : panel_end;
  for (int64_t p = panel_begin; p < end; ++p) {
    T* dst = out + shape.panel_column(p, 0);
    for (int j = 0; j < 16; ++j) {
      const int64_t r = p * kPanelRows + j;
      const int slot = j < 8 ? 2 * j : 2 * (j - 8) + 1;
      if (r >= rows) {
        for (int64_t c = 0; c < cols; ++c) dst[c * kPairStride + slot] = 0;
        continue;
      }
      const T* src = w + r * cols;
      for (int64_t c = 0; c < cols; ++c) dst[c * kPairStride + slot] = src[c];
    }
  }
}

}  // namespace

void pack_panels16(const uint16_t* w, int64_t rows, int64_t cols, int64_t panel_begin,
                   int64_t panel_end, uint16_t* out) {
  pack_panels(w, rows, cols, panel_begin, panel_end, out);
}

void pack_panels16_fp8(const uint8_t* w, int64_t rows, int64_t cols, int64_t panel_begin,
                       int64_t panel_end, uint8_t* out) {
  pack_panels(w, rows, cols, panel_begin, panel_end, out);
}

bool fp8_panel_scales_fit(const float* scale_inv, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    // Finite and, times 2^8, still finite (below 2^120 in magnitude, to keep it simple).
    if (!(std::fabs(scale_inv[i]) < 0x1p120f)) return false;
  }
  return true;
}

void pack_fp8_panel_scales(const float* scale_inv, int64_t rows, int64_t cols, int64_t block_rows,
                           int64_t block_cols, float* out) {
  XDS_CHECK(block_rows % kPanelRows == 0 && block_cols > 0 &&
                std::has_single_bit(static_cast<uint64_t>(block_cols)),
            "pack_fp8_panel_scales: {}x{} blocks", block_rows, block_cols);
  const MatrixRef shape{DType::kF8E4M3, nullptr, rows, cols, MatrixLayout::kPanels16};
  const int64_t blocks = (cols + block_cols - 1) / block_cols;
  for (int64_t p = 0; p < shape.panels(); ++p) {
    const float* src = scale_inv + (p * kPanelRows / block_rows) * blocks;
    for (int64_t b = 0; b < blocks; ++b) out[p * blocks + b] = src[b] * 0x1p8f;
  }
  for (int64_t p = shape.panels(); p < shape.stored_panels(); ++p)  // the zero panel's
    for (int64_t b = 0; b < blocks; ++b) out[p * blocks + b] = 0.0f;
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

bool is_panel_matrix(const MatrixRef& w) {
  return w.layout == MatrixLayout::kPanels16 &&
         (w.dtype == DType::kBF16 || w.dtype == DType::kF16 ||
          (w.dtype == DType::kF8E4M3 && w.scales != nullptr));
}

bool wide_path_for(int64_t n, const MatrixRef& w) {
  return panel_detail::kHaveAvx512 && panel_isa() == PanelIsa::kAvx512 &&
         n >= panel_detail::kWideMinTokens && w.rows >= panel_detail::kWideMinRows;
}

int64_t token_tile_count(int64_t n) {
  return panel_detail::TokenTiles{n}.count();
}

void pack_token_tiles(const float* x, int64_t n, int64_t ldx, int64_t cols, int64_t tile_begin,
                      int64_t tile_end, float* xp) {
  const panel_detail::TokenTiles tiles{n};
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
  XDS_CHECK(is_panel_matrix(w), "panels_linear_packed: weights are not BF16, F16 or FP8 panels");
  XDS_CHECK(wide_path_for(n, w), "panels_linear_packed: no wide path for {} tokens x {} rows", n,
            w.rows);
  if (p_begin >= p_end) return;
  if (w.dtype == DType::kF8E4M3)
    return panel_detail::wide_linear_fp8(xp, n, w, p_begin, p_end, y, ldy);
  if (w.dtype == DType::kF16)
    return panel_detail::wide_linear_f16(xp, n, w, p_begin, p_end, y, ldy);
  panel_detail::wide_linear_checked<Bf16Format>(xp, n, w, p_begin, p_end, y, ldy);
}

void panels_linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                   int64_t p_end, float* y, int64_t ldy) {
  XDS_CHECK(is_panel_matrix(w), "panels_linear: weights are not BF16, F16 or FP8 panels");
  if (n <= 0 || p_begin >= p_end) return;
  if (w.dtype == DType::kF8E4M3)
    return panel_detail::panels_linear_fp8(x, n, ldx, w, p_begin, p_end, y, ldy);
  if (w.dtype == DType::kF16)
    return panel_detail::panels_linear_f16(x, n, ldx, w, p_begin, p_end, y, ldy);
  panel_detail::panels_linear_selected<Bf16Format>(x, n, ldx, w, p_begin, p_end, y, ldy);
}

}  // namespace xds::kernels
