// The scalar pair kernels of the int4 linear layers (int4_linear.h, int4_kernels.h): plain
// loops over the packed layout, the reference path. W4A8 computes the same int32 group sums
// and the same fp32 chain (std::fma) as the vector paths, so its outputs are their bits;
// W4A16 sums each group in one chain (its own order).
#include <cmath>

#include "kernels/cpu/int4_kernels.h"

namespace xds::kernels::int4_detail {
namespace {

// q[row j of the pair][column c] from the pair's lines.
inline int nibble(const uint8_t* data, int j, int64_t c) {
  const uint8_t b = data[(c / kQuadCols) * kLineBytes + 4 * (j % 16) + c % kQuadCols];
  return j < 16 ? b & 0x0f : b >> 4;
}

inline int zero_point(const PairView& w, int64_t g, int j) {
  return w.zero != nullptr ? w.zero[g * kPairRows + j] : 8;
}

}  // namespace

void a8_pair_scalar(const A8Tokens& x, const PairView& w, float* acc) {
  for (int64_t t = 0; t < x.m; ++t) {
    const int8_t* xt = x.q + t * x.ld;
    for (int j = 0; j < kPairRows; ++j) {
      float f = 0.0f;
      for (int64_t g = 0; g < w.groups; ++g) {
        int32_t s = -zero_point(w, g, j) * x.xsum[t * w.groups + g];
        for (int64_t c = g * w.group_cols; c < (g + 1) * w.group_cols; ++c)
          s += int32_t{xt[c]} * nibble(w.data, j, c);
        f = std::fma(static_cast<float>(s), w.scale[g * kPairRows + j], f);
      }
      acc[t * kPairRows + j] = f;
    }
  }
}

void a16_pair_scalar(const A16Tokens& x, const PairView& w, float* acc) {
  for (int64_t t = 0; t < x.m; ++t) {
    const float* xt = x.x + t * x.ld;
    for (int j = 0; j < kPairRows; ++j) {
      float f = 0.0f;
      for (int64_t g = 0; g < w.groups; ++g) {
        float p = 0.0f;
        for (int64_t c = g * w.group_cols; c < (g + 1) * w.group_cols; ++c)
          p = std::fma(xt[c], static_cast<float>(nibble(w.data, j, c) - 8), p);
        if (w.zero != nullptr)
          p = std::fma(static_cast<float>(8 - zero_point(w, g, j)), x.xsum[t * w.groups + g], p);
        f = std::fma(p, w.scale[g * kPairRows + j], f);
      }
      acc[t * kPairRows + j] = f;
    }
  }
}

}  // namespace xds::kernels::int4_detail
