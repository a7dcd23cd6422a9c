#include "mkmodel/mkmodel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>

#include <nlohmann/json.hpp>

#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_files.h"

namespace xds {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// The fast converter against the reference nearest-value search of tensor/dtype (itself
// checked against hand-derived codes in dtype_test).
TEST(MkModel, FastFp8MatchesReferenceConversion) {
  auto check = [](float f) {
    const uint8_t want = f32_to_f8e4m3(f), got = f32_to_f8e4m3_fast(f);
    if (want != got) ADD_FAILURE() << f << ": fast " << int(got) << " != " << int(want);
    return want == got;
  };
  // Every value with a bf16 bit pattern (all exponents, both signs, NaN and inf).
  for (uint32_t h = 0; h < 65536; h += 1) {
    if (!check(bf16_to_f32(static_cast<uint16_t>(h)))) break;
  }
  // Every code and the exact midpoints between neighbouring codes (ties to even).
  for (uint32_t c = 0; c < 0x7e; ++c) {
    const float a = f8e4m3_to_f32(static_cast<uint8_t>(c));
    const float b = f8e4m3_to_f32(static_cast<uint8_t>(c + 1));
    ASSERT_TRUE(check(a) && check(-a) && check((a + b) / 2) && check(-(a + b) / 2) &&
                check(std::nextafter((a + b) / 2, 0.0f)) &&
                check(std::nextafter((a + b) / 2, 1e9f)));
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-500.0f, 500.0f), small(-0.02f, 0.02f);
  for (int i = 0; i < 20000; ++i) {
    if (!check(wide(rng)) || !check(small(rng))) break;
  }
}

class MkModelDir : public xds::testing::TempDirTest {
 protected:
  MkModelOptions tiny(const std::string& sub) const {
    MkModelOptions o;
    o.out_dir = path(sub);
    o.preset = "tiny";
    o.seed = 3;
    o.threads = 2;
    o.progress = false;
    return o;
  }
  Checkpoint open(const std::string& sub) const {
    auto r = Checkpoint::open(path(sub));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(r).value();
  }
};

// Shapes from docs/design/deepseek_v3_forward.md with the tiny numbers of issue 2:
// D 256, vocab 512, H 4, Q 128, C 96, Dn 32, Dr 16, Dv 32, dense I 512, E 16, moe I 96.
struct Expect {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<Expect> tiny_layer(int l, bool moe) {
  const std::string p = "model.layers." + std::to_string(l);
  std::vector<Expect> v = {
      {p + ".input_layernorm.weight", {256}},
      {p + ".post_attention_layernorm.weight", {256}},
      {p + ".self_attn.q_a_proj.weight", {128, 256}},
      {p + ".self_attn.q_a_layernorm.weight", {128}},
      {p + ".self_attn.q_b_proj.weight", {4 * 48, 128}},
      {p + ".self_attn.kv_a_proj_with_mqa.weight", {96 + 16, 256}},
      {p + ".self_attn.kv_a_layernorm.weight", {96}},
      {p + ".self_attn.kv_b_proj.weight", {4 * 64, 96}},
      {p + ".self_attn.o_proj.weight", {256, 4 * 32}},
  };
  if (!moe) {
    v.push_back({p + ".mlp.gate_proj.weight", {512, 256}});
    v.push_back({p + ".mlp.up_proj.weight", {512, 256}});
    v.push_back({p + ".mlp.down_proj.weight", {256, 512}});
    return v;
  }
  v.push_back({p + ".mlp.gate.weight", {16, 256}});
  v.push_back({p + ".mlp.gate.e_score_correction_bias", {16}});
  for (const std::string e : {".mlp.experts.0", ".mlp.experts.15", ".mlp.shared_experts"}) {
    v.push_back({p + e + ".gate_proj.weight", {96, 256}});
    v.push_back({p + e + ".up_proj.weight", {96, 256}});
    v.push_back({p + e + ".down_proj.weight", {256, 96}});
  }
  return v;
}

TEST_F(MkModelDir, TinyBf16HasThePublishedLayout) {
  ASSERT_TRUE(write_random_checkpoint(tiny("m")).ok());
  auto cfg = load_deepseek_v3_config(path("m"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->vocab_size, 512);
  EXPECT_EQ(cfg->hidden_size, 256);
  EXPECT_EQ(cfg->num_hidden_layers, 3);
  EXPECT_EQ(cfg->first_k_dense_replace, 1);
  EXPECT_EQ(cfg->num_nextn_predict_layers, 1);
  EXPECT_EQ(cfg->n_routed_experts, 16);
  EXPECT_EQ(cfg->num_experts_per_tok, 4);
  EXPECT_EQ(cfg->n_group, 4);
  EXPECT_EQ(cfg->topk_group, 2);
  EXPECT_EQ(cfg->q_lora_rank, 128);
  EXPECT_EQ(cfg->kv_lora_rank, 96);
  EXPECT_DOUBLE_EQ(cfg->routed_scaling_factor, 2.5);
  EXPECT_FALSE(cfg->fp8.has_value());
  EXPECT_FALSE(cfg->rope_scaling.has_value());
  EXPECT_EQ(cfg->eos_token_ids, std::vector<int64_t>{1});

  Checkpoint ck = open("m");
  // 3 global + dense layer 12 + 2 MoE layers of 9 + 2 + 16*3 + 3 + MTP (6 + a MoE layer of 62).
  EXPECT_EQ(ck.num_tensors(), 3u + 12u + 2u * 62u + 6u + 62u);
  std::vector<Expect> all = {{"model.embed_tokens.weight", {512, 256}},
                             {"model.norm.weight", {256}},
                             {"lm_head.weight", {512, 256}},
                             {"model.layers.3.embed_tokens.weight", {512, 256}},
                             {"model.layers.3.enorm.weight", {256}},
                             {"model.layers.3.hnorm.weight", {256}},
                             {"model.layers.3.eh_proj.weight", {256, 512}},
                             {"model.layers.3.shared_head.norm.weight", {256}},
                             {"model.layers.3.shared_head.head.weight", {512, 256}}};
  for (int l : {0, 1, 2, 3}) {
    for (auto& e : tiny_layer(l, l >= 1)) all.push_back(e);
  }
  for (const Expect& e : all) {
    auto t = ck.require(e.name, e.shape);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const bool bias = e.name.find("e_score_correction_bias") != std::string::npos;
    EXPECT_EQ((*t)->dtype, bias ? DType::kF32 : DType::kBF16) << e.name;
  }
  // Value ranges: norms 1 +- 0.1, Linear |w| <= sqrt(3 / fan_in), bias small and non-zero.
  RepackCache cache(RepackOptions{path("cache"), nullptr, false});
  auto norm = bind_vector_f32(ck, "model.layers.1.input_layernorm.weight", 256, cache);
  ASSERT_TRUE(norm.ok());
  for (float v : *norm)
    EXPECT_TRUE(v >= 0.9f * (1 - 1.0f / 256) && v <= 1.1f * (1 + 1.0f / 256))
        << v;  // bf16 rounding
  auto bias = bind_vector_f32(ck, "model.layers.2.mlp.gate.e_score_correction_bias", 16, cache);
  ASSERT_TRUE(bias.ok());
  for (float v : *bias) EXPECT_TRUE(v != 0.0f && std::fabs(v) <= 0.05f) << v;
  auto w = bind_matrix(ck, "model.layers.1.self_attn.o_proj.weight", 256, 128, cache);
  ASSERT_TRUE(w.ok());
  double sum2 = 0;
  const auto* wb = static_cast<const uint16_t*>(w->data);
  for (int64_t i = 0; i < 256 * 128; ++i) {
    const float v = bf16_to_f32(wb[i]);
    ASSERT_LE(std::fabs(v), std::sqrt(3.0f / 128) * 1.01f);
    sum2 += double(v) * v;
  }
  EXPECT_NEAR(std::sqrt(sum2 / (256 * 128)), 1 / std::sqrt(128.0), 0.01 / std::sqrt(128.0) * 3);
}

TEST_F(MkModelDir, DeterministicInTheSeed) {
  MkModelOptions a = tiny("a"), b = tiny("b"), c = tiny("c");
  b.threads = 1;
  c.seed = 4;
  ASSERT_TRUE(write_random_checkpoint(a).ok());
  ASSERT_TRUE(write_random_checkpoint(b).ok());
  ASSERT_TRUE(write_random_checkpoint(c).ok());
  auto bytes = [&](const std::string& sub) {
    const std::string p = path(sub + "/model.safetensors");
    std::string out(std::filesystem::file_size(p), '\0');
    std::ifstream(p, std::ios::binary).read(out.data(), static_cast<std::streamsize>(out.size()));
    return out;
  };
  const std::string ba = bytes("a");
  EXPECT_GT(ba.size(), 1000000u);
  EXPECT_TRUE(ba == bytes("b"));  // thread count does not matter
  EXPECT_TRUE(ba != bytes("c"));
}

TEST_F(MkModelDir, TinyF16IsTheBf16DrawsInF16) {
  MkModelOptions h = tiny("f16"), b = tiny("bf16");
  h.dtype = "f16";
  ASSERT_TRUE(write_random_checkpoint(h).ok());
  ASSERT_TRUE(write_random_checkpoint(b).ok());
  std::ifstream cfg_file(path("f16/config.json"));
  const std::string cfg_text((std::istreambuf_iterator<char>(cfg_file)),
                             std::istreambuf_iterator<char>());
  EXPECT_NE(cfg_text.find(R"("torch_dtype": "float16")"), std::string::npos) << cfg_text;
  Checkpoint ck = open("f16"), ref = open("bf16");
  EXPECT_EQ(ck.find("model.layers.1.mlp.gate.e_score_correction_bias")->dtype, DType::kF32);
  // Every other tensor is F16, and the same draw as the BF16 one: each of the two roundings
  // of the same value (2^-9 and 2^-12 relative; F16 subnormals 2^-25 absolute) apart.
  int compared = 0;
  for (const auto& file : ref.files()) {
    for (const TensorView& t : file->tensors()) {
      if (t.dtype != DType::kBF16) continue;
      const std::string& name = t.name;
      const TensorView* f = ck.find(name);
      ASSERT_NE(f, nullptr) << name;
      ASSERT_EQ(f->dtype, DType::kF16) << name;
      ASSERT_EQ(f->shape, t.shape) << name;
      const int64_t n = static_cast<int64_t>(t.nbytes / 2);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t hb, bb;
        std::memcpy(&hb, f->data + 2 * i, 2);
        std::memcpy(&bb, t.data + 2 * i, 2);
        const float hv = f16_to_f32(hb), bv = bf16_to_f32(bb);
        ASSERT_LE(std::fabs(hv - bv), 0x1p-8f * std::fabs(bv) + 0x1p-24f) << name << " " << i;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 50);

  // Bound for the forward pass, the linears are panels of the F16 elements (two bytes a
  // weight), the absorbed attention's heads too; the embedding is looked up as F32 rows.
  auto config = load_deepseek_v3_config(path("f16"));
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  RepackCache cache(RepackOptions{path("cache-f16"), nullptr, false});
  auto w = bind_deepseek_v3_weights(*config, ck, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  for (const MatrixRef* m :
       {&w->lm_head, &w->layers[0].attn.o_proj, &w->layers[0].dense->down_proj,
        &w->layers[1].moe->experts[3].up_proj, &w->layers[1].moe->shared->gate_proj,
        &w->layers[1].attn.kv_b_proj, &w->layers[1].attn.uk_t[0], &w->layers[1].attn.uv[0]}) {
    EXPECT_EQ(m->layout, MatrixLayout::kPanels16);
    EXPECT_EQ(m->dtype, DType::kF16);
  }
}

TEST_F(MkModelDir, TinyFp8TwoShardsDequantizesNearBf16) {
  MkModelOptions f = tiny("fp8"), b = tiny("bf16");
  f.dtype = "fp8";
  f.shards = 2;
  ASSERT_TRUE(write_random_checkpoint(f).ok());
  ASSERT_TRUE(write_random_checkpoint(b).ok());
  EXPECT_TRUE(std::filesystem::exists(path("fp8/model.safetensors.index.json")));
  EXPECT_TRUE(std::filesystem::exists(path("fp8/model-00001-of-00002.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(path("fp8/model-00002-of-00002.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(path("fp8/model.safetensors")));
  auto cfg = load_deepseek_v3_config(path("fp8"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_TRUE(cfg->fp8.has_value());
  EXPECT_EQ(cfg->fp8->block_rows, 128);

  Checkpoint ck = open("fp8"), ref = open("bf16");
  ASSERT_EQ(ck.files().size(), 2u);
  EXPECT_FALSE(ck.files()[0]->tensors().empty());
  EXPECT_FALSE(ck.files()[1]->tensors().empty());
  // Which tensors are FP8 (published layout): attention and MLP/expert projections only.
  EXPECT_EQ(ck.find("model.layers.0.mlp.down_proj.weight")->dtype, DType::kF8E4M3);
  EXPECT_EQ(ck.find("model.layers.3.mlp.experts.7.up_proj.weight")->dtype, DType::kF8E4M3);
  EXPECT_EQ(ck.find("model.layers.3.eh_proj.weight")->dtype, DType::kBF16);
  EXPECT_EQ(ck.find("model.layers.1.mlp.gate.weight")->dtype, DType::kBF16);
  EXPECT_EQ(ck.find("lm_head.weight")->dtype, DType::kBF16);
  EXPECT_EQ(ck.find("model.embed_tokens.weight")->dtype, DType::kBF16);
  auto s = ck.require("model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv", {1, 2});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->dtype, DType::kF32);

  // kv_b_proj [256, 96] (partial column block) and an expert down_proj [256, 96]: the
  // dequantized weight is within fp8 precision (relative 2^-4, absolute 2^-10 * scale for
  // subnormals) of the bf16 weight drawn from the same seed, and each block's largest
  // magnitude is 448 * scale.
  RepackCache cache(RepackOptions{path("cache"), nullptr, false});
  for (const std::string name : {"model.layers.1.self_attn.kv_b_proj.weight",
                                 "model.layers.2.mlp.experts.3.down_proj.weight"}) {
    SCOPED_TRACE(name);
    const int64_t rows = 256, cols = 96;
    auto q = bind_matrix(ck, name, rows, cols, cache);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    auto r = bind_matrix(ref, name, rows, cols, cache);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->dtype, DType::kBF16);
    const TensorView* sc = ck.find(name + "_scale_inv");
    ASSERT_NE(sc, nullptr);
    ASSERT_EQ(sc->shape, (std::vector<int64_t>{2, 1}));
    float scales[2];
    std::memcpy(scales, sc->data, 8);
    const auto* deq = static_cast<const float*>(q->data);
    const auto* wb = static_cast<const uint16_t*>(r->data);
    float block_max[2] = {0, 0};
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float scale = scales[i / cols / 128];
      const float w = bf16_to_f32(wb[i]);
      ASSERT_LE(std::fabs(deq[i] - w), 0.07f * std::fabs(w) + scale * 0.002f) << i;
      block_max[i / cols / 128] = std::max(block_max[i / cols / 128], std::fabs(deq[i]));
    }
    for (int k = 0; k < 2; ++k) EXPECT_NEAR(block_max[k], 448 * scales[k], 448 * scales[k] * 1e-6);
  }
}

TEST_F(MkModelDir, NoQLoraAndYarn) {
  MkModelOptions o = tiny("m");
  o.q_lora = false;
  o.yarn = true;
  o.mtp_layers = 0;
  ASSERT_TRUE(write_random_checkpoint(o).ok());
  auto cfg = load_deepseek_v3_config(path("m"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_FALSE(cfg->q_lora_rank.has_value());
  ASSERT_TRUE(cfg->rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(cfg->rope_scaling->factor, 4.0);
  EXPECT_LT(cfg->rope_scaling->original_max_position_embeddings, cfg->max_position_embeddings);
  EXPECT_EQ(cfg->num_nextn_predict_layers, 0);
  Checkpoint ck = open("m");
  EXPECT_TRUE(ck.require("model.layers.0.self_attn.q_proj.weight", {192, 256}).ok());
  EXPECT_EQ(ck.find("model.layers.0.self_attn.q_a_proj.weight"), nullptr);
  EXPECT_EQ(ck.find("model.layers.3.eh_proj.weight"), nullptr);
}

// --max-position-embeddings: written into config.json as given; with yarn the published
// relation max_position_embeddings = factor · original_max_position_embeddings holds
// (2048 = 4 · 512). The tiny preset's own limit is 512.
TEST_F(MkModelDir, MaxPositionEmbeddingsIsWrittenAndYarnFollowsIt) {
  for (const bool yarn : {false, true}) {
    MkModelOptions o = tiny("m");
    o.max_position_embeddings = 2048;
    o.yarn = yarn;
    ASSERT_TRUE(write_random_checkpoint(o).ok());
    std::ifstream f(path("m/config.json"));
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("max_position_embeddings"), 2048);
    auto cfg = load_deepseek_v3_config(path("m"));
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    EXPECT_EQ(cfg->max_position_embeddings, 2048);
    EXPECT_EQ(cfg->rope_scaling.has_value(), yarn);
    if (yarn) {
      EXPECT_DOUBLE_EQ(cfg->rope_scaling->factor, 4.0);
      EXPECT_EQ(cfg->rope_scaling->original_max_position_embeddings, 512);
    }
  }
  MkModelOptions o = tiny("m");
  auto c = mkmodel_config(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_position_embeddings, 512);
}

TEST_F(MkModelDir, RewritingAsSingleFileDropsTheIndex) {
  MkModelOptions o = tiny("m");
  o.shards = 3;
  ASSERT_TRUE(write_random_checkpoint(o).ok());
  EXPECT_EQ(open("m").files().size(), 3u);
  o.shards = 1;
  ASSERT_TRUE(write_random_checkpoint(o).ok());
  EXPECT_FALSE(std::filesystem::exists(path("m/model.safetensors.index.json")));
  EXPECT_EQ(open("m").files().size(), 1u);
}

TEST_F(MkModelDir, BadOptions) {
  MkModelOptions o = tiny("m");
  o.preset = "huge";
  Status s = write_random_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.message(), "unknown preset \"huge\"");
  o = tiny("m");
  o.dtype = "fp4";
  s = write_random_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.message(), "unknown dtype \"fp4\"");
  for (const int64_t n : {0, -5}) {
    o = tiny("m");
    o.max_position_embeddings = n;
    s = write_random_checkpoint(o);
    ASSERT_FALSE(s.ok());
    EXPECT_CONTAINS(s.message(),
                    "--max-position-embeddings must be >= 1, got " + std::to_string(n));
  }
  o = tiny("m");
  o.max_position_embeddings = 1030;  // not a multiple of the yarn factor 4
  o.yarn = true;
  s = write_random_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.message(), "--max-position-embeddings 1030 with --yarn must be a multiple");
}

TEST(MkModel, BenchPresetShapes) {
  MkModelOptions o;
  o.preset = "bench-2.6b";
  auto c = mkmodel_config(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_hidden_layers, 12);
  EXPECT_EQ(c->intermediate_size, 6144);
  EXPECT_EQ(c->num_attention_heads, 16);
  EXPECT_EQ(c->q_lora_rank, 768);
  EXPECT_EQ(c->kv_lora_rank, 512);
  EXPECT_EQ(c->n_routed_experts, 64);
  EXPECT_EQ(c->num_experts_per_tok, 6);
  EXPECT_EQ(c->n_group, 8);
  EXPECT_EQ(c->topk_group, 4);
  EXPECT_EQ(c->n_shared_experts, 2);
  EXPECT_EQ(c->moe_intermediate_size, 512);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
}

}  // namespace
}  // namespace xds
