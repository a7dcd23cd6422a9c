// 4-bit checkpoint tensors (model/int4_weights.h) unpacked from files this test writes
// itself: the header text and the packing (compressed-tensors pack-quantized: 8 nibbles per
// int32, weights along the inputs, zero points along the outputs; GPTQ: weights along the
// inputs in [in/8, out], zero points stored minus 1 along the outputs) are the test's own,
// from the layouts' definitions, and the unpacked q / scale / zero must equal the values it
// packed. Then every way a tensor can be wrong fails with the file, the tensor and what.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "int4_tensors.h"
#include "model/int4_weights.h"
#include "model/safetensors.h"
#include "test_files.h"

namespace xds {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

using namespace int4_test;

class Int4Unpack : public testing::TempDirTest {
 protected:
  Result<Int4Unpacked> unpack(const std::vector<RawTensor>& ts, const IntQuantization& q,
                              const Values& v) {
    write("model.safetensors", safetensors_of(ts));
    auto ckpt = Checkpoint::open(dir());
    if (!ckpt.ok()) return ckpt.status();
    ckpt_ = std::make_unique<Checkpoint>(std::move(*ckpt));
    return unpack_int4_module(*ckpt_, q, "layer.proj", v.rows, v.cols);
  }
  void expect_values(const Int4Unpacked& u, const Values& v, bool symmetric) {
    EXPECT_EQ(u.q, v.q);
    EXPECT_EQ(u.scale, v.scale);
    if (symmetric) {
      EXPECT_TRUE(u.zero.empty());
    } else {
      EXPECT_EQ(u.zero, v.zero);
    }
    EXPECT_EQ(u.group_cols, v.group);
  }
  std::unique_ptr<Checkpoint> ckpt_;
};

const std::string kModule = "layer.proj";

TEST_F(Int4Unpack, PackQuantizedSymmetricAndAsymmetric) {
  for (const bool sym : {true, false}) {
    for (const int64_t g : {32, 128}) {
      // 44 rows: the zero points' last word holds 4 rows and 4 padding nibbles.
      const Values v = random_values(44, 256, g, sym, false, 11 + g);
      auto u = unpack(pack_quantized_tensors(kModule, v, sym),
                      quant_of(Int4Format::kPackQuantized, g, sym), v);
      ASSERT_TRUE(u.ok()) << u.status().to_string();
      expect_values(*u, v, sym);
    }
  }
}

TEST_F(Int4Unpack, GptqV1AndV2SymmetricAndAsymmetric) {
  for (const bool v1 : {true, false}) {
    for (const bool sym : {true, false}) {
      const Values v = random_values(44, 128, 64, sym, v1, 5);
      auto u = unpack(gptq_tensors(kModule, v, v1), quant_of(Int4Format::kGptq, 64, sym, v1), v);
      ASSERT_TRUE(u.ok()) << u.status().to_string();
      expect_values(*u, v, sym);
    }
  }
}

// A permuted g_idx (activation reordering) is read as written, in both formats, and the
// weight of column c takes the scale and zero point of group g_idx[c]; an identity g_idx
// reads as none.
TEST_F(Int4Unpack, PermutedGroupIndexIsReadAndUsed) {
  for (const bool gptq : {false, true}) {
    Values v = random_values(20, 256, 64, false, gptq, 17);
    v.g_idx = shuffled_groups(256, 64, 23);
    const auto ts =
        gptq ? gptq_tensors(kModule, v, true) : pack_quantized_tensors(kModule, v, false);
    auto u =
        unpack(ts, quant_of(gptq ? Int4Format::kGptq : Int4Format::kPackQuantized, 64, false), v);
    ASSERT_TRUE(u.ok()) << u.status().to_string();
    expect_values(*u, v, false);
    EXPECT_EQ(u->g_idx, v.g_idx);
    for (int64_t r = 0; r < v.rows; ++r) {
      for (int64_t c = 0; c < v.cols; ++c) {
        const int64_t g = r * 4 + v.g_idx[c];
        ASSERT_EQ(u->weight(r, c), v.scale[g] * static_cast<float>(v.q[r * 256 + c] - v.zero[g]))
            << r << " " << c;
      }
    }
  }
  Values id = random_values(8, 64, 32, false, true, 2);
  for (int64_t c = 0; c < 64; ++c) id.g_idx.push_back(static_cast<int32_t>(c / 32));
  auto u = unpack(gptq_tensors(kModule, id, true), quant_of(Int4Format::kGptq, 32, false), id);
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_TRUE(u->g_idx.empty());
}

// The dequantized weight is scale · (q - z), one product.
TEST_F(Int4Unpack, WeightIsScaleTimesQMinusZero) {
  const Values v = random_values(8, 64, 32, false, false, 3);
  auto u = unpack(pack_quantized_tensors(kModule, v, false),
                  quant_of(Int4Format::kPackQuantized, 32, false), v);
  ASSERT_TRUE(u.ok());
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c = 0; c < 64; ++c)
      EXPECT_EQ(u->weight(r, c), v.scale[r * 2 + c / 32] *
                                     static_cast<float>(v.q[r * 64 + c] - v.zero[r * 2 + c / 32]));
}

RawTensor* find_tensor(std::vector<RawTensor>& ts, const std::string& name) {
  for (RawTensor& t : ts)
    if (t.name == name) return &t;
  return nullptr;
}

TEST_F(Int4Unpack, BadTensorsNameTheFileTheTensorAndTheProblem) {
  const Values v = random_values(16, 64, 32, false, false, 9);
  const IntQuantization asym = quant_of(Int4Format::kPackQuantized, 32, false);
  struct Case {
    std::string what;
    std::function<void(std::vector<RawTensor>&)> mutate;
    std::vector<std::string> want;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"I8 packed weights",
       [](auto& ts) {
         RawTensor* t = find_tensor(ts, kModule + ".weight_packed");
         t->dtype = "I8";
         t->bytes.resize(16 * 8);
       },
       {"layer.proj.weight_packed", "model.safetensors", "dtype I8"}},
      {"packed shape",
       [](auto& ts) {
         find_tensor(ts, kModule + ".weight_packed")->shape = {8, 16};
       },
       {"layer.proj.weight_packed", "[16, 8]"}},
      {"weight_shape",
       [](auto& ts) {
         find_tensor(ts, kModule + ".weight_shape")->bytes =
             testing::le_bytes(std::vector<int64_t>{16, 72});
       },
       {"layer.proj.weight_shape", "72"}},
      {"negative scale",
       [](auto& ts) {
         std::vector<float> s(32, 0.5f);
         s[5] = -1.0f;
         find_tensor(ts, kModule + ".weight_scale")->bytes = f32_bytes(s);
       },
       {"layer.proj.weight_scale", "element 5", "-1"}},
      {"NaN scale",
       [](auto& ts) {
         std::vector<float> s(32, 0.5f);
         s[3] = std::nanf("");
         find_tensor(ts, kModule + ".weight_scale")->bytes = f32_bytes(s);
       },
       {"layer.proj.weight_scale", "element 3"}},
      {"scale dtype",
       [](auto& ts) { find_tensor(ts, kModule + ".weight_scale")->dtype = "I32"; },
       {"layer.proj.weight_scale", "dtype I32"}},
      {"missing zero point",
       [](auto& ts) { ts.pop_back(); },
       {"layer.proj.weight_zero_point", "symmetric"}},
      {"g_idx groups of unequal sizes",
       [](auto& ts) {
         std::vector<int32_t> g(64, 0);
         for (int c = 0; c < 64; ++c) g[c] = c % 5 == 0 ? 1 : 0;  // 13 columns in group 1
         ts.push_back({kModule + ".weight_g_idx", "I32", {64}, testing::le_bytes(g)});
       },
       {"layer.proj.weight_g_idx", "group 0 holds 51 columns", "group_size 32"}},
      {"g_idx group out of range",
       [](auto& ts) {
         std::vector<int32_t> g(64, 0);
         for (int c = 0; c < 64; ++c) g[c] = c / 32;
         g[7] = 2;
         ts.push_back({kModule + ".weight_g_idx", "I32", {64}, testing::le_bytes(g)});
       },
       {"layer.proj.weight_g_idx", "column 7 is in group 2, expected 0..1"}},
      {"g_idx shape",
       [](auto& ts) {
         std::vector<int32_t> g(32, 0);
         ts.push_back({kModule + ".weight_g_idx", "I32", {32}, testing::le_bytes(g)});
       },
       {"layer.proj.weight_g_idx", "[32]", "expected [64]"}},
  };
  for (const Case& c : cases) {
    std::vector<RawTensor> ts = pack_quantized_tensors(kModule, v, false);
    c.mutate(ts);
    auto u = unpack(ts, asym, v);
    ASSERT_FALSE(u.ok()) << c.what;
    for (const std::string& w : c.want) EXPECT_CONTAINS(u.status().message(), w) << c.what;
  }
  // A symmetric config with an asymmetric zero point stored.
  {
    std::vector<RawTensor> ts = pack_quantized_tensors(kModule, v, false);
    auto u = unpack(ts, quant_of(Int4Format::kPackQuantized, 32, true), v);
    ASSERT_FALSE(u.ok());
    EXPECT_CONTAINS(u.status().message(), "layer.proj.weight_zero_point");
    EXPECT_CONTAINS(u.status().message(), "symmetric");
  }
  // GPTQ v1: a stored zero point 15 would be 16.
  {
    Values bad = random_values(16, 64, 32, false, true, 4);
    std::vector<RawTensor> ts = gptq_tensors(kModule, bad, true);
    std::vector<uint32_t> qz(static_cast<size_t>(2 * 2), 0x77777777u);
    qz[1] = 0x7777f777u;  // group 0, rows 8..15: row 11 stored 15
    find_tensor(ts, kModule + ".qzeros")->bytes = i32_bytes(qz);
    auto u = unpack(ts, quant_of(Int4Format::kGptq, 32, false, true), bad);
    ASSERT_FALSE(u.ok());
    EXPECT_CONTAINS(u.status().message(), "layer.proj.qzeros");
    EXPECT_CONTAINS(u.status().message(), "row 11 group 0: zero point 16");
  }
  // A group size that does not divide the columns.
  {
    auto u = unpack(pack_quantized_tensors(kModule, v, false),
                    quant_of(Int4Format::kPackQuantized, 128, false), v);
    ASSERT_FALSE(u.ok());
    EXPECT_CONTAINS(u.status().message(), "group_size");
  }
}

}  // namespace
}  // namespace xds
