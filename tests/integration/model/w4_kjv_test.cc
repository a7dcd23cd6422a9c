// The shipped model's RTN 4-bit copies (mkmodel --from --weights-int4) teacher-forced on the
// three held-out rows of tests/conformance/kjv_moe_tiny: W4A16 against the float model it
// was quantized from (a sanity bound on the 4-bit error: a wrong nibble order, group or zero
// point moves every logit by O(1)), and W4A8 (the same weights, --activation-dtype int8)
// against W4A16 within the bounds the W8A8 test (w8a8_kjv_test.cc) puts on int8
// activations. The arithmetic itself is checked bit for bit and against the dequantized
// float model in tests/unit/model/int4_checkpoint_test.cc.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "kjv_logits.h"
#include "model/deepseek_v3/deepseek_v3.h"

namespace xds {
namespace {

using kjv_logits::heldout_rows;
using kjv_logits::kLen;
using kjv_logits::kRows;
constexpr int64_t kVocab = 4096;

std::vector<float> logits_of(const std::string& dir, ActivationDType act,
                             const std::vector<int32_t>& tokens) {
  ModelOptions mo;
  mo.activation = act;
  return kjv_logits::logits_of(dir, tokens, mo);
}

double cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& tokens) {
  return kjv_logits::cross_entropy(logits, tokens, kVocab);
}

kjv_logits::Distance distance(const std::vector<float>& a, const std::vector<float>& b) {
  return kjv_logits::distance(a, b, kVocab);
}

TEST(W4Kjv, RtnCopiesStayCloseAndW4A8StaysNearW4A16) {
  const std::string src = std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";
  const std::vector<int32_t> tokens = heldout_rows();
  const auto fl = logits_of(src, ActivationDType::kAuto, tokens);
  ASSERT_EQ(fl.size(), static_cast<size_t>(kRows * kLen * kVocab));
  const double ce_float = cross_entropy(fl, tokens);
  for (const char* sym : {"sym", "asym"}) {
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("xds_w4_kjv_" + std::string(sym) + std::to_string(::getpid())))
                                .string();
    MkModelOptions o;
    o.from_dir = src;
    o.out_dir = dir;
    o.weights_int4 = sym;
    o.int4_group_size = 32;
    o.progress = false;
    o.threads = 2;
    const Status s = write_random_checkpoint(o);
    ASSERT_TRUE(s.ok()) << s.to_string();
    const auto a16 = logits_of(dir, ActivationDType::kAuto, tokens);
    const auto a8 = logits_of(dir, ActivationDType::kInt8, tokens);
    std::filesystem::remove_all(dir);
    ASSERT_EQ(a16.size(), fl.size());
    ASSERT_EQ(a8.size(), fl.size());
    const kjv_logits::Distance q = distance(a16, fl), act = distance(a8, a16);
    const double ce16 = cross_entropy(a16, tokens), ce8 = cross_entropy(a8, tokens);
    std::fprintf(stderr,
                 "%s G32: W4A16 vs float worst row %.3e, argmax agree %.3f, cross-entropy %.4f "
                 "vs %.4f (%+.2f%%); W4A8 vs W4A16 worst row %.3e, argmax agree %.3f, "
                 "cross-entropy %.4f\n",
                 sym, q.worst_rel, q.argmax_agree, ce16, ce_float, 100 * (ce16 / ce_float - 1),
                 act.worst_rel, act.argmax_agree, ce8);
    // 4-bit RTN at G = 32 (measured: worst row 0.17 sym, 0.08 asym; argmax 0.93, 0.96;
    // cross-entropy within 0.1%): a coarser worst-row bound than W8A8's 0.1, still far
    // from a packing error's O(1); W8A8's argmax and cross-entropy bounds.
    EXPECT_GT(q.worst_rel, 0.0);
    EXPECT_LT(q.worst_rel, 0.3);
    EXPECT_GT(q.argmax_agree, 0.9);
    EXPECT_LT(std::fabs(ce16 / ce_float - 1), 0.03);
    // The int8 activations (measured: worst row 0.10 sym, 0.16 asym; argmax 1.0, 0.995;
    // cross-entropy within 0.05%): the bounds w8a8_kjv_test.cc puts on its int8 rounding
    // distance (its bf16 against f32 mode: worst row 0.2, argmax 0.95, cross-entropy 3%).
    // Its 0.1 on W8A8 against float is exceeded by the worst of the 192 rows here while
    // the argmax and cross-entropy barely move; the per-linear arithmetic is checked bit
    // for bit in tests/unit/model/int4_checkpoint_test.cc.
    EXPECT_GT(act.worst_rel, 0.0);
    EXPECT_LT(act.worst_rel, 0.2);
    EXPECT_GT(act.argmax_agree, 0.95);
    EXPECT_LT(std::fabs(ce8 / ce16 - 1), 0.03);
  }
}

}  // namespace
}  // namespace xds
