#include "kernels/cpu/int8_quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "base/bf16.h"

namespace xds::kernels {
namespace {

// The largest |x[i]|: exact, whatever the order (max is).
float abs_max(const float* x, int64_t cols) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= cols; i += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = 0.0f;
  for (const float v : lanes) r = std::max(r, v);
  for (; i < cols; ++i) r = std::max(r, std::fabs(x[i]));
  return r;
}

// q[i] = rne(x[i] / s) clamped to [-127, 127]; the vector and scalar steps are the same
// IEEE division, clamp and round-to-nearest-even (cvtps2dq and nearbyint in the default
// mode). The clamp comes first so that no conversion sees a value beyond int32 (x / s can
// exceed 127 only where s is subnormal).
void quantize_with(const float* x, int64_t cols, float s, int8_t* q) {
  const __m256 vs = _mm256_set1_ps(s);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  int64_t i = 0;
  for (; i + 8 <= cols; i += 8) {
    const __m256 d = _mm256_div_ps(_mm256_loadu_ps(x + i), vs);
    const __m256i v = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(d, lo), hi));
    // 8 int32 → 8 int8: packs within 128-bit lanes, then the two lanes' words together.
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(w, w));
  }
  for (; i < cols; ++i) {
    q[i] = static_cast<int8_t>(std::nearbyint(std::clamp(x[i] / s, -127.0f, 127.0f)));
  }
}

}  // namespace

float quantize_row_int8(const float* x, int64_t cols, int8_t* q) {
  const float s = abs_max(x, cols) / 127.0f;
  if (s == 0.0f) {  // a zero row (or one whose scale underflows): zeros
    std::fill(q, q + cols, int8_t{0});
    return 0.0f;
  }
  quantize_with(x, cols, s, q);
  return s;
}

void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t ldx,
                        const Int8RowsOut& out) {
  for (int64_t r = 0; r < rows; ++r)
    out.scale[r] = quantize_row_int8(x + r * ldx, cols, out.q + r * out.ld);
}

void quantize_rows_int8(const uint16_t* x_bf16, int64_t rows, int64_t cols, int64_t ldx,
                        const Int8RowsOut& out) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* src = x_bf16 + r * ldx;
    for (int64_t i = 0; i < cols; ++i) row[i] = bf16_to_f32(src[i]);
    out.scale[r] = quantize_row_int8(row.data(), cols, out.q + r * out.ld);
  }
}

void dequantize_rows_int8(const Int8RowsRef& in, float* x, int64_t ldx) {
  for (int64_t r = 0; r < in.rows; ++r) {
    const int8_t* q = in.q + r * in.ld;
    for (int64_t i = 0; i < in.cols; ++i) x[r * ldx + i] = static_cast<float>(q[i]) * in.scale[r];
  }
}

Int8Rows quantize_int8(const float* x, int64_t rows, int64_t cols) {
  Int8Rows out;
  out.resize(rows, cols);
  quantize_rows_int8(x, rows, cols, cols, out.out());
  return out;
}

Int8Rows quantize_int8(const uint16_t* x_bf16, int64_t rows, int64_t cols) {
  Int8Rows out;
  out.resize(rows, cols);
  quantize_rows_int8(x_bf16, rows, cols, cols, out.out());
  return out;
}

}  // namespace xds::kernels
