// What the linear kernels' tests share: random inputs, and the double-precision reference
// y[t][r] = Σ_k x(t, k) · w(r, k) that their results are held to.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"
#include "tensor/dtype.h"

namespace xds::kernels {

// n values uniform in [-1, 1).
inline std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// y [n, rows] (row stride rows) against the sums in double of x(t, k) · w(r, k) over
// k < cols, each within 1e-6 of the sum of the products' magnitudes (+ 1e-6): fp32
// accumulation of that many terms. `where` names the case in the failure message.
template <class X, class W>
::testing::AssertionResult matches_double_reference(const std::vector<float>& y, int64_t n,
                                                    int64_t rows, int64_t cols, X&& x, W&& w,
                                                    const std::string& where) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double prod = static_cast<double>(x(t, k)) * static_cast<double>(w(r, k));
        ref += prod;
        mag += std::fabs(prod);
      }
      const double got = y[static_cast<size_t>(t * rows + r)];
      if (!(std::fabs(got - ref) <= 1e-6 * mag + 1e-6)) {
        return ::testing::AssertionFailure()
               << where << " t=" << t << " r=" << r << ": " << got << " against " << ref
               << " (sum of |products| " << mag << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Random x [n, w.cols] through the three entry points that take w (linear_f32, linear_bf16
// with x rounded to bf16, linear_f32_serial), each against the double reference over the
// weights weight(r, k).
template <class W>
::testing::AssertionResult linears_match_double_reference(const MatrixRef& w, int64_t n, W&& weight,
                                                          std::mt19937& rng, ThreadPool& pool,
                                                          const std::string& where) {
  const int64_t rows = w.rows, cols = w.cols;
  const auto x = random_vec(static_cast<size_t>(n * cols), rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> y(static_cast<size_t>(n * rows), -7.0f);
    if (variant == 0) linear_f32(x.data(), n, cols, w, y.data(), rows, pool);
    if (variant == 1) linear_bf16(xb.data(), n, cols, w, y.data(), rows, pool);
    if (variant == 2) linear_f32_serial(x.data(), n, cols, w, y.data(), rows);
    auto ok = matches_double_reference(
        y, n, rows, cols,
        [&](int64_t t, int64_t k) {
          return variant == 1 ? bf16_to_f32(xb[t * cols + k]) : x[t * cols + k];
        },
        weight, where + " variant=" + std::to_string(variant));
    if (!ok) return ok;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace xds::kernels
