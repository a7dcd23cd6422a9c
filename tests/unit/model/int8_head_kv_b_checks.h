// Checks shared by the tests of checkpoints with lm_head and kv_b_proj in int8 (W8A8, and
// 4-bit ones with a second, int8 config group): the RTN layout written against the float
// model of the same seed, and the bound int8 lm_head and absorbed kv_b_proj heads against the
// plain W8A8 arithmetic on the checkpoint's int8 values, bit for bit, and against float64
// products by the dequantized weights within the activation rounding's derived bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "model/deepseek_v3/config.h"
#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace xds::testing {

inline float bf16_at(const TensorView& t, int64_t i) {
  return bf16_to_f32(reinterpret_cast<const uint16_t*>(t.data)[i]);
}

// One product y = x · Wᵀ by bound int8 panels, checked two ways for each token of x [n, k]:
//   bit for bit against the plain W8A8 arithmetic on the checkpoint's int8 values wq [m, k]
//     (row stride ldw) and fp32 row scales sw: sx = absmax / 127, xq = rne(x / sx),
//     y = (float(Σ xq · wq) · sw) · sx;
//   against float64 x · (wq · sw)ᵀ within the activation rounding's bound:
//     |y - ref| <= Σ_c |sx · xq_c - x_c| · |wq_c| · sw <= sx / 2 · Σ_c |wq_c| · sw,
//     plus 1e-5 of the row's Σ |x_c wq_c| sw for the fp32 sums and scales.
struct PlainInt8 {
  const int8_t* wq;
  int64_t ldw;
  std::vector<float> sw;  // [m]
};
inline void expect_w8a8_product(const std::vector<float>& x, int64_t n, int64_t k, const MatrixRef& w,
                         const PlainInt8& ref, const std::string& what) {
  const int64_t m = w.rows;
  ASSERT_EQ(w.layout, MatrixLayout::kInt8Panels) << what;
  ASSERT_EQ(w.cols, k) << what;
  ThreadPool pool(1);
  std::vector<float> y(static_cast<size_t>(n * m));
  kernels::linear_f32(x.data(), n, k, w, y.data(), m, pool);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * k;
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(xt[c]));
    const float sx = amax / 127.0f;
    for (int64_t r = 0; r < m; ++r) {
      const int8_t* wr = ref.wq + r * ref.ldw;
      int64_t sum = 0;
      double exact = 0, abs_sum = 0, wabs = 0;
      for (int64_t c = 0; c < k; ++c) {
        const int32_t xq = sx == 0 ? 0 : static_cast<int32_t>(std::nearbyint(xt[c] / sx));
        sum += int64_t{xq} * wr[c];
        exact += double{xt[c]} * (static_cast<double>(wr[c]) * ref.sw[r]);
        abs_sum += std::fabs(double{xt[c]} * wr[c] * ref.sw[r]);
        wabs += std::abs(wr[c]) * double{ref.sw[r]};
      }
      const float want = (static_cast<float>(sum) * ref.sw[r]) * sx;
      ASSERT_EQ(y[t * m + r], want) << what << " token " << t << " row " << r;
      const double bound = sx / 2.0 * wabs + 1e-5 * abs_sum;
      ASSERT_LE(std::fabs(y[t * m + r] - exact), bound) << what << " token " << t << " row " << r;
    }
  }
}

// Every lm_head, shared_head.head and kv_b_proj weight of `fl` (the float model) is in `q` as
// I8 + `_scale` [rows, 1]: scale = bf16(absmax / 127), q = clamp(rne(w / scale), -127, 127);
// the router gates and eh_proj stay BF16. Adds the number of matrices checked to *checked.
inline void expect_rtn_head_and_kv_b(const Checkpoint& fl, const Checkpoint& q,
                                     int64_t* checked) {
  for (const std::string& name : fl.names()) {
    const bool head_or_kv_b = name == "lm_head.weight" || name.ends_with(".shared_head.head.weight") ||
                              name.ends_with(".self_attn.kv_b_proj.weight");
    if (name.ends_with(".eh_proj.weight") || name.ends_with(".mlp.gate.weight")) {
      EXPECT_EQ(q.find(name)->dtype, DType::kBF16) << name;
    }
    if (!head_or_kv_b) continue;
    const TensorView* w = fl.find(name);
    const TensorView* qt = q.find(name);
    const TensorView* st = q.find(name + "_scale");
    ASSERT_NE(qt, nullptr) << name;
    ASSERT_NE(st, nullptr) << name;
    ASSERT_EQ(qt->dtype, DType::kI8) << name;
    const int64_t rows = w->shape[0], cols = w->shape[1];
    ASSERT_EQ(st->shape, (std::vector<int64_t>{rows, 1})) << name;
    const auto* qv = reinterpret_cast<const int8_t*>(qt->data);
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(bf16_at(*w, r * cols + c)));
      const float s = bf16_to_f32(f32_to_bf16(amax / 127.0f));
      ASSERT_EQ(bf16_at(*st, r), s) << name << " row " << r;
      for (int64_t c = 0; c < cols; ++c) {
        const float want = std::clamp(std::nearbyint(bf16_at(*w, r * cols + c) / s), -127.0f, 127.0f);
        ASSERT_EQ(qv[r * cols + c], static_cast<int8_t>(want)) << name << " " << r << "," << c;
      }
    }
    ++*checked;
  }
}

// The bound lm_head, the MTP layer's head and every layer's kv_b_proj (whole, and as the
// absorbed heads: W_UK with its row scales folded into the query, W_UV with its own) of `w`,
// bound from `ckpt` under config `c`, as expect_w8a8_product checks them.
inline void expect_bound_head_and_kv_b(const DeepseekV3Config& c, const Checkpoint& ckpt,
                                       const DeepseekV3Weights& w) {
  const int64_t heads = c.num_attention_heads, dn = c.qk_nope_head_dim;
  const int64_t dv = c.v_head_dim, lat = c.kv_lora_rank, d = c.hidden_size;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random_rows = [&](int64_t n, int64_t k) {
    std::vector<float> x(static_cast<size_t>(n * k));
    for (float& v : x) v = nd(rng);
    return x;
  };
  auto scales_of = [&](const std::string& name, int64_t first, int64_t count) {
    const TensorView* s = ckpt.find(name + "_scale");
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[i] = bf16_at(*s, first + i);
    return v;
  };
  // lm_head (and the MTP layer's head) as a whole int8 linear.
  for (const auto& [m, name] : {std::pair{&w.lm_head, std::string("lm_head.weight")},
                                std::pair{&w.mtp.at(0).head, std::string("model.layers.") +
                                    std::to_string(c.num_hidden_layers) +
                                    ".shared_head.head.weight"}}) {
    const TensorView* t = ckpt.find(name);
    const PlainInt8 ref{reinterpret_cast<const int8_t*>(t->data), d,
                        scales_of(name, 0, c.vocab_size)};
    expect_w8a8_product(random_rows(3, d), 3, d, *m, ref, name);
  }
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& l : w.layers) layers.push_back(&l);
  layers.push_back(&w.mtp.at(0).layer);
  for (size_t li = 0; li < layers.size(); ++li) {
    const MlaWeights& a = layers[li]->attn;
    const std::string name = "model.layers." + std::to_string(li) + ".self_attn.kv_b_proj.weight";
    const TensorView* t = ckpt.find(name);
    const auto* q = reinterpret_cast<const int8_t*>(t->data);  // [H·(Dn+Dv), C]
    // The prefill's expansion: the whole kv_b_proj.
    expect_w8a8_product(random_rows(5, lat), 5, lat, a.kv_b_proj,
                        {q, lat, scales_of(name, 0, heads * (dn + dv))}, name);
    ASSERT_EQ(a.uk_t.size(), static_cast<size_t>(heads));
    ASSERT_EQ(a.uv.size(), static_cast<size_t>(heads));
    ASSERT_EQ(a.uk_scale.size(), static_cast<size_t>(heads * dn));
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t uk_row = h * (dn + dv), uv_row = uk_row + dn;
      // W_UK: q_abs = uk_t · (q_nope ⊙ s): the product by W_UK[h]ᵀ = qᵀ · diag(s) as the
      // plain arithmetic on qᵀ with unit scales, its input the folded query.
      const std::vector<float> s = scales_of(name, uk_row, dn);
      for (int64_t i = 0; i < dn; ++i) ASSERT_EQ(a.uk_scale[h * dn + i], s[i]) << name;
      std::vector<float> q_nope = random_rows(2, dn), folded(q_nope.size());
      for (int64_t tk = 0; tk < 2; ++tk)
        for (int64_t i = 0; i < dn; ++i) folded[tk * dn + i] = q_nope[tk * dn + i] * s[i];
      std::vector<int8_t> uk_t(static_cast<size_t>(lat * dn));  // [C, Dn]
      for (int64_t i = 0; i < dn; ++i)
        for (int64_t c = 0; c < lat; ++c) uk_t[c * dn + i] = q[(uk_row + i) * lat + c];
      expect_w8a8_product(folded, 2, dn, a.uk_t[h],
                          {uk_t.data(), dn, std::vector<float>(static_cast<size_t>(lat), 1.0f)},
                          name + " W_UK head " + std::to_string(h));
      // The fold is exact in float64: Σ_i q_nope_i (q_ic s_i) = Σ_i (q_nope_i s_i) q_ic, so
      // the bound above, on the folded input, is the bound against the dequantized W_UK.
      // W_UV: its rows' own scales.
      expect_w8a8_product(random_rows(2, lat), 2, lat, a.uv[h],
                          {q + uv_row * lat, lat, scales_of(name, uv_row, dv)},
                          name + " W_UV head " + std::to_string(h));
    }
  }
}


}  // namespace xds::testing
