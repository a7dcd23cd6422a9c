// The linear kernels against a plain double-precision reference.
#include "kernels/cpu/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "linear_reference.h"

namespace xds::kernels {
namespace {

struct Case {
  int64_t n, rows, cols;
};

TEST(Linear, MatchesDoubleReferenceForAllTileShapes) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  for (const Case c :
       {Case{1, 1, 1}, Case{1, 7, 9}, Case{2, 13, 8}, Case{3, 6, 17}, Case{4, 12, 64},
        Case{5, 25, 33}, Case{9, 31, 100}, Case{70, 19, 40}, Case{1, 130, 256},
        // several k blocks (256) with a scalar tail, several token chunks (16)
        Case{1, 11, 603}, Case{21, 14, 603}, Case{40, 7, 515},
        // page-long rows (8-row single-token tiles, no prefetch) with a partial last tile
        Case{1, 61, 2048}, Case{1, 30, 2051}}) {
    const auto x = random_vec(static_cast<size_t>(c.n * c.cols), rng);
    const auto wf = random_vec(static_cast<size_t>(c.rows * c.cols), rng);
    std::vector<uint16_t> wb(wf.size());
    std::vector<float> wb_wide(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
      wb[i] = f32_to_bf16(wf[i]);
      wb_wide[i] = bf16_to_f32(wb[i]);
    }
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    for (int variant = 0; variant < 3; ++variant) {
      const bool bf16_w = variant != 0, bf16_x = variant == 2;
      const MatrixRef w{bf16_w ? DType::kBF16 : DType::kF32,
                        bf16_w ? static_cast<const void*>(wb.data()) : wf.data(), c.rows, c.cols};
      std::vector<float> y(static_cast<size_t>(c.n * c.rows), -7.0f);
      if (bf16_x) {
        linear_bf16(xb.data(), c.n, c.cols, w, y.data(), c.rows, pool);
      } else {
        linear_f32(x.data(), c.n, c.cols, w, y.data(), c.rows, pool);
      }
      for (int64_t t = 0; t < c.n; ++t) {
        for (int64_t r = 0; r < c.rows; ++r) {
          double ref = 0.0;
          for (int64_t k = 0; k < c.cols; ++k) {
            const double xv = bf16_x ? bf16_to_f32(xb[t * c.cols + k]) : x[t * c.cols + k];
            const double wv = bf16_w ? wb_wide[r * c.cols + k] : wf[r * c.cols + k];
            ref += xv * wv;
          }
          ASSERT_NEAR(y[t * c.rows + r], ref, 1e-5 * std::sqrt(static_cast<double>(c.cols)) + 1e-6)
              << "n=" << c.n << " rows=" << c.rows << " cols=" << c.cols << " variant=" << variant;
        }
      }
    }
  }
}

TEST(Linear, ResultOfATokenDoesNotDependOnItsBatch) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  // One k block, and three k blocks (256 each) with a scalar tail over three token chunks.
  for (const Case c : {Case{11, 29, 77}, Case{37, 29, 603}}) {
    const int64_t rows = c.rows, cols = c.cols, n = c.n;
    const auto x = random_vec(static_cast<size_t>(n * cols), rng);
    const auto wf = random_vec(static_cast<size_t>(rows * cols), rng);
    const MatrixRef w{DType::kF32, wf.data(), rows, cols};
    std::vector<float> all(static_cast<size_t>(n * rows)), serial(all.size());
    linear_f32(x.data(), n, cols, w, all.data(), rows, pool);
    linear_f32_serial(x.data(), n, cols, w, serial.data(), rows);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> one(static_cast<size_t>(rows));
      linear_f32(x.data() + t * cols, 1, cols, w, one.data(), rows, pool);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(one[r], all[t * rows + r]) << t << "," << r << " cols=" << cols;
        EXPECT_EQ(one[r], serial[t * rows + r]) << t << "," << r << " cols=" << cols;
      }
    }
  }
}

TEST(MatmulNn, MatchesReference) {
  std::mt19937 rng(5);
  // n <= 2 takes the row-streaming path, n >= 3 the 32-column strips; odd row counts leave
  // rows outside the groups of 4, odd column counts a scalar remainder.
  for (const Case c : {Case{3, 5, 21}, Case{1, 7, 64}, Case{5, 128, 75}, Case{2, 3, 32},
                       Case{1, 130, 512}, Case{2, 11, 100},
                       // the sgemm path (n >= kNnSgemmMinTokens), F32 and BF16 W
                       Case{16, 128, 512}, Case{40, 9, 33}}) {
    const int64_t n = c.n, rows = c.rows, cols = c.cols;
    const auto x = random_vec(static_cast<size_t>(n * rows), rng);
    auto wf = random_vec(static_cast<size_t>(rows * cols), rng);
    std::vector<uint16_t> wb(wf.size());
    for (const bool bf16 : {false, true}) {
      if (bf16) {  // the reference then uses the bf16 values
        for (size_t i = 0; i < wf.size(); ++i) {
          wb[i] = f32_to_bf16(wf[i]);
          wf[i] = bf16_to_f32(wb[i]);
        }
      }
      const MatrixRef w = bf16 ? MatrixRef{DType::kBF16, wb.data(), rows, cols}
                               : MatrixRef{DType::kF32, wf.data(), rows, cols};
      std::vector<float> y(static_cast<size_t>(n * cols), 0.5f);
      matmul_nn_accumulate(x.data(), n, rows, w, y.data(), cols);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < cols; ++c) {
          double ref = 0.5;
          for (int64_t r = 0; r < rows; ++r)
            ref += static_cast<double>(x[t * rows + r]) * wf[r * cols + c];
          ASSERT_NEAR(y[t * cols + c], ref, 1e-5 * std::sqrt(double(rows)))
              << "n=" << n << " bf16=" << bf16 << " t=" << t << " c=" << c;
        }
      }
    }
  }
}

TEST(MatmulNn, FewTokensPathSumsInTheSameOrderAsTheStrips) {
  // Token rows computed one or two at a time must equal the same rows inside a call of 3+.
  std::mt19937 rng(8);
  const int64_t n = 5, rows = 37, cols = 96;
  const auto x = random_vec(static_cast<size_t>(n * rows), rng);
  const auto wf = random_vec(static_cast<size_t>(rows * cols), rng);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  const MatrixRef w{DType::kBF16, wb.data(), rows, cols};
  std::vector<float> all(static_cast<size_t>(n * cols), 0.25f);
  matmul_nn_accumulate(x.data(), n, rows, w, all.data(), cols);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> one(static_cast<size_t>(cols), 0.25f);
    matmul_nn_accumulate(x.data() + t * rows, 1, rows, w, one.data(), cols);
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(one[c], all[t * cols + c]) << t << "," << c;
  }
}

}  // namespace
}  // namespace xds::kernels
