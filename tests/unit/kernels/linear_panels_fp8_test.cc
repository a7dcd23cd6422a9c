// FP8 (F8_E4M3, block scales) panels against the weights dequantized by a plain loop
// (e4m3 decoded from its definition, times the block's scale, one fp32 rounding): every
// output must be the plain ascending-column FMA sum over those weights, bit for bit, on every
// instruction set, token count and block shape; and the scale checks refuse what the
// kernel's 2^8 factor cannot carry.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "isa_for_tests.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"

namespace xds::kernels {
namespace {

// Sign, 4-bit exponent (bias 7), 3-bit mantissa, subnormals at exponent 0; 0x7f/0xff NaN.
float e4m3_value(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  const double x = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return static_cast<float>(s ? -x : x);
}

struct Fp8Matrix {
  int64_t rows, cols, br, bc;
  std::vector<uint8_t> q, panels;
  std::vector<float> scale_inv, panel_scales, dequantized;  // dequantized: [rows][cols]
  MatrixRef ref;
};

Fp8Matrix make_fp8(int64_t rows, int64_t cols, int64_t br, int64_t bc, std::mt19937& rng) {
  Fp8Matrix m{rows, cols, br, bc, {}, {}, {}, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  m.q.resize(static_cast<size_t>(rows * cols));
  for (auto& v : m.q) {
    do v = static_cast<uint8_t>(byte(rng));
    while ((v & 0x7f) == 0x7f);
  }
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-20, 3);
  for (int64_t i = 0; i < sr * sc; ++i)
    m.scale_inv.push_back((i % 5 == 3 ? -1.0f : 1.0f) * std::ldexp(mant(rng), ex(rng)));
  m.scale_inv[0] = 1e30f;  // large (products stay finite: 448e30 x 128 columns)
  if (m.scale_inv.size() > 1) m.scale_inv[1] = 0x1p-140f;  // subnormal weights
  m.dequantized.resize(m.q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m.dequantized[r * cols + c] =
          e4m3_value(m.q[r * cols + c]) * m.scale_inv[(r / br) * sc + c / bc];
  EXPECT_TRUE(fp8_panel_scales_fit(m.scale_inv.data(), sr * sc));
  m.ref = MatrixRef{DType::kF8E4M3, nullptr, rows, cols, MatrixLayout::kPanels16};
  m.ref.scale_shift = __builtin_ctzll(static_cast<unsigned long long>(bc));
  m.panels.assign(static_cast<size_t>(m.ref.bytes()), 0x7f);  // poison: packing fills all
  pack_panels16_fp8(m.q.data(), rows, cols, 0, m.ref.panels(), m.panels.data());
  m.panel_scales.assign(static_cast<size_t>(m.ref.stored_panels() * m.ref.scale_blocks()), NAN);
  pack_fp8_panel_scales(m.scale_inv.data(), rows, cols, br, bc, m.panel_scales.data());
  m.ref.data = m.panels.data();
  m.ref.scales = m.panel_scales.data();
  return m;
}

TEST(LinearPanelsFp8, EveryCodeWidensToItsValueTimesTheScale) {
  // W = 16 rows × 16 columns of every non-NaN code; x = one-hot columns: y[r] = W[r][c].
  std::vector<uint8_t> q(256);
  for (int i = 0; i < 256; ++i) q[i] = static_cast<uint8_t>(i == 0x7f || i == 0xff ? 0 : i);
  ThreadPool pool(1);
  const IsaGuard guard;
  for (const float scale : {1.0f, 0.00390625f, -3.0f, 1.2345e-3f, 0x1p-140f}) {
    MatrixRef w{DType::kF8E4M3, nullptr, 16, 16, MatrixLayout::kPanels16};
    w.scale_shift = 4;
    std::vector<uint8_t> panels(static_cast<size_t>(w.bytes()));  // the panel and its zero pair
    pack_panels16_fp8(q.data(), 16, 16, 0, 1, panels.data());
    float scales[2] = {NAN, NAN};
    pack_fp8_panel_scales(&scale, 16, 16, 16, 16, scales);
    w.data = panels.data();
    w.scales = scales;
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      for (int c = 0; c < 16; ++c) {
        std::vector<float> x(16, 0.0f), y(16, NAN);
        x[c] = 1.0f;
        linear_f32(x.data(), 1, 16, w, y.data(), 16, pool);
        for (int r = 0; r < 16; ++r)
          ASSERT_EQ(y[r], e4m3_value(q[r * 16 + c]) * scale)
              << panel_isa_name(isa) << " code 0x" << std::hex << int(q[r * 16 + c]);
      }
    }
  }
}

TEST(LinearPanelsFp8, SumsAsTheDequantizedMatrixBitForBit) {
  std::mt19937 rng(23);
  ThreadPool pool(2);
  struct Case {
    int64_t rows, cols, br, bc;
  };
  // The published 128 × 128 blocks with partial edge blocks; small blocks so that scales
  // change inside a k block and inside a wide block (130 tokens and 280 rows: the wide
  // path); a padded last panel; two panels per tile and single ones.
  const IsaGuard guard;
  for (const Case c : {Case{280, 1300, 128, 128}, Case{37, 300, 16, 32}, Case{64, 70, 32, 64}}) {
    const Fp8Matrix w = make_fp8(c.rows, c.cols, c.br, c.bc, rng);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(130 * c.cols));
    for (auto& v : x) v = d(rng);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      for (const int64_t n : {1, 2, 3, 5, 7, 8, 9, 12, 13, 15, 17, 40, 64, 70, 130}) {
        for (int variant = 0; variant < 3; ++variant) {
          std::vector<float> y(static_cast<size_t>(n * c.rows), NAN);
          if (variant == 0) linear_f32(x.data(), n, c.cols, w.ref, y.data(), c.rows, pool);
          if (variant == 1) linear_bf16(xb.data(), n, c.cols, w.ref, y.data(), c.rows, pool);
          if (variant == 2) linear_f32_serial(x.data(), n, c.cols, w.ref, y.data(), c.rows);
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < c.rows; ++r) {
              float s = 0.0f;
              for (int64_t k = 0; k < c.cols; ++k) {
                const float xv = variant == 1 ? bf16_to_f32(xb[t * c.cols + k]) : x[t * c.cols + k];
                s = std::fma(xv, w.dequantized[r * c.cols + k], s);
              }
              ASSERT_EQ(y[t * c.rows + r], s)
                  << panel_isa_name(isa) << " " << c.rows << "x" << c.cols << " blocks " << c.br
                  << "x" << c.bc << " n=" << n << " variant=" << variant << " t=" << t
                  << " r=" << r;
            }
          }
        }
      }
    }
  }
}

TEST(LinearPanelsFp8, ReadBytesCountTheScales) {
  // 40 rows × 300 columns in blocks of 16 × 128: 3 panels (the last one padded) and the
  // zero panel closing their second pair, of 16 rows × 300 one-byte elements, and 4 panels ×
  // ceil(300 / 128) = 12 fp32 scales.
  std::mt19937 rng(5);
  const Fp8Matrix m = make_fp8(40, 300, 16, 128, rng);
  EXPECT_EQ(m.ref.bytes(), 4 * 16 * 300);
  EXPECT_EQ(m.ref.read_bytes(), 4 * 16 * 300 + 12 * 4);
  MatrixRef bf16{DType::kBF16, nullptr, 40, 300, MatrixLayout::kPanels16};
  EXPECT_EQ(bf16.read_bytes(), 4 * 16 * 300 * 2);  // no scales
}

TEST(LinearPanelsFp8, ScalesThatTheWideningCannotCarryAreRefused) {
  const float ok[] = {0.0f, -0.0f, 1e-30f, 128.0f, -1e35f, 0x1p-149f, 0x1.fffffep119f};
  EXPECT_TRUE(fp8_panel_scales_fit(ok, 7));
  for (const float bad : {0x1p120f, -0x1p120f, INFINITY, -INFINITY, NAN, 1e38f})
    EXPECT_FALSE(fp8_panel_scales_fit(&bad, 1)) << bad;
}

TEST(LinearPanelsFp8, PanelScalesRepeatTheirRowBlock) {
  // 40 rows in blocks of 32 (panels 0-1 in block 0, panel 2 in block 1), 5 columns in
  // blocks of 4 (two scales per row); the zero panel closing the second pair scales by 0.
  const float s[] = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> out(8, NAN);
  pack_fp8_panel_scales(s, 40, 5, 32, 4, out.data());
  const float k = 0x1p8f;
  const std::vector<float> want = {1 * k, 2 * k, 1 * k, 2 * k, 3 * k, 4 * k, 0, 0};
  EXPECT_EQ(out, want);
}

}  // namespace
}  // namespace xds::kernels
