// Activation-reordered 4-bit checkpoints (a permuted g_idx: compressed-tensors actorder
// "group", GPTQ desc_act): model/int4_weights.h binds the panels with the columns sorted by
// group and the linears gather their inputs through the kept order. Checked against plain
// references written from the formats' definitions, which never sort anything: the weight
// of column c is scale[r][g_idx[c]] · (q[r][c] - z[r][g_idx[c]]), taken column by column.
//   - sort_int4_columns_by_group: a stable sort of the columns by group (std::stable_sort
//     of the column numbers), each column's weight unchanged.
//   - W4A16 (fp32 and bf16 rows): y against Σ_c W[r][c] · x[c] in float64, within the fp32
//     bound int4_linear.h states for one path.
//   - W4A8: bit for bit against the plain W4A8 arithmetic (per-token sx = absmax / 127,
//     xq = rne(x / sx); per group the exact integer Σ_{c: g_idx[c] = g} xq[c] · (q - z); one
//     fma per group in group order; times sx), alone, on the calling thread, and in a group
//     of weights sharing x with different orders (gate and up), the identity among them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "int4_tensors.h"
#include "kernels/cpu/int4_matrix.h"
#include "kernels/cpu/linear.h"
#include "model/int4_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_files.h"

namespace xds {
namespace {

using namespace int4_test;

// W[r][c] in float64 from the values as written, g = g_idx[c].
double reference_weight(const Values& v, int64_t r, int64_t c) {
  const int64_t g = r * (v.cols / v.group) + v.group_of(c);
  return double(v.scale[g]) * (int(v.q[r * v.cols + c]) - int(v.zero[g]));
}

// y [n][rows] = x · Wᵀ in float64, column by column.
std::vector<double> reference_product(const Values& v, const std::vector<float>& x, int64_t n) {
  std::vector<double> y(static_cast<size_t>(n * v.rows), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t c = 0; c < v.cols; ++c)
        y[t * v.rows + r] += reference_weight(v, r, c) * double(x[t * v.cols + c]);
  return y;
}

// int4_linear.h's W4A16 bound for one output (first order, here doubled):
// (G + groups + 3) · 2^-24 · Σ_c |sw| (|x_c| |q_c - 8| + |8 - z| |x_c|).
double w4a16_bound(const Values& v, const float* x, int64_t r) {
  double sum = 0;
  for (int64_t c = 0; c < v.cols; ++c) {
    const int64_t g = r * (v.cols / v.group) + v.group_of(c);
    sum += std::fabs(double(v.scale[g])) * std::fabs(double(x[c])) *
           (std::abs(int(v.q[r * v.cols + c]) - 8) + std::abs(8 - int(v.zero[g])));
  }
  const double groups = double(v.cols / v.group);
  return 2 * (double(v.group) + groups + 3) * std::ldexp(1.0, -24) * sum + 1e-30;
}

// The plain W4A8 arithmetic (see the top), y [n][rows].
std::vector<float> reference_w4a8(const Values& v, const std::vector<float>& x, int64_t n) {
  const int64_t groups = v.cols / v.group;
  std::vector<float> y(static_cast<size_t>(n * v.rows));
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * v.cols;
    float amax = 0;
    for (int64_t c = 0; c < v.cols; ++c) amax = std::max(amax, std::fabs(xt[c]));
    const float sx = amax / 127.0f;
    std::vector<int32_t> xq(static_cast<size_t>(v.cols));
    for (int64_t c = 0; c < v.cols; ++c)
      xq[c] = sx == 0 ? 0 : static_cast<int32_t>(std::nearbyint(xt[c] / sx));
    for (int64_t r = 0; r < v.rows; ++r) {
      std::vector<int32_t> s(static_cast<size_t>(groups), 0);
      for (int64_t c = 0; c < v.cols; ++c) {
        const int64_t g = v.group_of(c);
        s[g] += xq[c] * (int(v.q[r * v.cols + c]) - int(v.zero[r * groups + g]));
      }
      float f = 0;
      for (int64_t g = 0; g < groups; ++g)
        f = std::fma(static_cast<float>(s[g]), v.scale[r * groups + g], f);
      y[t * v.rows + r] = f * sx;
    }
  }
  return y;
}

std::vector<float> random_rows(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& e : x) e = nd(rng);
  return x;
}

class Int4ActOrder : public testing::TempDirTest {
 protected:
  // Writes the modules' tensors into one file and binds each module as int4 panels.
  std::vector<MatrixRef> bind(const std::vector<std::pair<std::string, Values>>& modules,
                              const IntQuantization& q) {
    std::vector<RawTensor> ts;
    for (const auto& [m, v] : modules) {
      const auto mt = q.format == Int4Format::kGptq ? gptq_tensors(m, v, q.gptq_zero_minus_one)
                                                    : pack_quantized_tensors(m, v, q.symmetric);
      ts.insert(ts.end(), mt.begin(), mt.end());
    }
    write("model.safetensors", safetensors_of(ts));
    auto ckpt = Checkpoint::open(dir());
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    ckpt_ = std::make_unique<Checkpoint>(std::move(*ckpt));
    RepackOptions ro;
    ro.dir = path("cache");
    ro.progress = false;
    cache_ = std::make_unique<RepackCache>(ro);
    std::vector<MatrixRef> out;
    for (const auto& [m, v] : modules) {
      auto w = bind_int4_linear(*ckpt_, q, m, v.rows, v.cols, *cache_);
      EXPECT_TRUE(w.ok()) << w.status().to_string();
      out.push_back(w.ok() ? *w : MatrixRef{});
    }
    return out;
  }
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<RepackCache> cache_;
};

// The sort is stable by group, and moves whole columns: the new column j has the weights of
// old column order[j] in every row.
TEST(Int4SortColumns, StableByGroupAndEachColumnKeepsItsWeights) {
  const Values v = [] {
    Values r = random_values(5, 128, 32, false, false, 41);
    r.g_idx = shuffled_groups(128, 32, 43);
    return r;
  }();
  Int4Unpacked u;
  u.q = v.q;
  u.scale = v.scale;
  u.zero = v.zero;
  u.rows = v.rows;
  u.cols = v.cols;
  u.group_cols = v.group;
  u.g_idx = v.g_idx;
  const Int4Unpacked before = u;
  const std::vector<int32_t> order = sort_int4_columns_by_group(u);
  std::vector<int32_t> want(128);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(),
                   [&](int32_t a, int32_t b) { return v.g_idx[a] < v.g_idx[b]; });
  EXPECT_EQ(order, want);
  EXPECT_TRUE(u.g_idx.empty());
  EXPECT_EQ(u.scale, before.scale);
  EXPECT_EQ(u.zero, before.zero);
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t j = 0; j < v.cols; ++j)
      ASSERT_EQ(u.weight(r, j), before.weight(r, order[j])) << r << " " << j;
  // The identity: nothing to sort.
  Int4Unpacked id = before;
  id.g_idx.clear();
  EXPECT_TRUE(sort_int4_columns_by_group(id).empty());
  EXPECT_EQ(id.q, before.q);
}

// W4A16 on fp32 and bf16 rows, both formats, symmetric and not, against float64.
TEST_F(Int4ActOrder, W4A16MatchesTheColumnByColumnReference) {
  struct Case {
    Int4Format format;
    bool symmetric;
    int64_t group;
  };
  ThreadPool pool(2);
  for (const Case& c :
       {Case{Int4Format::kPackQuantized, true, 32}, Case{Int4Format::kPackQuantized, false, 64},
        Case{Int4Format::kGptq, false, 32}, Case{Int4Format::kGptq, true, 128}}) {
    const bool gptq = c.format == Int4Format::kGptq;
    const std::string what =
        fmt::format("{} sym {} G{}", gptq ? "gptq" : "pack-quantized", c.symmetric, c.group);
    // 44 rows: the last panel pair part padding; 384 columns: 3 to 12 groups.
    Values v = random_values(44, 384, c.group, c.symmetric, gptq, 7 + uint32_t(c.group));
    v.g_idx = shuffled_groups(384, c.group, 9 + uint32_t(c.group));
    const std::vector<MatrixRef> w =
        bind({{"layer.proj", v}}, quant_of(c.format, c.group, c.symmetric));
    ASSERT_EQ(w[0].layout, MatrixLayout::kInt4Panels) << what;
    ASSERT_NE(kernels::int4_column_order(w[0]), nullptr) << what;
    for (const int64_t n : {1, 5}) {
      std::vector<float> x = random_rows(n, v.cols, 3 + uint32_t(n));
      std::vector<float> y(static_cast<size_t>(n * v.rows));
      kernels::linear_f32(x.data(), n, v.cols, w[0], y.data(), v.rows, pool);
      std::vector<double> want = reference_product(v, x, n);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < v.rows; ++r)
          ASSERT_NEAR(y[t * v.rows + r], want[t * v.rows + r],
                      w4a16_bound(v, x.data() + t * v.cols, r))
              << what << " f32 n " << n << " token " << t << " row " << r;
      // bf16 rows: the reference takes the same rounded values.
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = f32_to_bf16(x[i]);
        x[i] = bf16_to_f32(xb[i]);
      }
      kernels::linear_bf16(xb.data(), n, v.cols, w[0], y.data(), v.rows, pool);
      want = reference_product(v, x, n);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < v.rows; ++r)
          ASSERT_NEAR(y[t * v.rows + r], want[t * v.rows + r],
                      w4a16_bound(v, x.data() + t * v.cols, r))
              << what << " bf16 n " << n << " token " << t << " row " << r;
    }
  }
}

// W4A8: alone (pool and calling thread), then gate and up with their own orders and an
// identity module in one group sharing x, bit for bit.
TEST_F(Int4ActOrder, W4A8IsBitExactAloneAndInAGroupOfDifferentOrders) {
  IntQuantization q = quant_of(Int4Format::kPackQuantized, 32, false);
  q.scheme = IntScheme::kW4A8;
  Values gate = random_values(40, 256, 32, false, false, 51);
  gate.g_idx = shuffled_groups(256, 32, 52);
  Values up = random_values(40, 256, 32, false, false, 53);
  up.g_idx = shuffled_groups(256, 32, 54);
  const Values plain = random_values(24, 256, 32, false, false, 55);  // no g_idx
  const std::vector<MatrixRef> w =
      bind({{"mlp.gate_proj", gate}, {"mlp.up_proj", up}, {"mlp.plain", plain}}, q);
  ASSERT_NE(kernels::int4_column_order(w[0]), nullptr);
  ASSERT_NE(kernels::int4_column_order(w[1]), nullptr);
  ASSERT_NE(kernels::int4_column_order(w[0]), kernels::int4_column_order(w[1]));
  EXPECT_EQ(kernels::int4_column_order(w[2]), nullptr);
  ASSERT_TRUE(w[0].int8_activations);
  ThreadPool pool(2);
  const std::vector<const Values*> values = {&gate, &up, &plain};
  for (const int64_t n : {1, 6}) {
    const std::vector<float> x = random_rows(n, 256, 60 + uint32_t(n));
    for (size_t i = 0; i < 3; ++i) {
      const Values& v = *values[i];
      const std::vector<float> want = reference_w4a8(v, x, n);
      std::vector<float> y(want.size());
      kernels::linear_f32(x.data(), n, 256, w[i], y.data(), v.rows, pool);
      EXPECT_EQ(y, want) << "module " << i << " n " << n;
      std::fill(y.begin(), y.end(), 0.0f);
      kernels::linear_f32_serial(x.data(), n, 256, w[i], y.data(), v.rows);
      EXPECT_EQ(y, want) << "module " << i << " n " << n << " on the calling thread";
    }
    // gate, plain, up, up again: x quantized once, each order gathered for its own weight.
    std::vector<std::vector<float>> ys(4);
    const size_t pick[4] = {0, 2, 1, 1};
    std::vector<kernels::LinearOutput> outs;
    for (size_t i = 0; i < 4; ++i) {
      ys[i].assign(static_cast<size_t>(n * values[pick[i]]->rows), 0.0f);
      outs.push_back({&w[pick[i]], ys[i].data(), values[pick[i]]->rows});
    }
    kernels::linear_f32_group(x.data(), n, 256, outs, pool);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(ys[i], reference_w4a8(*values[pick[i]], x, n)) << "group output " << i;
  }
}

}  // namespace
}  // namespace xds
