// Element types and their scalar conversions.
//
// Names follow the safetensors header ("F32", "BF16", "F16", "F8_E4M3", "I8", ...).
// Conversions to f32 are exact; f32 -> bf16 rounds to nearest even (NaN stays NaN).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "base/bf16.h"

namespace xds {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8, kU8, kI16, kI32, kI64, kBool, kF64 };

// Bytes per element.
int dtype_size(DType t);
// "F32", "BF16", ...
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; nullopt if unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// bf16_to_f32, f32_to_bf16: base/bf16.h.

// IEEE half -> f32 (exact, subnormals included).
float f16_to_f32(uint16_t h);
// f32 -> IEEE half, round to nearest even.
uint16_t f32_to_f16(float f);

// OCP FP8 E4M3 ("e4m3fn": no infinities, 0x7f/0xff are NaN, max 448) -> f32, exact.
float f8e4m3_to_f32(uint8_t v);
// f32 -> E4M3, round to nearest even, saturating to +-448.
uint8_t f32_to_f8e4m3(float f);

}  // namespace xds
