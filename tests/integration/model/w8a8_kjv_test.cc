// The shipped model's RTN W8A8 copy (mkmodel --from --weights-int8) against the float model
// it was quantized from, teacher-forced on the three held-out rows of
// tests/conformance/kjv_moe_tiny: a sanity bound on the quantization error (the integer
// arithmetic itself is checked against the oracle's: the conformance case w8a8_kjv), the
// next-token cross-entropy within a few percent of the float model's, and the bf16 mode of
// the W8A8 model within the fast mode's usual distance of its f32 mode.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "kjv_logits.h"
#include "model/deepseek_v3/deepseek_v3.h"

namespace xds {
namespace {

using kjv_logits::cross_entropy;
using kjv_logits::Distance;
using kjv_logits::distance;
using kjv_logits::heldout_rows;
using kjv_logits::kLen;
using kjv_logits::kRows;

std::vector<float> logits_of(const std::string& dir, ComputeDType compute,
                             const std::vector<int32_t>& tokens) {
  ModelOptions mo;
  mo.compute = compute;
  return kjv_logits::logits_of(dir, tokens, mo);
}

TEST(W8A8Kjv, RtnCopyStaysCloseToTheFloatModel) {
  const std::string src = std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("xds_w8a8_kjv_" + std::to_string(::getpid())))
          .string();
  MkModelOptions o;
  o.from_dir = src;
  o.out_dir = dir;
  o.weights_int8 = true;
  o.progress = false;
  o.threads = 2;
  const Status s = write_random_checkpoint(o);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<int32_t> tokens = heldout_rows();
  const int64_t v = 4096;
  const auto fl = logits_of(src, ComputeDType::kF32, tokens);
  const auto i8 = logits_of(dir, ComputeDType::kF32, tokens);
  const auto i8_bf16 = logits_of(dir, ComputeDType::kBF16, tokens);
  const auto fl_bf16 = logits_of(src, ComputeDType::kBF16, tokens);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(fl.size(), static_cast<size_t>(kRows * kLen * v));
  ASSERT_EQ(i8.size(), fl.size());
  ASSERT_EQ(i8_bf16.size(), fl.size());
  const Distance q = distance(i8, fl, v), m = distance(i8_bf16, i8, v),
                 mf = distance(fl_bf16, fl, v);
  const double ce_float = cross_entropy(fl, tokens, v), ce_int8 = cross_entropy(i8, tokens, v),
               ce_int8_bf16 = cross_entropy(i8_bf16, tokens, v);
  std::fprintf(stderr,
               "W8A8 vs float: worst row %.3e, argmax agree %.3f; cross-entropy %.4f vs %.4f "
               "(%+.2f%%); W8A8 bf16 vs f32 mode: worst row %.3e, argmax agree %.3f, "
               "cross-entropy %.4f; float bf16 vs f32 mode: worst row %.3e\n",
               q.worst_rel, q.argmax_agree, ce_int8, ce_float, 100 * (ce_int8 / ce_float - 1),
               m.worst_rel, m.argmax_agree, ce_int8_bf16, mf.worst_rel);
  // Sanity bounds (a wrong scale or packing moves logits by O(1) and the argmax everywhere).
  EXPECT_GT(q.worst_rel, 0.0);  // it is quantized
  EXPECT_LT(q.worst_rel, 0.1);
  EXPECT_GT(q.argmax_agree, 0.9);
  EXPECT_LT(std::fabs(ce_int8 / ce_float - 1), 0.03);
  // The fast mode rounds the float parts' inputs to bf16 (2^-9), which moves a quantized
  // input by up to 127 · 2^-9 of a step: many more rounding flips than between f32 and
  // float64, so its distance to the f32 mode is larger than a float model's (the float
  // model's printed beside it); its prediction quality must stay.
  EXPECT_LT(m.worst_rel, 0.2);
  EXPECT_GT(m.argmax_agree, 0.95);
  EXPECT_LT(std::fabs(ce_int8_bf16 / ce_float - 1), 0.03);
}

}  // namespace
}  // namespace xds
