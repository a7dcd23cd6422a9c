#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace xds {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
}

TEST(DType, F16Exact) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
  }
}

TEST(DType, F8E4M3HandDerivedValues) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);                  // exp 7 (bias 7), man 0
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);                // max finite: 1.75 * 2^8
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // min subnormal
  EXPECT_EQ(f8e4m3_to_f32(0xc0), -2.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  for (uint32_t c = 0; c < 0x7f; ++c) {
    EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(static_cast<uint8_t>(c))), c);
  }
  EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);  // saturates
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_name("F4").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
}

}  // namespace
}  // namespace xds
