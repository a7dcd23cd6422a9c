// Row kernels of dispatch/combine: bf16 <-> f32, per-token INT8 (P040, P089), weighted sums
// (bf16 and f32 rows).
//
// bf16 conversions: base/bf16.h (xccl depends on base only). INT8 row format: [H] int8
// values, then at byte align4(H) one f32 scale = max|x| / 127; x ~= q * scale, error <=
// scale / 2 per element before bf16 rounding.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "base/bf16.h"

namespace xds::xccl {

// base/bf16.h's conversions under the names this folder uses.
inline float bf16_to_float(uint16_t b) {
  return bf16_to_f32(b);
}
inline uint16_t float_to_bf16(float f) {
  return f32_to_bf16(f);
}

// Bytes of one INT8 row that travel: values then the scale.
inline uint64_t int8_row_bytes(int hidden) {
  return (uint64_t(hidden) + 3) / 4 * 4 + 4;
}

// Stride of INT8 rows in staging (each row starts on a 64-byte line).
inline uint64_t int8_row_stride(int hidden) {
  return (int8_row_bytes(hidden) + 63) / 64 * 64;
}

// Quantizes x [hidden] bf16 into q (int8_row_bytes(hidden) bytes). Returns the scale.
float quantize_row_int8(const uint16_t* x, int hidden, std::byte* q);
// Dequantizes a row written by quantize_row_int8 into bf16.
void dequantize_row_int8(const std::byte* q, int hidden, uint16_t* out);
// out[h] = bf16(sum_j w[j] * rows[j][h]), f32 fused multiply-adds in ascending j (0 rows:
// zeros). The partial sums of 16 columns stay in registers: one pass over every row.
void weighted_sum_bf16(const uint16_t* const* rows, const float* w, int n, int hidden,
                       uint16_t* out);
// The same over f32 rows into f32: out[h] = sum_j w[j] * rows[j][h], fused multiply-adds in
// ascending j (0 rows: zeros).
void weighted_sum_f32(const float* const* rows, const float* w, int n, int hidden, float* out);
// acc[h] += w * x[h] (x bf16).
void axpy_bf16(float w, const uint16_t* x, int hidden, float* acc);
// acc[h] += x[h]
void add_bf16(const uint16_t* x, int hidden, float* acc);
// out[h] = bf16(acc[h])
void store_bf16(const float* acc, int hidden, uint16_t* out);

}  // namespace xds::xccl
