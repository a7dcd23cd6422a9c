// W8A8 checkpoints end to end on the tiny preset: the layout mkmodel --weights-int8 writes
// (compressed-tensors, checked field by field and value by value against an RTN computed
// here from the float model of the same seed), the loader's agreement checks, the bound
// int8 linears against a plain scalar W8A8 reference (bit for bit), the grouped and fused
// forms against the single products. (Whole forwards: tests/integration/model
// w8a8_kjv_test.cc and the conformance case w8a8_kjv: a random model amplifies one
// quantization step of difference into percents of its logits, a trained one does not.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/int8_mlp.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_files.h"

namespace xds {
namespace {

using json = nlohmann::json;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class W8A8Checkpoint : public xds::testing::TempDirTest {
 protected:
  // The tiny model of `seed` as float (bf16) and as W8A8, in dir/float and dir/int8.
  void make_pair(uint64_t seed, int shards = 1) {
    for (const bool int8 : {false, true}) {
      MkModelOptions o;
      o.out_dir = path(int8 ? "int8" : "float");
      o.seed = seed;
      o.shards = shards;
      o.weights_int8 = int8;
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

// The weights the layout quantizes, by name (this test's own list).
bool quantized_name(const std::string& n) {
  for (const char* s :
       {"q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "o_proj.weight",
        "gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    if (n.size() > std::strlen(s) && n.ends_with(s) && n[n.size() - std::strlen(s) - 1] == '.')
      return true;
  }
  return false;
}

float bf16_round(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

TEST_F(W8A8Checkpoint, LayoutIsCompressedTensorsWithRtnOfTheFloatModel) {
  make_pair(5, 2);
  std::ifstream cf(path("int8/config.json"));
  const json config = json::parse(cf);
  const json& q = config.at("quantization_config");
  EXPECT_EQ(q.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(q.at("format"), "int-quantized");
  ASSERT_EQ(q.at("config_groups").size(), 1u);
  const json& g = q.at("config_groups").at("group_0");
  EXPECT_EQ(g.at("targets"), json::array({"Linear"}));
  for (const auto& [part, strategy, dynamic] :
       {std::tuple{"weights", "channel", false}, std::tuple{"input_activations", "token", true}}) {
    const json& a = g.at(part);
    EXPECT_EQ(a.at("num_bits"), 8) << part;
    EXPECT_EQ(a.at("type"), "int") << part;
    EXPECT_EQ(a.at("symmetric"), true) << part;
    EXPECT_EQ(a.at("strategy"), strategy) << part;
    EXPECT_EQ(a.at("dynamic"), dynamic) << part;
  }
  EXPECT_EQ(q.at("ignore"), json::parse(R"(["lm_head", "re:.*mlp\\.gate$", "re:.*kv_b_proj$",
                                              "re:.*eh_proj$", "re:.*shared_head\\.head$"])"));
  std::ifstream idx(path("int8/model.safetensors.index.json"));
  const json wm = json::parse(idx).at("weight_map");

  auto fl = Checkpoint::open(path("float"));
  auto i8 = Checkpoint::open(path("int8"));
  ASSERT_TRUE(fl.ok() && i8.ok());
  int64_t quantized = 0, copied = 0;
  for (const std::string& name : fl->names()) {
    const TensorView* f = fl->find(name);
    const TensorView* t = i8->find(name);
    ASSERT_NE(t, nullptr) << name;
    if (!quantized_name(name)) {
      ASSERT_EQ(t->dtype, f->dtype) << name;
      ASSERT_EQ(t->shape, f->shape) << name;
      ASSERT_EQ(std::memcmp(t->data, f->data, f->nbytes), 0) << name;
      ++copied;
      continue;
    }
    ++quantized;
    ASSERT_EQ(t->dtype, DType::kI8) << name;
    ASSERT_EQ(t->shape, f->shape) << name;
    const TensorView* s = i8->find(name + "_scale");
    ASSERT_NE(s, nullptr) << name;
    ASSERT_EQ(s->dtype, DType::kBF16) << name;
    ASSERT_EQ(s->shape, (std::vector<int64_t>{f->shape[0], 1})) << name;
    EXPECT_EQ(wm.at(name), wm.at(name + "_scale")) << "a weight and its scale share a shard";
    const int64_t rows = f->shape[0], cols = f->shape[1];
    const auto* w = reinterpret_cast<const uint16_t*>(f->data);
    const auto* qv = reinterpret_cast<const int8_t*>(t->data);
    const auto* sv = reinterpret_cast<const uint16_t*>(s->data);
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0;
      for (int64_t c = 0; c < cols; ++c)
        amax = std::max(amax, std::fabs(bf16_to_f32(w[r * cols + c])));
      const float scale = bf16_round(amax / 127.0f);
      ASSERT_EQ(bf16_to_f32(sv[r]), scale) << name << " row " << r;
      for (int64_t c = 0; c < cols; ++c) {
        const float x = bf16_to_f32(w[r * cols + c]) / scale;
        const float want = std::clamp(std::nearbyint(x), -127.0f, 127.0f);
        ASSERT_EQ(static_cast<float>(qv[r * cols + c]), want)
            << name << " [" << r << "][" << c << "]";
      }
    }
  }
  // Tiny: 4 layers (3 + MTP), 3 attention projections with q_lora + o_proj each; MLPs: one
  // dense layer, 3 MoE layers of 16 experts + a shared one.
  EXPECT_EQ(quantized, 4 * 4 + 3 * (1 + 3 * (16 + 1)));
  EXPECT_GT(copied, 0);
}

// The bound int8 linears multiply as the plain W8A8 arithmetic does, bit for bit:
// per token s = absmax / 127, xq = rne(x / s); Σ xq · wq in integers;
// y = (float(Σ) · sw) · s — the weights read from the checkpoint file, not the panels.
TEST_F(W8A8Checkpoint, BoundLinearsMatchAPlainW8A8Reference) {
  make_pair(7);
  auto cfg = load_deepseek_v3_config(path("int8"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto ckpt = Checkpoint::open(path("int8"));
  ASSERT_TRUE(ckpt.ok());
  RepackCache cache(repack());
  auto w = bind_deepseek_v3_weights(*cfg, *ckpt, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& l1 = w->layers[1];
  EXPECT_EQ(l1.attn.q_a_proj->layout, MatrixLayout::kInt8Panels);
  EXPECT_EQ(l1.moe->router.dtype, DType::kBF16);     // ignored: the router gate
  EXPECT_EQ(l1.attn.kv_b_proj.dtype, DType::kBF16);  // ignored: kv_b_proj
  EXPECT_EQ(w->lm_head.dtype, DType::kBF16);
  struct Case {
    const MatrixRef* m;
    std::string name;
  };
  // Every quantized matrix of the main layers.
  std::vector<Case> cases;
  for (size_t i = 0; i < w->layers.size(); ++i) {
    const LayerWeights& l = w->layers[i];
    const std::string p = "model.layers." + std::to_string(i);
    cases.push_back({&*l.attn.q_a_proj, p + ".self_attn.q_a_proj.weight"});
    cases.push_back({&*l.attn.q_b_proj, p + ".self_attn.q_b_proj.weight"});
    cases.push_back({&l.attn.kv_a_proj, p + ".self_attn.kv_a_proj_with_mqa.weight"});
    cases.push_back({&l.attn.o_proj, p + ".self_attn.o_proj.weight"});
    auto mlp = [&](const MlpWeights& m, const std::string& q) {
      cases.push_back({&m.gate_proj, q + ".gate_proj.weight"});
      cases.push_back({&m.up_proj, q + ".up_proj.weight"});
      cases.push_back({&m.down_proj, q + ".down_proj.weight"});
    };
    if (l.dense) mlp(*l.dense, p + ".mlp");
    if (l.moe) {
      for (size_t e = 0; e < l.moe->experts.size(); ++e)
        mlp(l.moe->experts[e], p + ".mlp.experts." + std::to_string(e));
      mlp(*l.moe->shared, p + ".mlp.shared_experts");
    }
  }
  ThreadPool pool(2);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases) {
    const TensorView* t = ckpt->find(c.name);
    const TensorView* s = ckpt->find(c.name + "_scale");
    ASSERT_NE(t, nullptr);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    ASSERT_EQ(c.m->layout, MatrixLayout::kInt8Panels) << c.name;
    for (const int64_t n : {1, 13}) {
      std::vector<float> x(static_cast<size_t>(n * cols));
      for (float& v : x) v = nd(rng);
      x[0] = 0.0f;
      std::vector<float> y(static_cast<size_t>(n * rows));
      kernels::linear_f32(x.data(), n, cols, *c.m, y.data(), rows, pool);
      const auto* qw = reinterpret_cast<const int8_t*>(t->data);
      const auto* sw = reinterpret_cast<const uint16_t*>(s->data);
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x.data() + i * cols;
        float amax = 0;
        for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(xi[k]));
        const float sx = amax / 127.0f;
        std::vector<int32_t> xq(static_cast<size_t>(cols));
        for (int64_t k = 0; k < cols; ++k)
          xq[k] = sx == 0 ? 0 : static_cast<int32_t>(std::nearbyint(xi[k] / sx));
        for (int64_t r = 0; r < rows; ++r) {
          int64_t sum = 0;
          for (int64_t k = 0; k < cols; ++k) sum += int64_t{xq[k]} * qw[r * cols + k];
          const float want = (static_cast<float>(sum) * bf16_to_f32(sw[r])) * sx;
          ASSERT_EQ(y[i * rows + r], want)
              << c.name << " n " << n << " token " << i << " row " << r;
        }
      }
    }
  }
}

// q_a and kv_a read the same input: the group quantizes it once; each output is what
// linear_f32 gives alone.
TEST_F(W8A8Checkpoint, GroupedProductsMatchSingleOnes) {
  make_pair(7);
  auto cfg = load_deepseek_v3_config(path("int8"));
  ASSERT_TRUE(cfg.ok());
  auto ckpt = Checkpoint::open(path("int8"));
  ASSERT_TRUE(ckpt.ok());
  RepackCache cache(repack());
  auto w = bind_deepseek_v3_weights(*cfg, *ckpt, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ThreadPool pool(2);
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const MlaWeights& a = w->layers[1].attn;
  const int64_t d = cfg->hidden_size, qr = a.q_a_proj->rows, kr = a.kv_a_proj.rows;
  for (const int64_t n : {1, 4, 70}) {
    std::vector<float> x(static_cast<size_t>(n * d));
    for (float& v : x) v = nd(rng);
    std::vector<float> qa(n * qr), kva(n * kr), qa1(n * qr), kva1(n * kr);
    const kernels::LinearOutput outs[] = {{&*a.q_a_proj, qa.data(), qr},
                                          {&a.kv_a_proj, kva.data(), kr}};
    kernels::linear_f32_group(x.data(), n, d, outs, pool);
    kernels::linear_f32(x.data(), n, d, *a.q_a_proj, qa1.data(), qr, pool);
    kernels::linear_f32(x.data(), n, d, a.kv_a_proj, kva1.data(), kr, pool);
    EXPECT_EQ(qa, qa1) << n;
    EXPECT_EQ(kva, kva1) << n;
  }
}

// The fused W8A8 MLP (int8_mlp: gate and up in one kernel, h quantized in its epilogue)
// against its parts: linear_f32 of gate and up, silu(g) · u in fp32, linear_f32 of down on
// that h, for every MLP of the model, on the pool and on the calling thread. The SiLU's exp
// differs (the kernels' approximation against std::exp), so h may cross a rounding boundary
// of its quantization now and then: within 1e-3 of the output's largest value.
TEST_F(W8A8Checkpoint, FusedMlpMatchesItsParts) {
  make_pair(7);
  auto cfg = load_deepseek_v3_config(path("int8"));
  ASSERT_TRUE(cfg.ok());
  auto ckpt = Checkpoint::open(path("int8"));
  ASSERT_TRUE(ckpt.ok());
  RepackCache cache(repack());
  auto w = bind_deepseek_v3_weights(*cfg, *ckpt, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  std::vector<std::pair<const MlpWeights*, std::string>> mlps;
  for (size_t i = 0; i < w->layers.size(); ++i) {
    const LayerWeights& l = w->layers[i];
    if (l.dense) mlps.push_back({&*l.dense, "dense " + std::to_string(i)});
    if (!l.moe) continue;
    for (size_t e = 0; e < l.moe->experts.size(); ++e)
      mlps.push_back({&l.moe->experts[e], fmt::format("layer {} expert {}", i, e)});
    mlps.push_back({&*l.moe->shared, "shared " + std::to_string(i)});
  }
  ThreadPool pool(2);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 3, d = cfg->hidden_size;
  for (const auto& [mlp, what] : mlps) {
    ASSERT_TRUE(is_int8_mlp(*mlp)) << what;
    const int64_t width = mlp->gate_proj.rows;
    std::vector<float> x(static_cast<size_t>(n * d));
    for (float& v : x) v = nd(rng);
    std::vector<float> g(n * width), u(n * width), want(n * d);
    kernels::linear_f32(x.data(), n, d, mlp->gate_proj, g.data(), width, pool);
    kernels::linear_f32(x.data(), n, d, mlp->up_proj, u.data(), width, pool);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    kernels::linear_f32(g.data(), n, width, mlp->down_proj, want.data(), d, pool);
    const kernels::Int8Rows xq = kernels::quantize_int8(x.data(), n, d);
    for (ThreadPool* p : {&pool, static_cast<ThreadPool*>(nullptr)}) {
      Int8MlpScratch scratch;
      std::vector<float> got(n * d);
      int8_mlp(*mlp, xq.ref(), got.data(), d, scratch, p);
      float mx = 0, err = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        mx = std::max(mx, std::fabs(want[i]));
        err = std::max(err, std::fabs(got[i] - want[i]));
      }
      EXPECT_LE(err, 1e-3f * mx) << what << (p ? " on the pool" : " on the thread");
    }
  }
}

// Rewrites int8/config.json's ignore list.
void set_ignore(const std::string& dir, const json& ignore) {
  std::ifstream in(dir + "/config.json");
  json c = json::parse(in);
  in.close();
  c["quantization_config"]["ignore"] = ignore;
  std::ofstream(dir + "/config.json") << c.dump(2);
}

TEST_F(W8A8Checkpoint, TensorsThatDisagreeWithTheIgnoreListAreRefused) {
  make_pair(9);
  const std::string dir = path("int8");
  ModelOptions mo;
  mo.threads = 1;
  // An I8 weight whose module the config ignores.
  set_ignore(dir, {"lm_head", "re:.*mlp\\.gate$", "re:.*kv_b_proj$", "re:.*eh_proj$",
                   "re:.*shared_head\\.head$", "model.layers.0.self_attn.q_a_proj"});
  auto m = DeepseekV3Model::load(dir, mo);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "model.layers.0.self_attn.q_a_proj.weight");
  EXPECT_CONTAINS(m.status().message(), "quantization_config.ignore");
  EXPECT_CONTAINS(m.status().message(), "model.safetensors");
  // A BF16 weight the config quantizes (kv_b_proj no longer ignored).
  set_ignore(dir, {"lm_head", "re:.*mlp\\.gate$", "re:.*eh_proj$", "re:.*shared_head\\.head$"});
  m = DeepseekV3Model::load(dir, mo);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "model.layers.0.self_attn.kv_b_proj.weight");
  EXPECT_CONTAINS(m.status().message(), "dtype BF16");
}

}  // namespace
}  // namespace xds
