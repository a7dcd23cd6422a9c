// `quantize --scheme w4a16|w4a8` on the shipped model (models/kjv-moe-tiny), calibrated on
// Genesis 1 (quantize_kjv_fixture.h), against independent references:
//   - config.json is compressed-tensors pack-quantized (4 bits, symmetric, the group size
//     asked for; input_activations null for W4A16, per-token dynamic int8 for W4A8) and every
//     tensor's name, dtype and shape, read from the safetensors headers by hand, is the
//     layout model/int4_weights.h loads;
//   - the written codes, unpacked here from the layout's definition (nibble c % 8 of word
//     [r][c / 8], ŵ = scale · (q − 8)), are 4-bit groups of the source weights: every group's
//     codes reach past ±2 (its own scale) and each matrix is near the source;
//   - GPTQ's output error is no worse than 4-bit RTN's on the same groups on every linear
//     it quantized (quantize_report.json), experts with too few tokens got RTN;
//   - the runtime loads the copy and its logits on the three held-out rows of
//     tests/conformance/kjv_moe_tiny are within tests/integration/model/w4_kjv_test.cc's
//     bounds of the float model's (worst row 0.3, argmax 0.9, cross-entropy 3 %);
//   - bad flag combinations fail naming the flag, and leave no output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/bf16.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/safetensors.h"
#include "quant/quantize.h"
#include "kjv_logits.h"
#include "quantize_kjv_fixture.h"

namespace xds {
namespace {

using kjv_logits::heldout_rows;
using kjv_logits::kLen;
using kjv_logits::kRows;
constexpr int64_t kVocab = 4096;

float element(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, t.data + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data + i * 2, 2);
  return t.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// The output's 4-bit modules against the source (see the file comment); returns how many.
int64_t check_codes(const std::string& out, int64_t group) {
  auto src = Checkpoint::open(kModel).value();
  auto q = Checkpoint::open(out).value();
  int64_t modules = 0;
  for (const std::string& name : src.names()) {
    const std::string m = name.substr(0, name.size() - 7);
    const TensorView* packed = q.find(m + ".weight_packed");
    if (!name.ends_with(".weight") || packed == nullptr) continue;
    ++modules;
    const TensorView& w = *src.find(name);
    const TensorView& scale = *q.find(m + ".weight_scale");
    const int64_t rows = w.shape[0], cols = w.shape[1], groups = cols / group;
    double err = 0, norm = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const float s = element(scale, r * groups + g);
        int span_lo = 0, span_hi = 0;
        for (int64_t c = g * group; c < (g + 1) * group; ++c) {
          uint32_t word;
          std::memcpy(&word, packed->data + (r * (cols / 8) + c / 8) * 4, 4);
          const int code = int((word >> (4 * (c % 8))) & 15u) - 8;
          span_lo = std::min(span_lo, code);
          span_hi = std::max(span_hi, code);
          const double d = double(element(w, r * cols + c)) - double(s) * code;
          err += d * d;
          norm += double(element(w, r * cols + c)) * element(w, r * cols + c);
        }
        // The group's scale is that of its own values: its codes reach past ±2 (measured:
        // at least ±4 in every group; GPTQ's feedback after the scale is fixed can pull the
        // largest value in), where another group's scale would leave them near 0 or clamp.
        EXPECT_GE(std::max(-span_lo, span_hi), 3) << m << " row " << r << " group " << g;
      }
    }
    // Near the source in weight space too (measured: at most 0.061 relative squared error on
    // one expert's down_proj; GPTQ trades weight error for output error). Smoothed weights
    // (W4A8) differ from the source's by per-column powers of two: the caller checks W4A16.
    if (err > 0.15 * norm) ADD_FAILURE() << m << ": relative squared error " << err / norm;
  }
  return modules;
}

struct W4Case {
  const char* scheme;
  int64_t group;
};

TEST(QuantizeW4Kjv, LayoutCodesReportAndLogits) {
  const std::vector<int32_t> tokens = heldout_rows();
  const std::vector<float> fl = kjv_logits::logits_of(kModel, tokens);
  ASSERT_EQ(fl.size(), static_cast<size_t>(kRows * kLen * kVocab));
  const double ce_float = kjv_logits::cross_entropy(fl, tokens, kVocab);
  for (const W4Case& c : {W4Case{"w4a16", 32}, W4Case{"w4a8", 128}}) {
    SCOPED_TRACE(c.scheme);
    const std::string out = temp(c.scheme);
    fs::remove_all(out);
    QuantizeOptions o = options(out);
    o.scheme = c.scheme;
    o.group_size = c.group == 128 ? 0 : c.group;  // 0: the default, 128
    const Status s = quantize_checkpoint(o);
    ASSERT_TRUE(s.ok()) << s.to_string();

    std::ifstream cf(out + "/config.json");
    const json q = json::parse(cf)["quantization_config"];
    EXPECT_EQ(q["quant_method"], "compressed-tensors");
    EXPECT_EQ(q["format"], "pack-quantized");
    const json& g = q["config_groups"]["group_0"];
    EXPECT_EQ(g["weights"]["num_bits"], 4);
    EXPECT_EQ(g["weights"]["symmetric"], true);
    EXPECT_EQ(g["weights"]["strategy"], "group");
    EXPECT_EQ(g["weights"]["group_size"], c.group);
    if (std::string(c.scheme) == "w4a16") {
      EXPECT_TRUE(g["input_activations"].is_null());
    } else {
      EXPECT_EQ(g["input_activations"]["num_bits"], 8);
      EXPECT_EQ(g["input_activations"]["strategy"], "token");
      EXPECT_EQ(g["input_activations"]["dynamic"], true);
    }
    for (const char* ig : {"lm_head", "re:.*mlp\\.gate$", "re:.*kv_b_proj$"})
      EXPECT_NE(std::find(q["ignore"].begin(), q["ignore"].end(), ig), q["ignore"].end()) << ig;

    // Headers: each quantized linear as packed I32 [out, in/8] + BF16 scale [out, in/G] +
    // I64 shape [2] (symmetric: no zero point); everything else as in the source.
    const std::map<std::string, json> h = read_headers(out);
    auto src = Checkpoint::open(kModel).value();
    int64_t quantized = 0;
    for (const std::string& name : src.names()) {
      const TensorView* t = src.find(name);
      const bool target = (name.ends_with("_proj.weight") || name.ends_with("_mqa.weight")) &&
                          name.find("kv_b_proj") == std::string::npos &&
                          name.find("eh_proj") == std::string::npos;
      if (!target) {
        ASSERT_EQ(h.count(name), 1u) << name;
        EXPECT_EQ(h.at(name)["dtype"], std::string(dtype_name(t->dtype))) << name;
        EXPECT_EQ(h.at(name)["shape"], t->shape) << name;
        continue;
      }
      ++quantized;
      const std::string m = name.substr(0, name.size() - 7);
      const int64_t rows = t->shape[0], cols = t->shape[1];
      ASSERT_EQ(cols % c.group, 0) << name;  // every target of this model fits G = 32, 128
      EXPECT_EQ(h.count(name), 0u) << name;
      EXPECT_EQ(h.count(m + ".weight_zero_point"), 0u) << name;
      EXPECT_EQ(h.at(m + ".weight_packed")["dtype"], "I32") << name;
      EXPECT_EQ(h.at(m + ".weight_packed")["shape"], json::array({rows, cols / 8})) << name;
      EXPECT_EQ(h.at(m + ".weight_scale")["dtype"], "BF16") << name;
      EXPECT_EQ(h.at(m + ".weight_scale")["shape"], json::array({rows, cols / c.group})) << name;
      EXPECT_EQ(h.at(m + ".weight_shape")["dtype"], "I64") << name;
    }
    EXPECT_EQ(quantized, 6 * 4 + 3 + 5 * 17 * 3);  // as the W8A8 test counts them
    EXPECT_EQ(h.size(), src.names().size() + 2 * static_cast<size_t>(quantized));
    if (std::string(c.scheme) == "w4a16") {
      EXPECT_EQ(check_codes(out, c.group), quantized);
    }

    std::ifstream rf(out + "/quantize_report.json");
    const json report = json::parse(rf);
    EXPECT_EQ(report["scheme"], c.scheme);
    EXPECT_EQ(report["group_size"], c.group);
    EXPECT_EQ(report["smooth_alpha"].is_null(), std::string(c.scheme) == "w4a16");
    int64_t gptq = 0;
    for (const auto& [name, e] : report["linears"].items()) {
      if (e["method"] != "gptq") {
        EXPECT_EQ(e["method"], "rtn") << name;
        continue;
      }
      ++gptq;
      EXPECT_LE(e["error_gptq"].get<double>(), e["error_rtn"].get<double>()) << name;
    }
    EXPECT_GT(gptq, 24);

    const std::vector<float> ql = kjv_logits::logits_of(out, tokens);
    fs::remove_all(out);
    ASSERT_EQ(ql.size(), fl.size());
    const kjv_logits::Distance d = kjv_logits::distance(ql, fl, kVocab);
    const double worst = d.worst_rel;
    const double ce = kjv_logits::cross_entropy(ql, tokens, kVocab);
    std::fprintf(stderr, "%s G%lld: worst row %.3e, argmax agree %.3f, cross-entropy %.4f vs "
                 "%.4f (%+.2f%%)\n", c.scheme, static_cast<long long>(c.group), worst,
                 d.argmax_agree, ce, ce_float, 100 * (ce / ce_float - 1));
    EXPECT_GT(worst, 0.0);
    EXPECT_LT(worst, 0.3);
    EXPECT_GT(d.argmax_agree, 0.9);
    EXPECT_LT(std::fabs(ce / ce_float - 1), 0.03);
  }
}

TEST(QuantizeW4Kjv, BadFlagCombinationsAreRefused) {
  struct Bad {
    const char* scheme;
    int64_t group;
    const char* message;
  };
  for (const Bad& b : {Bad{"w8a8", 64, "--group-size 64 is for the 4-bit schemes"},
                       Bad{"w4a16", 48, "--group-size 48 (expected 32, 64 or 128)"},
                       Bad{"w4a8", 256, "--group-size 256 (expected 32, 64 or 128)"},
                       Bad{"w4a4", 0, "--scheme \"w4a4\" (expected w8a8, w4a16 or w4a8)"}}) {
    const std::string out = temp("bad");
    fs::remove_all(out);
    QuantizeOptions o = options(out);
    o.scheme = b.scheme;
    o.group_size = b.group;
    const Status s = quantize_checkpoint(o);
    ASSERT_FALSE(s.ok()) << b.scheme << " " << b.group;
    EXPECT_NE(s.message().find(b.message), std::string::npos) << s.message();
    EXPECT_FALSE(fs::exists(out));
  }
}

}  // namespace
}  // namespace xds
