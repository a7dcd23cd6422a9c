// W8A8 checkpoints with lm_head and kv_b_proj in int8 too (mkmodel --weights-int8
// --int8-head-and-kv-b): the layout written (config without them in `ignore`, their RTN
// values against the float model of the same seed, computed here), the bound int8 lm_head
// and the absorbed heads of kv_b_proj (W_UK with its row scales folded into the query, W_UV
// with its own) against a plain W8A8 reference bit for bit and against float64 products by
// the dequantized weights within the activation rounding's derived bound, and a scale
// tensor of the wrong shape refused by name. (Whole forwards, absorbed and expanded, against
// the float64 oracle: the conformance case w8a8_head_kv_b_kjv; accuracy of the shipped
// model: tests/integration/model/w8a8_kjv_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_files.h"

namespace xds {
namespace {

using json = nlohmann::json;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class Int8HeadKvB : public xds::testing::TempDirTest {
 protected:
  // The tiny model of `seed` as float (bf16) in dir/float, as W8A8 with int8 lm_head and
  // kv_b_proj in dir/int8 (one safetensors file each).
  void make_pair(uint64_t seed) {
    for (const bool int8 : {false, true}) {
      MkModelOptions o;
      o.out_dir = path(int8 ? "int8" : "float");
      o.seed = seed;
      o.weights_int8 = int8;
      o.int8_head_and_kv_b = int8;
      o.progress = false;
      o.threads = 2;
      const Status s = write_random_checkpoint(o);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
  }
  RepackOptions repack() const {
    RepackOptions o;
    o.dir = path("cache");
    o.progress = false;
    return o;
  }
};

float bf16_at(const TensorView& t, int64_t i) {
  return bf16_to_f32(reinterpret_cast<const uint16_t*>(t.data)[i]);
}

TEST_F(Int8HeadKvB, LayoutQuantizesLmHeadAndKvBWithRtnOfTheFloatModel) {
  make_pair(5);
  std::ifstream cf(path("int8/config.json"));
  const json q = json::parse(cf).at("quantization_config");
  EXPECT_EQ(q.at("config_groups").at("group_0").at("targets"), json::array({"Linear"}));
  EXPECT_EQ(q.at("ignore"), json::parse(R"(["re:.*mlp\\.gate$", "re:.*eh_proj$"])"));
  auto fl = Checkpoint::open(path("float"));
  auto i8 = Checkpoint::open(path("int8"));
  ASSERT_TRUE(fl.ok() && i8.ok());
  int64_t checked = 0;
  for (const std::string& name : fl->names()) {
    const bool head_or_kv_b = name == "lm_head.weight" || name.ends_with(".shared_head.head.weight") ||
                              name.ends_with(".self_attn.kv_b_proj.weight");
    if (name.ends_with(".eh_proj.weight") || name.ends_with(".mlp.gate.weight")) {
      EXPECT_EQ(i8->find(name)->dtype, DType::kBF16) << name;
    }
    if (!head_or_kv_b) continue;
    const TensorView* w = fl->find(name);
    const TensorView* qt = i8->find(name);
    const TensorView* st = i8->find(name + "_scale");
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
    ++checked;
  }
  EXPECT_GE(checked, 3);  // lm_head, the layers' kv_b_proj, the MTP layer's head
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
void expect_w8a8_product(const std::vector<float>& x, int64_t n, int64_t k, const MatrixRef& w,
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

TEST_F(Int8HeadKvB, BoundHeadsAndLmHeadMatchPlainW8A8AndFloat64) {
  make_pair(7);
  auto cfg = load_deepseek_v3_config(path("int8"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto ckpt = Checkpoint::open(path("int8"));
  ASSERT_TRUE(ckpt.ok());
  RepackCache cache(repack());
  auto w = bind_deepseek_v3_weights(*cfg, *ckpt, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const int64_t heads = cfg->num_attention_heads, dn = cfg->qk_nope_head_dim;
  const int64_t dv = cfg->v_head_dim, lat = cfg->kv_lora_rank, d = cfg->hidden_size;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random_rows = [&](int64_t n, int64_t k) {
    std::vector<float> x(static_cast<size_t>(n * k));
    for (float& v : x) v = nd(rng);
    return x;
  };
  auto scales_of = [&](const std::string& name, int64_t first, int64_t count) {
    const TensorView* s = ckpt->find(name + "_scale");
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[i] = bf16_at(*s, first + i);
    return v;
  };
  // lm_head (and the MTP layer's head) as a whole int8 linear.
  for (const auto& [m, name] : {std::pair{&w->lm_head, std::string("lm_head.weight")},
                                std::pair{&w->mtp.at(0).head, std::string("model.layers.") +
                                    std::to_string(cfg->num_hidden_layers) +
                                    ".shared_head.head.weight"}}) {
    const TensorView* t = ckpt->find(name);
    const PlainInt8 ref{reinterpret_cast<const int8_t*>(t->data), d,
                        scales_of(name, 0, cfg->vocab_size)};
    expect_w8a8_product(random_rows(3, d), 3, d, *m, ref, name);
  }
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& l : w->layers) layers.push_back(&l);
  layers.push_back(&w->mtp.at(0).layer);
  for (size_t li = 0; li < layers.size(); ++li) {
    const MlaWeights& a = layers[li]->attn;
    const std::string name = "model.layers." + std::to_string(li) + ".self_attn.kv_b_proj.weight";
    const TensorView* t = ckpt->find(name);
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

// The header of dir/model.safetensors with `tensor`'s shape [rows,1] written as [1,rows]
// (the same number of bytes, so the data offsets stay).
void transpose_scale_shape(const std::string& file, const std::string& tensor) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  in.close();
  const size_t at = bytes.find("\"" + tensor + "\"");
  ASSERT_NE(at, std::string::npos) << tensor;
  const size_t open = bytes.find("\"shape\":[", at) + 9;
  const size_t close = bytes.find(']', open);
  const std::string shape = bytes.substr(open, close - open);  // "rows,1"
  ASSERT_TRUE(shape.ends_with(",1")) << shape;
  bytes.replace(open, close - open, "1," + shape.substr(0, shape.size() - 2));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_F(Int8HeadKvB, AScaleOfTheWrongShapeIsRefusedNamingTheTensor) {
  ModelOptions mo;
  mo.threads = 1;
  for (const std::string tensor :
       {"model.layers.0.self_attn.kv_b_proj.weight_scale", "lm_head.weight_scale"}) {
    make_pair(9);
    transpose_scale_shape(path("int8/model.safetensors"), tensor);
    auto m = DeepseekV3Model::load(path("int8"), mo);
    ASSERT_FALSE(m.ok()) << tensor;
    EXPECT_CONTAINS(m.status().message(), tensor);
    EXPECT_CONTAINS(m.status().message(), "model.safetensors");
  }
}

}  // namespace
}  // namespace xds
