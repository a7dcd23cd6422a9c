// bf16 <-> f32 scalar conversions, the one definition of the rounding every layer uses
// (tensor/dtype.h for checkpoints and kernels, xccl/rowops.h for the rows on the wire).
#pragma once

#include <bit>
#include <cstdint>

namespace xds {

// Exact: bf16 is the top half of an f32.
inline float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; NaN stays NaN (quieted), infinities stay infinite.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace xds
