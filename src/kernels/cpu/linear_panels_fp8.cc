// The panel drivers (panel_driver.h) instantiated for FP8 panels, compiled apart from the
// BF16 ones in linear_panels.cc.
#include "kernels/cpu/panel_driver.h"

namespace xds::kernels::panel_detail {

void panels_linear_fp8(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, int64_t p_begin,
                       int64_t p_end, float* y, int64_t ldy) {
  panels_linear_selected<Fp8Format>(x, n, ldx, w, p_begin, p_end, y, ldy);
}

void wide_linear_fp8(const float* xp, int64_t n, const MatrixRef& w, int64_t p_begin, int64_t p_end,
                     float* y, int64_t ldy) {
  wide_linear_checked<Fp8Format>(xp, n, w, p_begin, p_end, y, ldy);
}

}  // namespace xds::kernels::panel_detail
