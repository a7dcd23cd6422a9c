// What the linear kernels' tests share: random inputs, and the double-precision reference
// y[t][r] = Σ_k x(t, k) · w(r, k) that their results are held to.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

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

}  // namespace xds::kernels
