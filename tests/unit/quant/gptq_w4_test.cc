// 4-bit grouped GPTQ (quant/gptq.h gptq_w4_quantize) against independent references:
//   - a plain sequential optimal-brain-surgeon sweep (explicit Gauss-Jordan inverse Hessian,
//     no Cholesky, no blocking) whose group scale is taken, by this file's own rule, from the
//     group's current values when its first column is reached: bit for bit, blocked or not;
//   - the output error on the calibration rows X themselves, ‖(W − Ŵ) Xᵀ‖² / ‖W Xᵀ‖², is no
//     worse than RTN's with the same groups (and the Hessian formula agrees with it);
//   - with a diagonal Hessian no error crosses columns, so GPTQ must be round to nearest
//     with one scale per group (absmax / 7 of that group alone);
//   - what the codes dequantize to, scale · (q − z), is the Ŵ the error was computed from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gptq_test_problem.h"
#include "quant/gptq.h"

namespace xds {
namespace {

struct RefW4 {
  std::vector<int> q;           // [rows, cols] signed: ŵ = scale · q
  std::vector<float> scale;     // [rows, cols / G]
};

// This file's 4-bit symmetric rule (F32 scales): scale = max |v| / 7 over the group,
// q = clamp(rne(v / scale), −8, 7).
float ref_scale(const double* v, int64_t g) {
  float amax = 0.0f;
  for (int64_t c = 0; c < g; ++c) amax = std::max(amax, std::fabs(static_cast<float>(v[c])));
  return amax / 7.0f;
}
int ref_code(double v, float s) {
  if (s == 0.0f) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(static_cast<float>(v) / s), -8.0f, 7.0f));
}

RefW4 reference_gptq_w4(const Problem& p, double damp, int64_t g) {
  const int64_t n = p.cols;
  std::vector<double> hd = p.h;
  double mean = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += hd[i * n + i];
  mean /= double(n);
  for (int64_t i = 0; i < n; ++i) hd[i * n + i] += damp * mean;
  const std::vector<double> hinv0 = inverse(hd, n);
  RefW4 out{std::vector<int>(static_cast<size_t>(p.rows * n)),
            std::vector<float>(static_cast<size_t>(p.rows * (n / g)))};
  for (int64_t r = 0; r < p.rows; ++r) {
    std::vector<double> w(p.w.begin() + r * n, p.w.begin() + (r + 1) * n);
    std::vector<double> hi = hinv0;
    float s = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      if (j % g == 0) s = out.scale[r * (n / g) + j / g] = ref_scale(&w[j], g);
      const int q = ref_code(w[j], s);
      out.q[r * n + j] = q;
      const double e = (w[j] - double(s) * q) / hi[j * n + j];
      for (int64_t k = j + 1; k < n; ++k) w[k] -= e * hi[j * n + k];
      eliminate_column(hi, n, j);
    }
  }
  return out;
}

// ‖(W − Ŵ) Xᵀ‖² / ‖W Xᵀ‖² straight from the rows of X, Ŵ = scale · (q − z).
double direct_error(const Problem& p, const W4Linear& q) {
  const int64_t gs = q.cols / q.group;
  double num = 0.0, den = 0.0;
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t r = 0; r < p.rows; ++r) {
      double y = 0.0, yq = 0.0;
      for (int64_t c = 0; c < p.cols; ++c) {
        const int64_t gi = r * gs + c / q.group;
        const double what = double(q.scale[gi]) * (int(q.q[r * p.cols + c]) - int(q.zero[gi]));
        y += double(p.w[r * p.cols + c]) * p.x[t * p.cols + c];
        yq += what * p.x[t * p.cols + c];
      }
      num += (y - yq) * (y - yq);
      den += y * y;
    }
  }
  return num / den;
}

TEST(GptqW4, MatchesTheSequentialReferenceBlockedOrNot) {
  const Problem p = make_problem(10, 48, 200, 11);
  constexpr int64_t kGroup = 16;
  const RefW4 ref = reference_gptq_w4(p, 0.01, kGroup);
  for (int64_t block : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{40}, int64_t{128}}) {
    GptqW4Options o;
    o.group_size = kGroup;
    o.block_size = block;
    o.scale_dtype = DType::kF32;
    auto q = gptq_w4_quantize(p.w, p.rows, p.cols, p.h, o);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    int64_t differ = 0;
    for (size_t i = 0; i < ref.q.size(); ++i) differ += int(q->q[i]) - 8 != ref.q[i];
    EXPECT_EQ(differ, 0) << "block " << block;
    EXPECT_EQ(q->scale, ref.scale) << "block " << block;
    for (uint8_t z : q->zero) ASSERT_EQ(z, 8);
  }
}

TEST(GptqW4, OutputErrorNoWorseThanRtnOnTheSameGroups) {
  for (uint32_t seed : {2u, 3u, 4u}) {
    const Problem p = make_problem(16, 64, 300, seed);
    for (int64_t g : {int64_t{16}, int64_t{32}}) {
      for (bool symmetric : {true, false}) {
        GptqW4Options o;
        o.group_size = g;
        o.symmetric = symmetric;
        o.scale_dtype = DType::kBF16;
        auto q = gptq_w4_quantize(p.w, p.rows, p.cols, p.h, o);
        ASSERT_TRUE(q.ok()) << q.status().to_string();
        const W4Linear r = rtn_w4_quantize(p.w, p.rows, p.cols, g, symmetric, DType::kBF16);
        const double eg = direct_error(p, *q), er = direct_error(p, r);
        EXPECT_NEAR(relative_output_error(p.w, p.rows, p.cols, *q, p.h), eg, 1e-9 + 1e-6 * eg);
        EXPECT_NEAR(relative_output_error(p.w, p.rows, p.cols, r, p.h), er, 1e-9 + 1e-6 * er);
        EXPECT_LE(eg, er) << "seed " << seed << " G " << g << " symmetric " << symmetric;
        EXPECT_LT(eg, 0.8 * er) << "seed " << seed << " G " << g << " symmetric " << symmetric;
        for (size_t i = 0; i < q->q.size(); ++i) ASSERT_LE(q->q[i], 15);
      }
    }
  }
}

TEST(GptqW4, DiagonalHessianIsRoundToNearestWithOneScalePerGroup) {
  Problem p = make_problem(6, 64, 10, 5);
  for (int64_t r = 0; r < p.rows; ++r)  // groups of very different sizes: 1, 10, 100, 1000
    for (int64_t c = 0; c < p.cols; ++c) p.w[r * p.cols + c] *= std::pow(10.0f, float(c / 16));
  std::fill(p.h.begin(), p.h.end(), 0.0);
  for (int64_t i = 0; i < p.cols; ++i) p.h[i * p.cols + i] = 1.0 + double(i % 5);
  GptqW4Options o;
  o.group_size = 16;
  o.scale_dtype = DType::kF32;
  auto q = gptq_w4_quantize(p.w, p.rows, p.cols, p.h, o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t g = 0; g < 4; ++g) {
      std::vector<double> v(p.w.begin() + r * 64 + g * 16, p.w.begin() + r * 64 + g * 16 + 16);
      const float s = ref_scale(v.data(), 16);
      ASSERT_EQ(q->scale[r * 4 + g], s) << "row " << r << " group " << g;
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t i = r * 64 + g * 16 + c;
        ASSERT_EQ(int(q->q[i]) - 8, ref_code(v[c], s)) << "row " << r << " col " << g * 16 + c;
        // What is stored dequantizes to scale · (q − z), the value the sweep fed back.
        EXPECT_EQ(q->dequantized(r, g * 16 + c), double(s) * ref_code(v[c], s));
      }
      if (g > 0) {
        EXPECT_GT(q->scale[r * 4 + g], 5.0f * q->scale[r * 4 + g - 1]);
      }
    }
  }
}

TEST(GptqW4, ColumnsNotAWholeNumberOfGroups) {
  const Problem p = make_problem(4, 40, 50, 6);
  GptqW4Options o;
  o.group_size = 32;
  auto q = gptq_w4_quantize(p.w, p.rows, p.cols, p.h, o);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("40 columns"), std::string::npos) << q.status().message();
}

}  // namespace
}  // namespace xds
