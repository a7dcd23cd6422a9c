// The panel-layout linear kernels against a plain double-precision reference that reads the
// original row-major weights (so the packing is checked too), and against a plain float
// loop that sums in the order the kernel promises (ascending columns, one FMA each).
#include "kernels/cpu/linear_panels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "isa_for_tests.h"
#include "kernels/cpu/linear.h"
#include "linear_reference.h"

namespace xds::kernels {
namespace {

// A BF16 matrix kept both row-major (for the references) and packed.
struct Packed {
  std::vector<uint16_t> rows_major, panels;
  MatrixRef ref;
};

Packed make_packed(int64_t rows, int64_t cols, std::mt19937& rng) {
  Packed p;
  const auto wf = random_vec(static_cast<size_t>(rows * cols), rng);
  p.rows_major.resize(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) p.rows_major[i] = f32_to_bf16(wf[i]);
  p.ref = MatrixRef{DType::kBF16, nullptr, rows, cols, MatrixLayout::kPanels16};
  p.panels.assign(static_cast<size_t>(p.ref.bytes() / 2), 0xFFFF);  // poison: packing fills all
  pack_panels16(p.rows_major.data(), rows, cols, 0, p.ref.panels(), p.panels.data());
  p.ref.data = p.panels.data();
  return p;
}

TEST(LinearPanels, PackingPlacesEveryWeightAndZeroPadsTheLastPanelAndPair) {
  // Three panels, the third with 5 real rows; a fourth, all zero, closes the second pair.
  const int64_t rows = 37, cols = 5;
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(i + 1);
  std::vector<uint16_t> out(4 * 16 * cols, 0xFFFF);
  pack_panels16(w.data(), rows, cols, 0, 3, out.data());
  for (int64_t p = 0; p < 4; ++p) {
    for (int64_t c = 0; c < cols; ++c) {
      for (int j = 0; j < 8; ++j) {
        // The layout of tensor/matrix.h: pairs of panels, their columns interleaved.
        const uint16_t* col = out.data() + ((p / 2) * cols + c) * 32 + (p % 2) * 16;
        const int64_t lo = 16 * p + j, hi = 16 * p + 8 + j;
        EXPECT_EQ(col[2 * j], lo < rows ? w[lo * cols + c] : 0) << p << " " << c << " " << j;
        EXPECT_EQ(col[2 * j + 1], hi < rows ? w[hi * cols + c] : 0) << p << " " << c << " " << j;
      }
    }
  }
  const MatrixRef shape{DType::kBF16, nullptr, rows, cols, MatrixLayout::kPanels16};
  EXPECT_EQ(shape.bytes(), static_cast<int64_t>(out.size() * 2));
}

TEST(LinearPanels, ARangeOfPanelsThatSplitsAPairIsRefused) {
  std::mt19937 rng(3);
  const Packed p = make_packed(40, 8, rng);  // three panels: pairs [0, 2) and [2, 3)
  std::vector<float> x(8, 1.0f), y(40);
  EXPECT_DEATH(panels_linear(x.data(), 1, 8, p.ref, 1, 3, y.data(), 40), "not whole pairs");
  EXPECT_DEATH(panels_linear(x.data(), 1, 8, p.ref, 0, 1, y.data(), 40), "not whole pairs");
}

TEST(LinearPanels, MatchesDoubleReferenceForTokenAndPanelCounts) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  struct Case {
    int64_t n, rows, cols;
  };
  // Token counts 1..13 cover every tile width (1-6 with AVX2; with AVX-512 1-8 on one panel,
  // 1-12 on two) and several token blocks with k blocking (cols > 512; with AVX-512 two-panel
  // passes of up to 12 tokens from 13 on, and below 256 rows at any count: 40 tokens are 4
  // passes of 10); rows cover 1-2-panel tiles and a padded last panel. From 128 tokens and 256 rows
  // AVX-512 takes the wide path: 140 tokens × 1400 columns are twelve tiles in two token blocks
  // (11 + 1), over 280 rows: 8 pairs of panels, a single one and a padded one; 100 tokens there
  // are nine narrow passes.
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas()) {
    set_panel_isa(isa);
    for (const Case c :
         {Case{1, 16, 8},       Case{1, 37, 70},     Case{2, 48, 33},    Case{3, 16, 1},
          Case{3, 40, 70},      Case{4, 50, 64},     Case{5, 32, 129},   Case{6, 17, 40},
          Case{7, 64, 1030},    Case{8, 35, 520},    Case{9, 33, 700},   Case{10, 64, 530},
          Case{12, 35, 1030},   Case{13, 33, 600},   Case{15, 64, 1100}, Case{40, 48, 700},
          Case{1, 96, 2048},    Case{2, 80, 1100},   Case{64, 40, 300},  Case{70, 300, 65},
          Case{100, 280, 1400}, Case{140, 280, 1400}}) {
      const Packed w = make_packed(c.rows, c.cols, rng);
      ASSERT_TRUE(linears_match_double_reference(
          w.ref, c.n, [&](int64_t r, int64_t k) { return bf16_to_f32(w.rows_major[r * c.cols + k]); }, rng, pool,
          fmt::format("{} n={} rows={} cols={}", panel_isa_name(isa), c.n, c.rows, c.cols)));
    }
  }
}

TEST(LinearPanels, SumsInAscendingColumnOrderWhateverTheBatch) {
  // The promised order, written as a plain loop: y = fma(x[c], w[c], y) for c = 0, 1, ...
  std::mt19937 rng(5);
  ThreadPool pool(2);
  // 17 full panels (pairs and a single) + a padded one: from 128 tokens, the wide path.
  // 1300 columns, and 700 (short panels: two tokens also take the single stream,
  // panel_driver.h).
  for (const int64_t cols : {int64_t{1300}, int64_t{700}}) {
    const int64_t rows = 280;
    const Packed w = make_packed(rows, cols, rng);
    // Up to 130 tokens: past 64, where panels once went to sgemm, and past 128, the wide path;
    // every n is the same sums.
    const int64_t n_max = 130;
    const auto x = random_vec(static_cast<size_t>(n_max * cols), rng);
    const IsaGuard guard;
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      for (const int64_t n :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{6}, int64_t{7}, int64_t{8},
            int64_t{9}, int64_t{11}, int64_t{12}, int64_t{13}, int64_t{15}, int64_t{17},
            int64_t{64}, int64_t{70}, n_max}) {
        std::vector<float> y(static_cast<size_t>(n * rows));
        linear_f32(x.data(), n, cols, w.ref, y.data(), rows, pool);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            float s = 0.0f;
            for (int64_t k = 0; k < cols; ++k)
              s = std::fma(x[t * cols + k], bf16_to_f32(w.rows_major[r * cols + k]), s);
            ASSERT_EQ(y[t * rows + r], s) << panel_isa_name(isa) << " cols=" << cols << " n=" << n
                                          << " t=" << t << " r=" << r;
          }
        }
      }
    }
  }
}

// A group of weights with one input gives each weight's linear_f32 bits (and so its
// reference), and with bf16 x linear_bf16's (the dot-product kernel where the build has it):
// token counts below and from the wide path's 128, weights on either side of its 256 rows, a
// group of one, and a row-major weight, which sends the group one by one.
TEST(LinearPanels, GroupGivesTheBitsOfEachLinear) {
  std::mt19937 rng(17);
  ThreadPool pool(2);
  const int64_t cols = 300;
  const Packed a = make_packed(768, cols, rng), b = make_packed(576, cols, rng),
               c = make_packed(40, cols, rng);
  const auto rows_w = random_vec(static_cast<size_t>(24 * cols), rng);
  const MatrixRef rows_ref{DType::kF32, rows_w.data(), 24, cols};
  const std::vector<std::vector<const MatrixRef*>> groups = {
      {&a.ref, &b.ref}, {&b.ref, &c.ref, &a.ref}, {&c.ref}, {&a.ref, &rows_ref}};
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas()) {
    set_panel_isa(isa);
    for (const int64_t n : {1, 5, 16, 64, 128}) {
      const int64_t ldx = cols + 3;  // x's rows strided
      const auto x = random_vec(static_cast<size_t>(n * ldx), rng);
      for (const auto& group : groups) {
        std::vector<std::vector<float>> alone, grouped;
        std::vector<LinearOutput> outs;
        for (const MatrixRef* w : group) {
          alone.emplace_back(static_cast<size_t>(n * w->rows));
          grouped.emplace_back(static_cast<size_t>(n * w->rows), -1.0f);
          linear_f32(x.data(), n, ldx, *w, alone.back().data(), w->rows, pool);
        }
        for (size_t i = 0; i < group.size(); ++i)
          outs.push_back({group[i], grouped[i].data(), group[i]->rows});
        linear_f32_group(x.data(), n, ldx, outs, pool);
        for (size_t i = 0; i < group.size(); ++i)
          for (size_t j = 0; j < alone[i].size(); ++j)
            ASSERT_EQ(alone[i][j], grouped[i][j])
                << panel_isa_name(isa) << " n=" << n << " group of " << group.size() << " weight "
                << i << " j=" << j;
        // bf16 activations (the fast mode's linears): linear_bf16_group against linear_bf16
        std::vector<uint16_t> xb(x.size());
        for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
        for (size_t i = 0; i < group.size(); ++i) {
          linear_bf16(xb.data(), n, ldx, *group[i], alone[i].data(), group[i]->rows, pool);
          std::fill(grouped[i].begin(), grouped[i].end(), -1.0f);
        }
        linear_bf16_group(xb.data(), n, ldx, outs, pool);
        for (size_t i = 0; i < group.size(); ++i)
          for (size_t j = 0; j < alone[i].size(); ++j)
            ASSERT_EQ(alone[i][j], grouped[i][j])
                << "bf16 x, " << panel_isa_name(isa) << " n=" << n << " group of " << group.size()
                << " weight " << i << " j=" << j;
      }
    }
  }
}

}  // namespace
}  // namespace xds::kernels
