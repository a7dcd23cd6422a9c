// F16 panels (the kPanels16 layout with IEEE binary16 elements) against an fp16 decoder
// written here from the format's definition, a double-precision reference over the
// row-major weights, and a plain float loop summing in the kernel's promised order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "isa_for_tests.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "linear_reference.h"

namespace xds::kernels {
namespace {

// binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits; exponent 0 is subnormal
// (mantissa · 2^-24), 31 is infinity / NaN (not used here).
double f16_value(uint16_t h) {
  const int exponent = (h >> 10) & 31, mantissa = h & 1023;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) != 0 ? -magnitude : magnitude;
}

struct F16Matrix {
  std::vector<uint16_t> rows_major, panels;
  MatrixRef ref;
};

F16Matrix pack_f16(std::vector<uint16_t> bits, int64_t rows, int64_t cols) {
  F16Matrix m;
  m.rows_major = std::move(bits);
  m.ref = MatrixRef{DType::kF16, nullptr, rows, cols, MatrixLayout::kPanels16};
  m.panels.assign(static_cast<size_t>(m.ref.bytes() / 2), 0x7e00);  // NaN: packing fills all
  pack_panels16(m.rows_major.data(), rows, cols, 0, m.ref.panels(), m.panels.data());
  m.ref.data = m.panels.data();
  return m;
}

// Finite fp16 of magnitude below 4 (exponent field < 17), random sign: subnormals included.
F16Matrix random_f16(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_int_distribution<int> bits(0, (17 << 10) - 1), sign(0, 1);
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols));
  for (uint16_t& h : w) h = static_cast<uint16_t>(bits(rng) | (sign(rng) << 15));
  return pack_f16(std::move(w), rows, cols);
}

TEST(LinearPanelsF16, EveryFiniteF16WidensExactly) {
  // All 63488 finite fp16 bit patterns (exponent field < 31) as a [256, 248] matrix, times
  // the identity of 248 tokens: y[t][r] = W[r][t] exactly (x is 0 or 1, fp16 values are
  // normal fp32, and the other columns add zeros). 248 tokens and 256 rows take the wide path
  // on AVX-512; 13 and 5 tokens the two-panel passes and a single tile.
  const int64_t rows = 256, cols = 248;
  std::vector<uint16_t> bits;
  for (uint32_t h = 0; h < 0x10000; ++h)
    if (((h >> 10) & 31) != 31) bits.push_back(static_cast<uint16_t>(h));
  ASSERT_EQ(bits.size(), static_cast<size_t>(rows * cols));
  const F16Matrix w = pack_f16(bits, rows, cols);
  ThreadPool pool(2);
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas()) {
    set_panel_isa(isa);
    for (const int64_t n : {cols, int64_t{13}, int64_t{5}}) {
      const int64_t first = cols - n;  // the identity's last n rows: columns [first, cols)
      std::vector<float> x(static_cast<size_t>(n * cols), 0.0f);
      for (int64_t t = 0; t < n; ++t) x[t * cols + first + t] = 1.0f;
      std::vector<float> y(static_cast<size_t>(n * rows), -7.0f);
      linear_f32(x.data(), n, cols, w.ref, y.data(), rows, pool);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const uint16_t h = bits[r * cols + first + t];
          ASSERT_EQ(y[t * rows + r], static_cast<float>(f16_value(h)))
              << panel_isa_name(isa) << " n=" << n << " bits=0x" << std::hex << h;
        }
      }
    }
  }
}

TEST(LinearPanelsF16, MatchesDoubleReferenceForTokenAndPanelCounts) {
  std::mt19937 rng(23);
  ThreadPool pool(2);
  struct Case {
    int64_t n, rows, cols;
  };
  // As the BF16 panels' test: every tile width, k blocks, padded last panels, the wide path.
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas()) {
    set_panel_isa(isa);
    for (const Case c : {Case{1, 37, 70}, Case{3, 16, 1}, Case{5, 32, 129}, Case{8, 35, 520},
                         Case{9, 33, 700}, Case{12, 35, 1030}, Case{13, 33, 600}, Case{40, 48, 700},
                         Case{2, 80, 1100}, Case{70, 300, 65}, Case{140, 280, 1400}}) {
      const F16Matrix w = random_f16(c.rows, c.cols, rng);
      ASSERT_TRUE(linears_match_double_reference(
          w.ref, c.n, [&](int64_t r, int64_t k) { return f16_value(w.rows_major[r * c.cols + k]); }, rng, pool,
          fmt::format("{} n={} rows={} cols={}", panel_isa_name(isa), c.n, c.rows, c.cols)));
    }
  }
}

TEST(LinearPanelsF16, SumsInAscendingColumnOrderWhateverTheBatch) {
  // y = fma(x[c], w[c], y) for c = 0, 1, ...: the same bits as the F32 rows an F16
  // checkpoint used to be widened to, at every batch size and on both instruction sets.
  std::mt19937 rng(29);
  ThreadPool pool(2);
  const int64_t rows = 280, cols = 1300, n_max = 40;
  const F16Matrix w = random_f16(rows, cols, rng);
  const auto x = random_vec(static_cast<size_t>(n_max * cols), rng);
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas()) {
    set_panel_isa(isa);
    for (const int64_t n :
         {int64_t{1}, int64_t{4}, int64_t{9}, int64_t{12}, int64_t{13}, int64_t{17}, n_max}) {
      std::vector<float> y(static_cast<size_t>(n * rows));
      linear_f32(x.data(), n, cols, w.ref, y.data(), rows, pool);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          float s = 0.0f;
          for (int64_t k = 0; k < cols; ++k) {
            s = std::fma(x[t * cols + k], static_cast<float>(f16_value(w.rows_major[r * cols + k])),
                         s);
          }
          ASSERT_EQ(y[t * rows + r], s)
              << panel_isa_name(isa) << " n=" << n << " t=" << t << " r=" << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace xds::kernels
