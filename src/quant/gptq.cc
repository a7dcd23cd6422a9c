#include "quant/gptq.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "quant/w4_rtn.h"
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

namespace {

// The damped Hessian in `order` (position p -> column), inverted and factored: U [cols, cols].
Result<std::vector<double>> damped_inverse_factor(std::span<const double> h, int64_t cols,
                                                  const std::vector<int64_t>& order,
                                                  double damp_rel) {
  double mean_diag = 0.0;
  for (int64_t i = 0; i < cols; ++i) mean_diag += h[i * cols + i];
  mean_diag /= static_cast<double>(cols);
  const double damp = damp_rel * (mean_diag > 0.0 ? mean_diag : 1.0);
  std::vector<double> hp(static_cast<size_t>(cols * cols));  // [cols, cols] in `order`
  for (int64_t p = 0; p < cols; ++p) {
    for (int64_t q = 0; q < cols; ++q) hp[p * cols + q] = h[order[p] * cols + order[q]];
    double& d = hp[p * cols + p];
    if (d == 0.0) d = 1.0;  // a column no calibration input reached
    d += damp;
  }
  return inverse_cholesky_upper(std::move(hp), cols);
}

// The column sweep: wp [rows, cols] (the weights in processing order) is quantized position
// by position in blocks of bs; quantize_at(r, p, wr) rounds wr[p] (wr: row r of wp, every
// position of the current block up to date) and returns its dequantized value. Positions
// after the block are brought up to date with one dgemm at the block's end.
template <class QuantizeAt>
void gptq_sweep(std::vector<double>& wp, int64_t rows, int64_t cols, const std::vector<double>& u,
                int64_t bs, QuantizeAt&& quantize_at) {
  std::vector<double> err(static_cast<size_t>(rows * bs));  // [rows, bs] of the current block
  for (int64_t b0 = 0; b0 < cols; b0 += bs) {
    const int64_t b1 = std::min(cols, b0 + bs), nb = b1 - b0;
    for (int64_t r = 0; r < rows; ++r) {  // rows are independent given U
      double* wr = wp.data() + r * cols;
      for (int64_t p = b0; p < b1; ++p) {
        const double e = (wr[p] - quantize_at(r, p, wr)) / u[p * cols + p];
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
}

Status check_shapes(std::span<const float> w, int64_t rows, int64_t cols,
                    std::span<const double> h, int64_t block_size) {
  if (rows < 1 || cols < 1 || static_cast<int64_t>(w.size()) != rows * cols ||
      static_cast<int64_t>(h.size()) != cols * cols) {
    return invalid_argument("GPTQ: W holds {} values for [{}, {}], H {} for [{}, {}]", w.size(),
                            rows, cols, h.size(), cols, cols);
  }
  if (block_size < 1) return invalid_argument("GPTQ: block size {} < 1", block_size);
  return {};
}

// ‖(W − Ŵ) Xᵀ‖² / ‖W Xᵀ‖² with Ŵ[r][c] = what(r, c).
template <class Dequantized>
double relative_output_error_of(std::span<const float> w, int64_t rows, int64_t cols,
                                Dequantized&& what, std::span<const double> h) {
  // [2·rows, cols]: the rows of W, then those of D = W − Ŵ; times H in one dgemm.
  std::vector<double> a(static_cast<size_t>(2 * rows * cols)), ah(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double v = w[r * cols + c];
      a[r * cols + c] = v;
      a[(rows + r) * cols + c] = v - what(r, c);
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

}  // namespace

Result<QuantizedLinear> gptq_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                                      std::span<const double> h, const GptqOptions& o) {
  XDS_RETURN_IF_ERROR(check_shapes(w, rows, cols, h, o.block_size));
  // Scales from the original rows (RTN's), kept fixed while the columns move.
  QuantizedLinear out = rtn_quantize(w, rows, cols, o.scale_dtype);

  std::vector<int64_t> order(static_cast<size_t>(cols));  // position p -> column
  std::iota(order.begin(), order.end(), int64_t{0});
  if (o.act_order) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return h[a * cols + a] > h[b * cols + b]; });
  }
  XDS_ASSIGN_OR_RETURN(const std::vector<double> u, damped_inverse_factor(h, cols, order, o.damp));
  std::vector<double> wp(static_cast<size_t>(rows * cols));  // [rows, cols] in `order`
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < cols; ++p) wp[r * cols + p] = w[r * cols + order[p]];
  gptq_sweep(wp, rows, cols, u, std::min(o.block_size, cols),
             [&](int64_t r, int64_t p, const double* wr) {
               const double s = out.scale[r];
               const int8_t q = quantize_value(wr[p], s);
               out.q[r * cols + order[p]] = q;
               return q * s;
             });
  return out;
}

Result<W4Linear> gptq_w4_quantize(std::span<const float> w, int64_t rows, int64_t cols,
                                  std::span<const double> h, const GptqW4Options& o) {
  XDS_RETURN_IF_ERROR(check_shapes(w, rows, cols, h, o.block_size));
  const int64_t g = o.group_size;
  if (g < 1 || cols % g != 0) {
    return invalid_argument("GPTQ: {} columns are not a whole number of groups of {}", cols, g);
  }
  std::vector<int64_t> order(static_cast<size_t>(cols));  // natural: groups stay contiguous
  std::iota(order.begin(), order.end(), int64_t{0});
  XDS_ASSIGN_OR_RETURN(const std::vector<double> u, damped_inverse_factor(h, cols, order, o.damp));
  std::vector<double> wp(w.begin(), w.end());  // [rows, cols]
  W4Linear out(rows, cols, g);
  // Blocks of whole groups: a group's columns are all up to date at its first column.
  const int64_t bs = std::max<int64_t>(1, o.block_size / g) * g;
  std::vector<float> group_values(static_cast<size_t>(g));
  gptq_sweep(wp, rows, cols, u, bs, [&](int64_t r, int64_t p, const double* wr) {
    const int64_t gi = r * out.groups() + p / g;
    W4GroupParams params{out.scale[gi], out.zero[gi]};
    if (p % g == 0) {  // the group's scale, from its error-updated values
      for (int64_t c = 0; c < g; ++c) group_values[c] = static_cast<float>(wr[p + c]);
      params = w4_group_params(group_values.data(), g, o.symmetric, o.scale_dtype);
      out.scale[gi] = params.scale;
      out.zero[gi] = params.zero;
    }
    const uint8_t q = w4_quantize_value(static_cast<float>(wr[p]), params, o.symmetric);
    out.q[r * cols + p] = q;
    return double(params.scale) * (int(q) - int(params.zero));
  });
  return out;
}

W4Linear rtn_w4_quantize(std::span<const float> w, int64_t rows, int64_t cols, int64_t group,
                         bool symmetric, DType scale_dtype) {
  W4Linear out(rows, cols, group);
  for (int64_t r = 0; r < rows; ++r) {
    w4_rtn_quantize_row(w.data() + r * cols, cols, group, symmetric, scale_dtype,
                        {out.q.data() + r * cols, out.scale.data() + r * out.groups(),
                         out.zero.data() + r * out.groups()});
  }
  return out;
}

double relative_output_error(std::span<const float> w, int64_t rows, int64_t cols,
                             const QuantizedLinear& q, std::span<const double> h) {
  return relative_output_error_of(
      w, rows, cols,
      [&](int64_t r, int64_t c) { return static_cast<double>(q.q[r * cols + c]) * q.scale[r]; }, h);
}

double relative_output_error(std::span<const float> w, int64_t rows, int64_t cols,
                             const W4Linear& q, std::span<const double> h) {
  return relative_output_error_of(
      w, rows, cols, [&](int64_t r, int64_t c) { return q.dequantized(r, c); }, h);
}

}  // namespace xds
