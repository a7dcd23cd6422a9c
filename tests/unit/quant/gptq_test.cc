// GPTQ against a plain double-precision reference: the sequential optimal-brain-surgeon
// update with an explicit inverse Hessian (Gauss-Jordan, no Cholesky, no blocking): after
// column j is rounded, the other columns k still free move by e · Hinv[j][k] / Hinv[j][j]
// and j is eliminated from Hinv (Hinv ← Hinv − Hinv[:, j] Hinv[j, :] / Hinv[j][j]).
#include "quant/gptq.h"

#include "gptq_test_problem.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace xds {
namespace {

// The reference: F32 scales (absmax / 127 of each original row), damping as documented.
std::vector<int8_t> reference_gptq(const Problem& p, double damp, bool act_order) {
  const int64_t n = p.cols;
  std::vector<double> hd = p.h;
  double mean = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += hd[i * n + i];
  mean /= double(n);
  for (int64_t i = 0; i < n; ++i) hd[i * n + i] += damp * mean;
  const std::vector<double> hinv0 = inverse(hd, n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (act_order) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p.h[a * n + a] > p.h[b * n + b]; });
  }
  std::vector<int8_t> q(static_cast<size_t>(p.rows * n));
  for (int64_t r = 0; r < p.rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < n; ++c) amax = std::max(amax, std::fabs(p.w[r * n + c]));
    const double s = amax / 127.0f;
    std::vector<double> w(p.w.begin() + r * n, p.w.begin() + (r + 1) * n);
    std::vector<double> hi = hinv0;
    std::vector<bool> done(static_cast<size_t>(n), false);
    for (int64_t j : order) {
      const double v = std::clamp(std::nearbyint(w[j] / s), -127.0, 127.0);
      q[r * n + j] = static_cast<int8_t>(v);
      const double e = (w[j] - v * s) / hi[j * n + j];
      done[j] = true;
      for (int64_t k = 0; k < n; ++k)
        if (!done[k]) w[k] -= e * hi[j * n + k];
      eliminate_column(hi, n, j);
    }
  }
  return q;
}

// ‖(W − Ŵ) Xᵀ‖² / ‖W Xᵀ‖² straight from the rows of X.
double direct_error(const Problem& p, const QuantizedLinear& q) {
  double num = 0.0, den = 0.0;
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t r = 0; r < p.rows; ++r) {
      double y = 0.0, yq = 0.0;
      for (int64_t c = 0; c < p.cols; ++c) {
        y += double(p.w[r * p.cols + c]) * p.x[t * p.cols + c];
        yq += double(q.q[r * p.cols + c]) * q.scale[r] * p.x[t * p.cols + c];
      }
      num += (y - yq) * (y - yq);
      den += y * y;
    }
  }
  return num / den;
}

TEST(Gptq, MatchesTheSequentialReferenceBlockedOrNot) {
  const Problem p = make_problem(12, 40, 200, 1);
  for (bool act_order : {false, true}) {
    const std::vector<int8_t> ref = reference_gptq(p, 0.01, act_order);
    for (int64_t block : {int64_t{1}, int64_t{7}, int64_t{128}}) {
      GptqOptions o;
      o.act_order = act_order;
      o.block_size = block;
      o.scale_dtype = DType::kF32;
      auto q = gptq_quantize(p.w, p.rows, p.cols, p.h, o);
      ASSERT_TRUE(q.ok()) << q.status().to_string();
      int64_t differ = 0;
      for (size_t i = 0; i < ref.size(); ++i) differ += q->q[i] != ref[i];
      EXPECT_EQ(differ, 0) << "act_order " << act_order << " block " << block;
    }
  }
}

TEST(Gptq, OutputErrorBelowRtnAndTheErrorFormulaMatchesTheRows) {
  const Problem p = make_problem(16, 48, 300, 2);
  GptqOptions o;
  o.scale_dtype = DType::kBF16;
  auto g = gptq_quantize(p.w, p.rows, p.cols, p.h, o);
  ASSERT_TRUE(g.ok());
  const QuantizedLinear r = rtn_quantize(p.w, p.rows, p.cols, DType::kBF16);
  const double eg = relative_output_error(p.w, p.rows, p.cols, *g, p.h);
  const double er = relative_output_error(p.w, p.rows, p.cols, r, p.h);
  EXPECT_NEAR(eg, direct_error(p, *g), 1e-9 + 1e-6 * eg);
  EXPECT_NEAR(er, direct_error(p, r), 1e-9 + 1e-6 * er);
  EXPECT_LT(eg, 0.7 * er);
  EXPECT_EQ(g->scale, r.scale);  // GPTQ keeps RTN's per-row scales
}

TEST(Gptq, DeadColumnsAndBadShapes) {
  Problem p = make_problem(4, 8, 50, 3);
  for (int64_t i = 0; i < 8; ++i) {  // channel 5 never active
    p.h[5 * 8 + i] = 0.0;
    p.h[i * 8 + 5] = 0.0;
  }
  auto q = gptq_quantize(p.w, p.rows, p.cols, p.h, GptqOptions{});
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  auto bad = gptq_quantize(p.w, p.rows, p.cols + 1, p.h, GptqOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[4, 9]"), std::string::npos) << bad.status().message();
  std::vector<double> neg(64, 0.0);
  for (int i = 0; i < 8; ++i) neg[i * 8 + i] = -1.0;
  auto nd = gptq_quantize(p.w, p.rows, p.cols, neg, GptqOptions{});
  ASSERT_FALSE(nd.ok());
  EXPECT_NE(nd.status().message().find("positive definite"), std::string::npos);
}

}  // namespace
}  // namespace xds
