// 4-bit checkpoints end to end on the tiny preset (mkmodel --weights-int4):
//   - W4A16: the model loaded from the int4 checkpoint gives the logits of the same model
//     loaded from a float checkpoint this test writes from the int4 one: each quantized
//     module unpacked by the test's own reader (from the layouts' definitions) and
//     dequantized, scale · (q - z) of the column's group g_idx[c] (c / G without one), into
//     F32 weights, which the loader binds as plain rows and the float kernels multiply.
//     compressed-tensors sym / asym and GPTQ, in natural column order and with activation
//     reordering (--int4-actorder group: a permuted g_idx per module).
//   - W4A8: every bound int4 linear against a plain scalar W4A8 (per-token int8 x, exact
//     int32 group sums, one fma per group, times the token scale), bit for bit; the
//     --activation-dtype int8 option on a W4A16 checkpoint gives the bits of the W4A8 config.
//   - the config and the tensors must agree (an ignored module with packed weights, a
//     quantized one with a float weight).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/int4_matrix.h"
#include "kernels/cpu/linear.h"
#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "quant/checkpoint_writer.h"
#include "tensor/dtype.h"
#include "test_files.h"

namespace xds {
namespace {

using json = nlohmann::json;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

uint32_t word(const TensorView& t, int64_t i) {
  uint32_t v;
  std::memcpy(&v, t.data + i * 4, 4);
  return v;
}

float real(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, t.data + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data + i * 2, 2);
  return t.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// This test's reader of one quantized module: q [rows][cols], scale and zero [rows][groups],
// g_idx [cols] the group of each column (empty: c / group).
struct Module {
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<int> q, zero;
  std::vector<float> scale;
  std::vector<int32_t> g_idx;
  int64_t group_of(int64_t c) const { return g_idx.empty() ? c / group : g_idx[c]; }
  float w(int64_t r, int64_t c) const {
    const int64_t g = r * (cols / group) + group_of(c);
    return scale[g] * static_cast<float>(q[r * cols + c] - zero[g]);
  }
};

// The I32 [cols] g_idx tensor `name`, if present.
std::vector<int32_t> read_g_idx(const Checkpoint& ck, const std::string& name) {
  std::vector<int32_t> g;
  if (const TensorView* t = ck.find(name)) {
    for (int64_t c = 0; c < t->shape[0]; ++c) g.push_back(static_cast<int32_t>(word(*t, c)));
  }
  return g;
}

// compressed-tensors pack-quantized: nibble c % 8 of word [r][c / 8]; zero points nibble
// r % 8 of word [r / 8][g] (8 when absent).
Module read_pack_quantized(const Checkpoint& ck, const std::string& m) {
  const TensorView& p = *ck.find(m + ".weight_packed");
  const TensorView& s = *ck.find(m + ".weight_scale");
  const TensorView* z = ck.find(m + ".weight_zero_point");
  Module o;
  o.rows = p.shape[0];
  o.cols = p.shape[1] * 8;
  const int64_t groups = s.shape[1];
  o.group = o.cols / groups;
  for (int64_t r = 0; r < o.rows; ++r)
    for (int64_t c = 0; c < o.cols; ++c)
      o.q.push_back(int((word(p, r * (o.cols / 8) + c / 8) >> (4 * (c % 8))) & 15));
  for (int64_t r = 0; r < o.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      o.scale.push_back(real(s, r * groups + g));
      o.zero.push_back(z ? int((word(*z, (r / 8) * groups + g) >> (4 * (r % 8))) & 15) : 8);
    }
  }
  o.g_idx = read_g_idx(ck, m + ".weight_g_idx");
  return o;
}

// GPTQ v1: nibble c % 8 of qweight [c / 8][r]; zero points nibble r % 8 of qzeros
// [g][r / 8], plus 1; scales [g][r].
Module read_gptq(const Checkpoint& ck, const std::string& m) {
  const TensorView& qw = *ck.find(m + ".qweight");
  const TensorView& qz = *ck.find(m + ".qzeros");
  const TensorView& sc = *ck.find(m + ".scales");
  Module o;
  o.rows = qw.shape[1];
  o.cols = qw.shape[0] * 8;
  const int64_t groups = sc.shape[0], zc = qz.shape[1];
  o.group = o.cols / groups;
  for (int64_t r = 0; r < o.rows; ++r)
    for (int64_t c = 0; c < o.cols; ++c)
      o.q.push_back(int((word(qw, (c / 8) * o.rows + r) >> (4 * (c % 8))) & 15));
  for (int64_t r = 0; r < o.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      o.scale.push_back(real(sc, g * o.rows + r));
      o.zero.push_back(int((word(qz, g * zc + r / 8) >> (4 * (r % 8))) & 15) + 1);
    }
  }
  o.g_idx = read_g_idx(ck, m + ".g_idx");
  return o;
}

// The quantized modules of a checkpoint (by their packed tensor) and the reader of each.
std::vector<std::pair<std::string, Module>> read_modules(const Checkpoint& ck) {
  std::vector<std::pair<std::string, Module>> out;
  for (const std::string& n : ck.names()) {
    if (n.ends_with(".weight_packed"))
      out.emplace_back(n.substr(0, n.size() - 14),
                       read_pack_quantized(ck, n.substr(0, n.size() - 14)));
    if (n.ends_with(".qweight"))
      out.emplace_back(n.substr(0, n.size() - 8), read_gptq(ck, n.substr(0, n.size() - 8)));
  }
  return out;
}

bool quant_side_tensor(const std::string& n) {
  for (const char* s : {".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point",
                        ".weight_g_idx", ".qweight", ".qzeros", ".scales", ".g_idx"}) {
    if (n.ends_with(s)) return true;
  }
  return false;
}

class Int4Checkpoint : public testing::TempDirTest {
 protected:
  // The tiny model of seed 7 as a 4-bit checkpoint in dir/name.
  void make(const std::string& name, const std::string& sym, const std::string& format,
            int64_t group, bool int8_activations = false, const std::string& actorder = "none") {
    MkModelOptions o;
    o.out_dir = path(name);
    o.seed = 7;
    o.weights_int4 = sym;
    o.int4_group_size = group;
    o.int4_format = format;
    o.int4_int8_activations = int8_activations;
    o.int4_actorder = actorder;
    o.progress = false;
    o.threads = 2;
    const Status s = write_random_checkpoint(o);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  // Every quantized module of dir/name has a g_idx whose groups are permuted (not c / G),
  // each group holding G columns, and the config says so.
  void expect_permuted_groups(const std::string& name) {
    auto ck = Checkpoint::open(path(name));
    ASSERT_TRUE(ck.ok());
    for (const auto& [m, mod] : read_modules(*ck)) {
      ASSERT_EQ(mod.g_idx.size(), static_cast<size_t>(mod.cols)) << m;
      std::vector<int64_t> count(static_cast<size_t>(mod.cols / mod.group), 0);
      bool identity = true;
      for (int64_t c = 0; c < mod.cols; ++c) {
        ++count.at(static_cast<size_t>(mod.g_idx[c]));
        identity = identity && mod.g_idx[c] == c / mod.group;
      }
      EXPECT_FALSE(identity) << m;
      for (const int64_t k : count) EXPECT_EQ(k, mod.group) << m;
    }
    std::ifstream in(path(name + "/config.json"));
    const json q = json::parse(in)["quantization_config"];
    if (q["quant_method"] == "gptq") {
      EXPECT_EQ(q["desc_act"], true);
    } else {
      EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["actorder"], "group");
    }
  }
  // dir/name's weights dequantized by this test into F32 `<m>.weight`, in dir/out, no
  // quantization_config.
  void write_dequantized(const std::string& name, const std::string& out) {
    auto ck = Checkpoint::open(path(name));
    ASSERT_TRUE(ck.ok());
    std::vector<OutTensor> ts;
    int64_t quantized = 0;
    for (const auto& [m, mod] : read_modules(*ck)) {
      OutTensor t{m + ".weight", DType::kF32, {mod.rows, mod.cols}, {}};
      t.bytes.resize(static_cast<size_t>(mod.rows * mod.cols * 4));
      auto* f = reinterpret_cast<float*>(t.bytes.data());
      for (int64_t r = 0; r < mod.rows; ++r)
        for (int64_t c = 0; c < mod.cols; ++c) f[r * mod.cols + c] = mod.w(r, c);
      ts.push_back(std::move(t));
      ++quantized;
    }
    EXPECT_GT(quantized, 100);
    for (const std::string& n : ck->names()) {
      if (quant_side_tensor(n)) continue;
      const TensorView* v = ck->find(n);
      OutTensor t{n, v->dtype, v->shape, {}};
      t.bytes.assign(v->data, v->data + v->nbytes);
      ts.push_back(std::move(t));
    }
    std::filesystem::create_directories(path(out));
    ASSERT_TRUE(write_sharded_safetensors(path(out), ts, int64_t{1} << 40).ok());
    std::ifstream in(path(name + "/config.json"));
    json c = json::parse(in);
    c.erase("quantization_config");
    std::ofstream(path(out + "/config.json")) << c.dump(2);
    std::filesystem::copy_file(path(name + "/generation_config.json"),
                               path(out + "/generation_config.json"));
  }
  // The W4A8 test's body for one --int4-actorder value.
  void check_w4a8_bound_linears(const std::string& actorder);
};

// Logits [tokens, vocab] of one prompt, all positions.
std::vector<float> logits_of(const std::string& dir, ComputeDType compute,
                             ActivationDType act = ActivationDType::kAuto) {
  ModelOptions mo;
  mo.threads = 2;
  mo.compute = compute;
  mo.activation = act;
  auto m = DeepseekV3Model::load(dir, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  std::vector<int32_t> tokens;
  std::mt19937 rng(1);
  for (int i = 0; i < 20; ++i) tokens.push_back(static_cast<int32_t>(2 + rng() % 500));
  KvCache cache = (*m)->make_cache(64).value();
  const int64_t seq = cache.add_sequence();
  const TokenChunk ch = cache.chunk(seq, 0, tokens, true).value();
  StepOutput out;
  EXPECT_TRUE((*m)->forward({&ch, 1}, cache.storage(), out).ok());
  return out.logits;
}

// max |a - b| / max |b|.
double worst_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    mx = std::max(mx, std::fabs(double(b[i])));
    err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
  }
  return err / mx;
}

// W4A16 against the float model of the dequantized weights: the products differ by fp32
// rounding only (the int4 kernel sums exact products x · (q - 8) per group in fp32, then
// one fma by the scale; the float kernel one fma per weight): in the f32 mode the logits
// agree within 1e-5 of their largest value (measured ~1e-6). The bf16 mode rounds every
// linear's input to bf16, so an fp32-level difference now and then crosses a rounding
// boundary and moves that input by 2^-9: within 2e-2 there (measured ~4.5e-3, the distance
// such flips give). A wrong nibble, group or zero point moves the logits by O(1).
// Activation reordering (actorder "group") permutes each module's groups: the int4 model
// gathers x per linear, the float one multiplies the dequantized columns in place.
TEST_F(Int4Checkpoint, W4A16LogitsMatchTheDequantizedFloatModel) {
  struct Case {
    const char* sym;
    const char* format;
    int64_t group;
    const char* actorder = "none";
  };
  for (const Case& c :
       {Case{"sym", "pack-quantized", 32}, Case{"asym", "pack-quantized", 32},
        Case{"asym", "pack-quantized", 128}, Case{"sym", "gptq", 64}, Case{"asym", "gptq", 32},
        Case{"asym", "pack-quantized", 32, "group"}, Case{"sym", "gptq", 64, "group"}}) {
    const std::string what =
        fmt::format("{} {} G{} actorder {}", c.sym, c.format, c.group, c.actorder);
    const std::string name = fmt::format("w4-{}-{}-{}-{}", c.sym, c.format, c.group, c.actorder);
    make(name, c.sym, c.format, c.group, false, c.actorder);
    if (std::string_view(c.actorder) == "group") expect_permuted_groups(name);
    write_dequantized(name, name + "-deq");
    for (const ComputeDType compute : {ComputeDType::kF32, ComputeDType::kBF16}) {
      const auto q = logits_of(path(name), compute);
      const auto f = logits_of(path(name + "-deq"), compute);
      ASSERT_EQ(q.size(), f.size()) << what;
      ASSERT_FALSE(q.empty());
      const double rel = worst_rel(q, f);
      std::fprintf(stderr, "%s %s: worst %.3e\n", what.c_str(),
                   compute == ComputeDType::kF32 ? "f32" : "bf16", rel);
      EXPECT_LT(rel, compute == ComputeDType::kF32 ? 1e-5 : 2e-2) << what;
    }
  }
}

// Each bound int4 linear of a W4A8 checkpoint multiplies as the plain W4A8 arithmetic does,
// bit for bit: per token sx = absmax / 127, xq = rne(x / sx); per row and group the exact
// integer Σ xq · (q - z); f = fma(float(Σ), scale, f) over the groups in order; y = f · sx.
// The weights are this test's reading of the checkpoint file, not the panels.
// With activation reordering the sums run over each group's columns wherever they are
// (g_idx[c] = g), the groups in order.
TEST_F(Int4Checkpoint, W4A8BoundLinearsMatchAPlainReference) {
  for (const char* actorder : {"none", "group"}) {
    SCOPED_TRACE(std::string("actorder ") + actorder);
    check_w4a8_bound_linears(actorder);
  }
}

void Int4Checkpoint::check_w4a8_bound_linears(const std::string& actorder) {
  const std::string name = "w4a8-" + actorder;
  make(name, "asym", "pack-quantized", 32, /*int8_activations=*/true, actorder);
  auto cfg = load_deepseek_v3_config(path(name));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_TRUE(cfg->int_quant && cfg->int_quant->scheme == IntScheme::kW4A8);
  auto ckpt = Checkpoint::open(path(name));
  ASSERT_TRUE(ckpt.ok());
  RepackOptions ro;
  ro.dir = path("cache-" + actorder);
  ro.progress = false;
  RepackCache cache(ro);
  auto w = bind_deepseek_v3_weights(*cfg, *ckpt, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& l1 = w->layers[1];
  EXPECT_EQ(l1.attn.kv_b_proj.dtype, DType::kF32);  // quantized, sliced: F32 rows
  EXPECT_EQ(l1.moe->router.dtype, DType::kBF16);    // ignored: the router gate
  struct Case {
    const MatrixRef* m;
    std::string module;
  };
  std::vector<Case> cases;
  for (size_t i = 0; i < w->layers.size(); ++i) {
    const LayerWeights& l = w->layers[i];
    const std::string p = "model.layers." + std::to_string(i);
    cases.push_back({&*l.attn.q_a_proj, p + ".self_attn.q_a_proj"});
    cases.push_back({&*l.attn.q_b_proj, p + ".self_attn.q_b_proj"});
    cases.push_back({&l.attn.kv_a_proj, p + ".self_attn.kv_a_proj_with_mqa"});
    cases.push_back({&l.attn.o_proj, p + ".self_attn.o_proj"});
    if (l.dense) cases.push_back({&l.dense->down_proj, p + ".mlp.down_proj"});
    if (l.moe) {
      cases.push_back({&l.moe->experts[3].gate_proj, p + ".mlp.experts.3.gate_proj"});
      cases.push_back({&l.moe->experts[3].down_proj, p + ".mlp.experts.3.down_proj"});
      cases.push_back({&l.moe->shared->up_proj, p + ".mlp.shared_experts.up_proj"});
    }
  }
  ThreadPool pool(2);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases) {
    ASSERT_EQ(c.m->layout, MatrixLayout::kInt4Panels) << c.module;
    ASSERT_TRUE(c.m->int8_activations) << c.module;
    const Module mod = read_pack_quantized(*ckpt, c.module);
    EXPECT_EQ(kernels::int4_column_order(*c.m) != nullptr, actorder == "group") << c.module;
    const int64_t rows = mod.rows, cols = mod.cols, groups = cols / mod.group;
    for (const int64_t n : {1, 7}) {
      std::vector<float> x(static_cast<size_t>(n * cols));
      for (float& v : x) v = nd(rng);
      std::vector<float> y(static_cast<size_t>(n * rows));
      kernels::linear_f32(x.data(), n, cols, *c.m, y.data(), rows, pool);
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x.data() + t * cols;
        float amax = 0;
        for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(xt[k]));
        const float sx = amax / 127.0f;
        std::vector<int32_t> xq(static_cast<size_t>(cols));
        for (int64_t k = 0; k < cols; ++k)
          xq[k] = sx == 0 ? 0 : static_cast<int32_t>(std::nearbyint(xt[k] / sx));
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<int32_t> s(static_cast<size_t>(groups), 0);
          for (int64_t k = 0; k < cols; ++k) {
            const int64_t g = mod.group_of(k);
            s[g] += xq[k] * (mod.q[r * cols + k] - mod.zero[r * groups + g]);
          }
          float f = 0;
          for (int64_t g = 0; g < groups; ++g)
            f = std::fma(static_cast<float>(s[g]), mod.scale[r * groups + g], f);
          ASSERT_EQ(y[t * rows + r], f * sx)
              << c.module << " n " << n << " token " << t << " row " << r;
        }
      }
    }
  }
}

// --activation-dtype int8 runs a W4A16 checkpoint as W4A8: the logits of the same weights
// under a W4A8 config, bit for bit; and those stay near the W4A16 ones (int8 activations).
TEST_F(Int4Checkpoint, ActivationDtypeInt8RunsW4A16AsW4A8) {
  make("a16", "sym", "pack-quantized", 32, false);
  make("a8", "sym", "pack-quantized", 32, true);
  const auto a16_as_a8 = logits_of(path("a16"), ComputeDType::kF32, ActivationDType::kInt8);
  const auto a8 = logits_of(path("a8"), ComputeDType::kF32);
  const auto a16 = logits_of(path("a16"), ComputeDType::kF32);
  ASSERT_FALSE(a8.empty());
  EXPECT_EQ(a16_as_a8, a8);
  EXPECT_NE(a16, a8);  // the activations are quantized
  // A float checkpoint has no integer linears to run on int8.
  MkModelOptions o;
  o.out_dir = path("float");
  o.seed = 7;
  o.progress = false;
  o.threads = 2;
  ASSERT_TRUE(write_random_checkpoint(o).ok());
  ModelOptions mo;
  mo.threads = 1;
  mo.activation = ActivationDType::kInt8;
  auto m = DeepseekV3Model::load(path("float"), mo);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "activation dtype int8");
}

void set_ignore(const std::string& dir, const json& ignore) {
  std::ifstream in(dir + "/config.json");
  json c = json::parse(in);
  in.close();
  c["quantization_config"]["ignore"] = ignore;
  std::ofstream(dir + "/config.json") << c.dump(2);
}

TEST_F(Int4Checkpoint, TensorsThatDisagreeWithTheIgnoreListAreRefused) {
  make("w4", "sym", "pack-quantized", 32);
  const std::string dir = path("w4");
  ModelOptions mo;
  mo.threads = 1;
  // Packed weights of a module the config ignores.
  set_ignore(dir, {"lm_head", "re:.*mlp\\.gate$", "re:.*eh_proj$", "re:.*shared_head\\.head$",
                   "model.layers.0.self_attn.q_a_proj"});
  auto m = DeepseekV3Model::load(dir, mo);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "model.layers.0.self_attn.q_a_proj.weight_packed");
  EXPECT_CONTAINS(m.status().message(), "quantization_config.ignore");
  // A float weight the config quantizes (the router gate no longer ignored).
  set_ignore(dir, {"lm_head", "re:.*eh_proj$", "re:.*shared_head\\.head$"});
  m = DeepseekV3Model::load(dir, mo);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "model.layers.1.mlp.gate.weight");
  EXPECT_CONTAINS(m.status().message(), "dtype BF16");
}

}  // namespace
}  // namespace xds
