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

#include "model/int4_weights.h"
#include "model/safetensors.h"
#include "test_files.h"

namespace xds {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// A tensor as this test writes it: dtype text, shape, raw little-endian bytes.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string safetensors_of(const std::vector<RawTensor>& ts) {
  std::string header = "{", data;
  for (size_t i = 0; i < ts.size(); ++i) {
    const RawTensor& t = ts[i];
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d)
      shape += (d ? "," : "") + std::to_string(t.shape[d]);
    header += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          i ? "," : "", t.name, t.dtype, shape, data.size(),
                          data.size() + t.bytes.size());
    data += t.bytes;
  }
  return testing::safetensors_bytes(header + "}", data);
}

// The values a module holds, before packing: q [rows][cols] 0..15, scale [rows][groups]
// (multiples of 2^-10, exact in f16 and f32), zero [rows][groups] 0..15 (8 if symmetric).
struct Values {
  int64_t rows, cols, group;
  std::vector<uint8_t> q, zero;
  std::vector<float> scale;
};

Values random_values(int64_t rows, int64_t cols, int64_t group, bool symmetric, bool gptq_v1,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  Values v{rows, cols, group, {}, {}, {}};
  const int64_t groups = cols / group;
  for (int64_t i = 0; i < rows * cols; ++i) v.q.push_back(static_cast<uint8_t>(rng() % 16));
  for (int64_t i = 0; i < rows * groups; ++i) {
    v.scale.push_back(static_cast<float>(1 + rng() % 1000) / 1024.0f);
    // GPTQ v1 stores z - 1: zero points 1..15 only.
    v.zero.push_back(symmetric ? 8 : static_cast<uint8_t>(gptq_v1 ? 1 + rng() % 15 : rng() % 16));
  }
  return v;
}

std::string i32_bytes(const std::vector<uint32_t>& words) {
  return testing::le_bytes(words);
}

std::string f32_bytes(const std::vector<float>& v) {
  return testing::le_bytes(v);
}

// compressed-tensors pack-quantized: word [r][c / 8] holds q[r][c] at bits 4 (c % 8).
std::vector<RawTensor> pack_quantized_tensors(const std::string& m, const Values& v,
                                              bool symmetric) {
  const int64_t groups = v.cols / v.group;
  std::vector<uint32_t> packed(static_cast<size_t>(v.rows * v.cols / 8), 0);
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t c = 0; c < v.cols; ++c)
      packed[r * (v.cols / 8) + c / 8] |= uint32_t{v.q[r * v.cols + c]} << (4 * (c % 8));
  std::vector<RawTensor> ts = {
      {m + ".weight_packed", "I32", {v.rows, v.cols / 8}, i32_bytes(packed)},
      {m + ".weight_scale", "F32", {v.rows, groups}, f32_bytes(v.scale)},
      {m + ".weight_shape", "I64", {2}, testing::le_bytes(std::vector<int64_t>{v.rows, v.cols})}};
  if (!symmetric) {
    // Zero points: word [r / 8][g] holds z[r][g] at bits 4 (r % 8).
    std::vector<uint32_t> zp(static_cast<size_t>((v.rows + 7) / 8 * groups), 0);
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t g = 0; g < groups; ++g)
        zp[(r / 8) * groups + g] |= uint32_t{v.zero[r * groups + g]} << (4 * (r % 8));
    ts.push_back({m + ".weight_zero_point", "I32", {(v.rows + 7) / 8, groups}, i32_bytes(zp)});
  }
  return ts;
}

// GPTQ: qweight word [c / 8][r] holds q[r][c] at bits 4 (c % 8); qzeros word [g][r / 8]
// holds z[r][g] - 1 (v1) at bits 4 (r % 8); scales [g][r] F32 here.
std::vector<RawTensor> gptq_tensors(const std::string& m, const Values& v, bool v1) {
  const int64_t groups = v.cols / v.group, zc = (v.rows + 7) / 8;
  std::vector<uint32_t> qw(static_cast<size_t>(v.cols / 8 * v.rows), 0);
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t c = 0; c < v.cols; ++c)
      qw[(c / 8) * v.rows + r] |= uint32_t{v.q[r * v.cols + c]} << (4 * (c % 8));
  std::vector<uint32_t> qz(static_cast<size_t>(groups * zc), 0);
  std::vector<float> sc(static_cast<size_t>(groups * v.rows));
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      qz[g * zc + r / 8] |= uint32_t(v.zero[r * groups + g] - (v1 ? 1 : 0)) << (4 * (r % 8));
      sc[g * v.rows + r] = v.scale[r * groups + g];
    }
  }
  std::vector<int32_t> g_idx;
  for (int64_t c = 0; c < v.cols; ++c) g_idx.push_back(static_cast<int32_t>(c / v.group));
  return {{m + ".qweight", "I32", {v.cols / 8, v.rows}, i32_bytes(qw)},
          {m + ".qzeros", "I32", {groups, zc}, i32_bytes(qz)},
          {m + ".scales", "F32", {groups, v.rows}, f32_bytes(sc)},
          {m + ".g_idx", "I32", {v.cols}, testing::le_bytes(g_idx)}};
}

IntQuantization quant_of(Int4Format f, int64_t group, bool symmetric, bool v1 = true) {
  IntQuantization q;
  q.scheme = IntScheme::kW4A16;
  q.format = f;
  q.group_size = group;
  q.symmetric = symmetric;
  q.gptq_zero_minus_one = f == Int4Format::kGptq && v1;
  q.quantized_by_tensors = f == Int4Format::kGptq;
  return q;
}

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
      {"permuted g_idx",
       [](auto& ts) {
         std::vector<int32_t> g(64, 0);
         for (int c = 0; c < 64; ++c) g[c] = c % 2;
         ts.push_back({kModule + ".weight_g_idx", "I32", {64}, testing::le_bytes(g)});
       },
       {"layer.proj.weight_g_idx", "column 1 is in group 1", "not supported"}},
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
