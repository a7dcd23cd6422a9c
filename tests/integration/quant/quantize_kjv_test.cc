// `quantize` on the shipped model (models/kjv-moe-tiny), calibrated on a few training verses
// (Genesis 1, a training chapter; never the held-out text), compared on the held-out rows of
// tests/conformance/kjv_moe_tiny:
//   - SmoothQuant alone (smooth_only) computes the float model's logits (≤ 1e-5 relative);
//   - the W8A8 checkpoint's config.json and every tensor's name, dtype and shape, read from
//     the safetensors headers by hand, are the compressed-tensors layout;
//   - GPTQ's output error is below RTN's on every linear it quantized, the experts that saw
//     too few tokens are listed and got RTN, and the model loads and runs;
//   - a block-FP8 copy of the model is read (dequantized) and its W8A8 copy predicts the
//     held-out row as well as the FP8 model, within 1 % of its cross-entropy;
//   - a failed run leaves no output directory.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/bf16.h"
#include "mkmodel/mkmodel.h"
#include "quant/w8a8_rtn.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/safetensors.h"
#include "quant/checkpoint_writer.h"
#include "quant/quantize.h"
#include "quantize_kjv_fixture.h"

namespace xds {
namespace {

constexpr int64_t kLen = 64;

std::vector<int32_t> heldout_row() {
  std::vector<int32_t> v(static_cast<size_t>(kLen));
  std::ifstream f(std::string(XDS_SOURCE_DIR) + "/tests/conformance/kjv_moe_tiny/tokens.i32",
                  std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  EXPECT_TRUE(f.good());
  return v;
}

std::vector<float> logits_of(const std::string& dir) {
  ModelOptions mo;
  mo.threads = 2;
  auto m = DeepseekV3Model::load(dir, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  KvCache cache = (*m)->make_cache(kLen + 16).value();
  const std::vector<int32_t> ids = heldout_row();
  const TokenChunk ch = cache.chunk(cache.add_sequence(), 0, ids, true).value();
  StepOutput out;
  EXPECT_TRUE((*m)->forward({&ch, 1}, cache.storage(), out).ok());
  return out.logits;
}

TEST(QuantizeKjv, SmoothingAloneKeepsTheLogits) {
  const std::string out = temp("smooth");
  fs::remove_all(out);
  QuantizeOptions o = options(out);
  o.smooth_only = true;
  const Status s = quantize_checkpoint(o);
  ASSERT_TRUE(s.ok()) << s.to_string();
  // The fold moved something (not a vacuous comparison).
  auto a = Checkpoint::open(kModel).value();
  auto b = Checkpoint::open(out).value();
  const TensorView* na = a.find("model.layers.1.post_attention_layernorm.weight");
  const TensorView* nb = b.find("model.layers.1.post_attention_layernorm.weight");
  ASSERT_TRUE(na && nb);
  EXPECT_NE(std::memcmp(na->data, nb->data, na->nbytes), 0);
  const std::vector<float> x = logits_of(kModel), y = logits_of(out);
  ASSERT_EQ(x.size(), y.size());
  double max_abs = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_abs = std::max(max_abs, double(std::fabs(x[i])));
    max_diff = std::max(max_diff, double(std::fabs(x[i] - y[i])));
  }
  EXPECT_LE(max_diff, 1e-5 * max_abs) << "max |logit| " << max_abs;
  fs::remove_all(out);
}

TEST(QuantizeKjv, W8A8LayoutReportAndRun) {
  const std::string out = temp("w8a8");
  fs::remove_all(out);
  const Status s = quantize_checkpoint(options(out));
  ASSERT_TRUE(s.ok()) << s.to_string();

  std::ifstream cf(out + "/config.json");
  const json config = json::parse(cf);
  const json& q = config["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_EQ(q["format"], "int-quantized");
  const json& g = q["config_groups"]["group_0"];
  EXPECT_EQ(g["targets"], json::array({"Linear"}));
  EXPECT_EQ(g["weights"]["num_bits"], 8);
  EXPECT_EQ(g["weights"]["type"], "int");
  EXPECT_EQ(g["weights"]["symmetric"], true);
  EXPECT_EQ(g["weights"]["strategy"], "channel");
  EXPECT_EQ(g["weights"]["dynamic"], false);
  EXPECT_EQ(g["input_activations"]["num_bits"], 8);
  EXPECT_EQ(g["input_activations"]["type"], "int");
  EXPECT_EQ(g["input_activations"]["symmetric"], true);
  EXPECT_EQ(g["input_activations"]["strategy"], "token");
  EXPECT_EQ(g["input_activations"]["dynamic"], true);
  for (const char* ig : {"lm_head", "re:.*mlp\\.gate$", "re:.*kv_b_proj$"}) {
    EXPECT_NE(std::find(q["ignore"].begin(), q["ignore"].end(), ig), q["ignore"].end()) << ig;
  }
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));

  // Every source tensor, field by field: the quantized linears of MLA and the MLPs as I8 +
  // a [out, 1] scale in the source dtype, everything else as it was.
  const std::map<std::string, json> h = read_headers(out);
  auto src = Checkpoint::open(kModel).value();
  int64_t quantized = 0;
  for (const std::string& name : src.names()) {
    const TensorView* t = src.find(name);
    ASSERT_EQ(h.count(name), 1u) << name;
    const json& v = h.at(name);
    EXPECT_EQ(v["shape"], t->shape) << name;
    const bool target = name.ends_with("_proj.weight") || name.ends_with("_mqa.weight");
    const bool kept = name.find("kv_b_proj") != std::string::npos ||
                      name.find("eh_proj") != std::string::npos || !target;
    if (kept) {
      EXPECT_EQ(v["dtype"], std::string(dtype_name(t->dtype))) << name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(v["dtype"], "I8") << name;
    ASSERT_EQ(h.count(name + "_scale"), 1u) << name;
    EXPECT_EQ(h.at(name + "_scale")["dtype"], "BF16") << name;
    EXPECT_EQ(h.at(name + "_scale")["shape"], json::array({t->shape[0], 1})) << name;
  }
  // 6 layers (4 + 2 MTP): 4 MLA linears each, 3 dense + 5 x (16 + 1) x 3 expert linears.
  EXPECT_EQ(quantized, 6 * 4 + 3 + 5 * 17 * 3);
  EXPECT_EQ(h.size(), src.names().size() + static_cast<size_t>(quantized));

  std::ifstream rf(out + "/quantize_report.json");
  const json report = json::parse(rf);
  std::set<std::string> short_experts;
  for (const json& e : report["experts_below_min"]) {
    EXPECT_LT(e["tokens"].get<int64_t>(), 4);
    short_experts.insert(fmt::format("model.layers.{}.mlp.experts.{}.", e["layer"].get<int64_t>(),
                                     e["expert"].get<int64_t>()));
  }
  int64_t gptq = 0;
  for (const auto& [name, e] : report["linears"].items()) {
    const std::string prefix = name.substr(0, name.rfind('.', name.size() - 8) + 1);
    if (short_experts.count(prefix)) {
      EXPECT_EQ(e["method"], "rtn") << name;
      continue;
    }
    ASSERT_EQ(e["method"], "gptq") << name;
    ++gptq;
    EXPECT_LT(e["error_gptq"].get<double>(), e["error_rtn"].get<double>()) << name;
  }
  EXPECT_GT(gptq, 24);
  EXPECT_EQ(report["linears"].size(), static_cast<size_t>(quantized));

  const std::vector<float> x = logits_of(kModel), y = logits_of(out);
  ASSERT_EQ(x.size(), y.size());
  for (float v : y) ASSERT_TRUE(std::isfinite(v));
  fs::remove_all(out);
}

// The shipped model with every projection (kv_b_proj too) in block FP8 as DeepSeek-V3
// publishes it: F8_E4M3 weight + F32 weight_scale_inv per 128x128 block (amax / 448).
std::string fp8_copy(const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto src = Checkpoint::open(kModel).value();
  std::vector<OutTensor> out;
  for (const std::string& name : src.names()) {
    const TensorView* t = src.find(name);
    const auto* h = reinterpret_cast<const uint16_t*>(t->data);
    const bool fp8 = name.ends_with("_proj.weight") || name.ends_with("_mqa.weight");
    if (!fp8 || name.ends_with("eh_proj.weight")) {
      OutTensor o{name, t->dtype, t->shape, std::vector<std::byte>(t->nbytes)};
      std::memcpy(o.bytes.data(), t->data, t->nbytes);
      out.push_back(std::move(o));
      continue;
    }
    const int64_t rows = t->shape[0], cols = t->shape[1], br = (rows + 127) / 128,
                  bc = (cols + 127) / 128;
    std::vector<float> scale(static_cast<size_t>(br * bc), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float& s = scale[(r / 128) * bc + c / 128];
        s = std::max(s, std::fabs(bf16_to_f32(h[r * cols + c])) / 448.0f);
      }
    OutTensor w{name, DType::kF8E4M3, t->shape, std::vector<std::byte>(t->nbytes / 2)};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = scale[(r / 128) * bc + c / 128];
        const float v = bf16_to_f32(h[r * cols + c]);
        w.bytes[r * cols + c] = std::byte(f32_to_f8e4m3_fast(s > 0 ? v / s : 0.0f));
      }
    out.push_back(std::move(w));
    OutTensor si{name + "_scale_inv", DType::kF32, {br, bc},
                 std::vector<std::byte>(scale.size() * 4)};
    std::memcpy(si.bytes.data(), scale.data(), si.bytes.size());
    out.push_back(std::move(si));
  }
  EXPECT_TRUE(write_sharded_safetensors(dir, out, int64_t{1} << 30).ok());
  std::ifstream cf(kModel + "/config.json");
  json config = json::parse(cf);
  config["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                                   {"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  std::ofstream(dir + "/config.json") << config.dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::copy_file(kModel + "/" + f, dir + "/" + f);
  return dir;
}

double cross_entropy(const std::vector<float>& logits) {
  const std::vector<int32_t> ids = heldout_row();
  const int64_t v = static_cast<int64_t>(logits.size()) / kLen;
  double sum = 0.0;
  for (int64_t i = 0; i + 1 < kLen; ++i) {
    const float* row = logits.data() + i * v;
    const double mx = *std::max_element(row, row + v);
    double z = 0.0;
    for (int64_t k = 0; k < v; ++k) z += std::exp(double(row[k]) - mx);
    sum += std::log(z) + mx - row[ids[i + 1]];
  }
  return sum / double(kLen - 1);
}

TEST(QuantizeKjv, BlockFp8Source) {
  const std::string fp8 = fp8_copy(temp("fp8_src"));
  const std::string out = temp("fp8_w8a8");
  fs::remove_all(out);
  QuantizeOptions o = options(out);
  o.model_dir = fp8;
  o.min_expert_samples = 0;
  const Status s = quantize_checkpoint(o);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::map<std::string, json> h = read_headers(out);
  for (const auto& [name, v] : h) {
    EXPECT_FALSE(name.ends_with("_scale_inv")) << name;
    EXPECT_NE(v["dtype"], "F8_E4M3") << name;
  }
  EXPECT_EQ(h.at("model.layers.1.self_attn.kv_b_proj.weight")["dtype"], "BF16");
  EXPECT_EQ(h.at("model.layers.1.self_attn.q_b_proj.weight")["dtype"], "I8");
  EXPECT_EQ(h.at("model.layers.1.self_attn.q_b_proj.weight_scale")["dtype"], "BF16");
  std::ifstream cf(out + "/config.json");
  EXPECT_EQ(json::parse(cf)["quantization_config"]["quant_method"], "compressed-tensors");
  const double ce_fp8 = cross_entropy(logits_of(fp8)), ce_w8a8 = cross_entropy(logits_of(out));
  std::printf("held-out row cross-entropy: block FP8 %.5f, its W8A8 copy %.5f\n", ce_fp8, ce_w8a8);
  EXPECT_LE(std::fabs(ce_w8a8 - ce_fp8), 0.01 * ce_fp8);
  fs::remove_all(out);
  fs::remove_all(fp8);
}

TEST(QuantizeKjv, AFailedRunLeavesNoOutput) {
  const std::string out = temp("fail");
  fs::remove_all(out);
  QuantizeOptions o = options(out);
  o.calibration_file = temp("missing.txt");
  const Status s = quantize_checkpoint(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing.txt"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path())) {
    EXPECT_EQ(e.path().filename().string().find("xds_quant_fail_" + std::to_string(::getpid()) +
                                                ".tmp"),
              std::string::npos)
        << e.path();
  }
  fs::create_directories(out);  // an existing output is refused, not overwritten
  const Status again = quantize_checkpoint(options(out));
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("already exists"), std::string::npos) << again.message();
  fs::remove_all(out);
}

}  // namespace
}  // namespace xds
