#include "quant/gptq.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "quant/w8a8_rtn.h"

namespace xds {
namespace {

// The upper Cholesky factor U of H⁻¹ (H⁻¹ = Uᵀ U), row-major [n, n], lower part zero.
Result<std::vector<double>> inverse_cholesky_upper(std::vector<double> h, int64_t n) {
  const lapack_int ln = static_cast<lapack_int>(n);
  lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', ln, h.data(), ln);
  if (info != 0) {
    return invalid_argument("GPTQ: the damped Hessian [{}, {}] is not positive definite "
                            "(dpotrf info {})", n, n, info);
  }
  info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', ln, h.data(), ln);
  if (info != 0) return invalid_argument("GPTQ: dpotri failed on the Hessian (info {})", info);
  for (int64_t i = 0; i < n; ++i)  // mirror the lower triangle of H⁻¹ into the upper
    for (int64_t j = i + 1; j < n; ++j) h[i * n + j] = h[j * n + i];
  info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', ln, h.data(), ln);
  if (info != 0) {
    return invalid_argument("GPTQ: the inverse Hessian is not positive definite (dpotrf info {})",
                            info);
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) h[i * n + j] = 0.0;
  return h;
}

int8_t quantize_value(double w, double scale) {
  if (scale == 0.0) return 0;
  const double v = std::nearbyint(w / scale);
  return static_cast<int8_t>(std::clamp(v, -127.0, 127.0));
}

}  // namespace

QuantizedLinear rtn_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                             DType scale_dtype) {
  QuantizedLinear out;
  out.q.resize(static_cast<size_t>(rows * cols));
  out.scale.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    out.scale[r] = rtn_quantize_row(w.data() + r * cols, cols, scale_dtype, out.q.data() + r * cols);
  return out;
}

Result<QuantizedLinear> gptq_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                                      std::span<const double> h, const GptqOptions& o) {
  if (rows < 1 || cols < 1 || static_cast<int64_t>(w.size()) != rows * cols ||
      static_cast<int64_t>(h.size()) != cols * cols) {
    return invalid_argument("GPTQ: W holds {} values for [{}, {}], H {} for [{}, {}]", w.size(),
                            rows, cols, h.size(), cols, cols);
  }
  if (o.block_size < 1) return invalid_argument("GPTQ: block size {} < 1", o.block_size);
  // Scales from the original rows (RTN's), kept fixed while the columns move.
  QuantizedLinear out = rtn_quantize(w, rows, cols, o.scale_dtype);

  std::vector<int64_t> order(static_cast<size_t>(cols));  // position p -> column
  std::iota(order.begin(), order.end(), int64_t{0});
  if (o.act_order) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return h[a * cols + a] > h[b * cols + b]; });
  }
  double mean_diag = 0.0;
  for (int64_t i = 0; i < cols; ++i) mean_diag += h[i * cols + i];
  mean_diag /= static_cast<double>(cols);
  const double damp = o.damp * (mean_diag > 0.0 ? mean_diag : 1.0);
  std::vector<double> hp(static_cast<size_t>(cols * cols));  // [cols, cols] in `order`
  for (int64_t p = 0; p < cols; ++p) {
    for (int64_t q = 0; q < cols; ++q) hp[p * cols + q] = h[order[p] * cols + order[q]];
    double& d = hp[p * cols + p];
    if (d == 0.0) d = 1.0;  // a column no calibration input reached
    d += damp;
  }
  XDS_ASSIGN_OR_RETURN(const std::vector<double> u, inverse_cholesky_upper(std::move(hp), cols));

  std::vector<double> wp(static_cast<size_t>(rows * cols));  // [rows, cols] in `order`
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < cols; ++p) wp[r * cols + p] = w[r * cols + order[p]];
  const int64_t bs = std::min(o.block_size, cols);
  std::vector<double> err(static_cast<size_t>(rows * bs));  // [rows, bs] of the current block
  for (int64_t b0 = 0; b0 < cols; b0 += bs) {
    const int64_t b1 = std::min(cols, b0 + bs), nb = b1 - b0;
    for (int64_t r = 0; r < rows; ++r) {  // rows are independent given U
      double* wr = wp.data() + r * cols;
      const double s = out.scale[r];
      for (int64_t p = b0; p < b1; ++p) {
        const int8_t q = quantize_value(wr[p], s);
        out.q[r * cols + order[p]] = q;
        const double e = (wr[p] - q * s) / u[p * cols + p];
        err[r * nb + (p - b0)] = e;
        for (int64_t k = p + 1; k < b1; ++k) wr[k] -= e * u[p * cols + k];
      }
    }
    if (b1 < cols) {  // W[:, b1:] -= Err [rows, nb] · U[b0:b1, b1:]
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(cols - b1), static_cast<int>(nb), -1.0, err.data(),
                  static_cast<int>(nb), u.data() + b0 * cols + b1, static_cast<int>(cols), 1.0,
                  wp.data() + b1, static_cast<int>(cols));
    }
  }
  return out;
}

double relative_output_error(std::span<const float> w, int64_t rows, int64_t cols,
                             const QuantizedLinear& q, std::span<const double> h) {
  // [2·rows, cols]: the rows of W, then those of D = W − Ŵ; times H in one dgemm.
  std::vector<double> a(static_cast<size_t>(2 * rows * cols)), ah(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double v = w[r * cols + c];
      a[r * cols + c] = v;
      a[(rows + r) * cols + c] = v - static_cast<double>(q.q[r * cols + c]) * q.scale[r];
    }
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(2 * rows),
              static_cast<int>(cols), static_cast<int>(cols), 1.0, a.data(),
              static_cast<int>(cols), h.data(), static_cast<int>(cols), 0.0, ah.data(),
              static_cast<int>(cols));
  double den = 0.0, num = 0.0;
  for (int64_t i = 0; i < rows * cols; ++i) den += a[i] * ah[i];
  for (int64_t i = rows * cols; i < 2 * rows * cols; ++i) num += a[i] * ah[i];
  return den > 0.0 ? num / den : 0.0;
}

}  // namespace xds
