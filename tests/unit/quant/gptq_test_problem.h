// The random calibration problem of the GPTQ tests and a plain Gauss-Jordan inverse (the
// references' explicit inverse Hessian).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace xds {

struct Problem {
  int64_t rows, cols, tokens;
  std::vector<float> w;    // [rows, cols]
  std::vector<float> x;    // [tokens, cols], correlated channels, a few outliers
  std::vector<double> h;   // [cols, cols] Σ x xᵀ
};

inline Problem make_problem(int64_t rows, int64_t cols, int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  Problem p{rows, cols, tokens, {}, {}, {}};
  p.w.resize(static_cast<size_t>(rows * cols));
  for (float& v : p.w) v = n01(rng) * 0.05f;
  std::vector<float> mix(static_cast<size_t>(cols * cols));  // x = z · mix
  for (float& v : mix) v = n01(rng) / std::sqrt(static_cast<float>(cols));
  p.x.assign(static_cast<size_t>(tokens * cols), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> z(static_cast<size_t>(cols));
    for (float& v : z) v = n01(rng);
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j) p.x[t * cols + j] += z[i] * mix[i * cols + j];
    p.x[t * cols + (t % 3)] *= 8.0f;  // outlier channels 0..2
  }
  p.h.assign(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j)
        p.h[i * cols + j] += double(p.x[t * cols + i]) * p.x[t * cols + j];
  return p;
}

inline std::vector<double> inverse(std::vector<double> a, int64_t n) {  // Gauss-Jordan, pivoting
  std::vector<double> inv(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) inv[i * n + i] = 1.0;
  for (int64_t c = 0; c < n; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[piv * n + c])) piv = r;
    for (int64_t k = 0; k < n; ++k) {
      std::swap(a[c * n + k], a[piv * n + k]);
      std::swap(inv[c * n + k], inv[piv * n + k]);
    }
    const double d = a[c * n + c];
    for (int64_t k = 0; k < n; ++k) {
      a[c * n + k] /= d;
      inv[c * n + k] /= d;
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r * n + c];
      for (int64_t k = 0; k < n; ++k) {
        a[r * n + k] -= f * a[c * n + k];
        inv[r * n + k] -= f * inv[c * n + k];
      }
    }
  }
  return inv;
}

// The references' step after column j is quantized: the inverse Hessian hi [n][n] (row-major,
// double) with column j eliminated, the rank-1 downdate hi -= hi[:, j] · hi[j, :] / hi[j][j].
inline void eliminate_column(std::vector<double>& hi, int64_t n, int64_t j) {
  const double d = hi[j * n + j];
  std::vector<double> col(static_cast<size_t>(n)), row(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    col[k] = hi[k * n + j];
    row[k] = hi[j * n + k];
  }
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) hi[a * n + b] -= col[a] * row[b] / d;
}

}  // namespace xds
