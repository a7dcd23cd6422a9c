#include "xccl/rowops.h"

#include <algorithm>
#include <cmath>

namespace xds::xccl {

float quantize_row_int8(const uint16_t* x, int hidden, std::byte* q) {
  float amax = 0.f;
  for (int h = 0; h < hidden; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[h])));
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / scale;
  auto* qi = reinterpret_cast<int8_t*>(q);
  for (int h = 0; h < hidden; ++h) {
    float v = std::nearbyint(bf16_to_float(x[h]) * inv);
    qi[h] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
  }
  std::memcpy(q + int8_row_bytes(hidden) - 4, &scale, 4);
  return scale;
}

void dequantize_row_int8(const std::byte* q, int hidden, uint16_t* out) {
  float scale;
  std::memcpy(&scale, q + int8_row_bytes(hidden) - 4, 4);
  const auto* qi = reinterpret_cast<const int8_t*>(q);
  for (int h = 0; h < hidden; ++h) out[h] = float_to_bf16(float(qi[h]) * scale);
}

void axpy_bf16(float w, const uint16_t* x, int hidden, float* acc) {
  for (int h = 0; h < hidden; ++h) acc[h] += w * bf16_to_float(x[h]);
}

void add_bf16(const uint16_t* x, int hidden, float* acc) {
  for (int h = 0; h < hidden; ++h) acc[h] += bf16_to_float(x[h]);
}

void store_bf16(const float* acc, int hidden, uint16_t* out) {
  for (int h = 0; h < hidden; ++h) out[h] = float_to_bf16(acc[h]);
}

}  // namespace xds::xccl
