#include "model/weights.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "kernels/cpu/linear.h"
#include "test_files.h"

namespace xds {
namespace {

using xds::testing::le_bytes;
using xds::testing::safetensors_bytes;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// E4M3 decoded from its definition (sign, 4-bit exponent with bias 7, 3-bit mantissa,
// subnormals at exponent 0), independently of tensor/dtype.
double fp8_ref(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  const double x = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -x : x;
}

class Weights : public xds::testing::TempDirTest {
 protected:
  RepackOptions opts() const {
    RepackOptions o;
    o.dir = path("cache");
    o.progress = false;
    return o;
  }
  std::vector<std::string> cache_files() const {
    std::vector<std::string> out;
    if (!std::filesystem::exists(dir_ / "cache")) return out;
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "cache")) {
      out.push_back(e.path().filename().string());
    }
    return out;
  }
  Checkpoint open() {
    auto r = Checkpoint::open(dir());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(r).value();
  }
  std::string model_path() const { return path("model.safetensors"); }
};

// 3x5 FP8 weight in 2x2 blocks (edge blocks partial in both directions); every expected
// value worked out by hand: fp8 codes 0x38 = 1, 0x40 = 2, 0x30 = 0.5, 0xb8 = -1, 0x3c = 1.5,
// 0x44 = 3, 0x7e = 448, 0x01 = 2^-9, 0x00 = 0.
TEST_F(Weights, Fp8SmallBlocksHandComputed) {
  const std::vector<uint8_t> q = {0x38, 0x40, 0x30, 0xb8, 0x3c,   // row 0
                                  0x44, 0x00, 0x7e, 0x01, 0x38,   // row 1
                                  0xb8, 0x3c, 0x40, 0x30, 0x44};  // row 2
  const std::vector<float> s = {0.5f, 4.0f,   0.25f,              // block row 0
                                2.0f, 0.125f, 8.0f};              // block row 1
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[3,5],"data_offsets":[0,15]},)"
                          R"("w_scale_inv":{"dtype":"F32","shape":[2,3],"data_offsets":[15,39]}})",
                          le_bytes(q) + le_bytes(s)));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "w", 3, 5, cache, 2, 2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->dtype, DType::kF32);
  EXPECT_EQ(m->rows, 3);
  EXPECT_EQ(m->cols, 5);
  const float* w = static_cast<const float*>(m->data);
  const float expect[15] = {0.5f,       1.0f,  2.0f,  -4.0f, 0.375f, 1.5f,    0.0f, 1792.0f,
                            0.0078125f, 0.25f, -2.0f, 3.0f,  0.25f,  0.0625f, 24.0f};
  for (int i = 0; i < 15; ++i) EXPECT_EQ(w[i], expect[i]) << "element " << i;
}

// 130x131 FP8 weight in the published 128x128 blocks: a 2x2 grid of scales whose last row
// and column of blocks hold 2 and 3 elements. Power-of-two scales keep every product exact.
TEST_F(Weights, Fp8PartialEdgeBlocks128) {
  const int64_t rows = 130, cols = 131;
  std::vector<uint8_t> q(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      q[r * cols + c] = static_cast<uint8_t>(((r * 31 + c * 17) % 126) | ((r + c) % 2 ? 0x80 : 0));
    }
  }
  const std::vector<float> s = {0.25f, 2.0f, 16.0f, 0.0625f};
  const std::string header =
      "{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[130,131],\"data_offsets\":[0," +
      std::to_string(rows * cols) +
      "]},\"w_scale_inv\":{\"dtype\":\"F32\","
      "\"shape\":[2,2],\"data_offsets\":[" +
      std::to_string(rows * cols) + "," + std::to_string(rows * cols + 16) + "]}}";
  write("model.safetensors", safetensors_bytes(header, le_bytes(q) + le_bytes(s)));
  Checkpoint ck = open();
  ThreadPool pool(2);
  RepackOptions o = opts();
  o.pool = &pool;
  RepackCache cache(o);
  auto m = bind_matrix(ck, "w", rows, cols, cache);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const float* w = static_cast<const float*>(m->data);
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double scale = s[(r / 128) * 2 + c / 128];
      const double want = fp8_ref(q[r * cols + c]) * scale;
      if (w[r * cols + c] != want && bad++ < 5) {
        ADD_FAILURE() << "(" << r << ", " << c << "): " << w[r * cols + c] << " != " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(w[129 * cols + 130], fp8_ref(q[129 * cols + 130]) * 0.0625);  // corner block
}

TEST_F(Weights, Fp8MissingOrWrongScales) {
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]}})",
                          std::string(4, '\x38')));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "w", 2, 2, cache);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(m.status().message(), model_path());
  EXPECT_CONTAINS(m.status().message(), "'w' is F8_E4M3");
  EXPECT_CONTAINS(m.status().message(), "'w_scale_inv' (F32 [1, 1]) are missing");

  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                          R"("w_scale_inv":{"dtype":"F32","shape":[2,1],"data_offsets":[4,12]}})",
                          std::string(4, '\x38') + le_bytes<float>({1, 1})));
  Checkpoint ck2 = open();
  m = bind_matrix(ck2, "w", 2, 2, cache);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "'w_scale_inv'");
  EXPECT_CONTAINS(m.status().message(), "expected F32 [1, 1], found F32 [2, 1]");

  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                          R"("w_scale_inv":{"dtype":"BF16","shape":[1,1],"data_offsets":[4,6]}})",
                          std::string(4, '\x38') + le_bytes<uint16_t>({0x3f80})));
  Checkpoint ck3 = open();
  m = bind_matrix(ck3, "w", 2, 2, cache);
  ASSERT_FALSE(m.ok());
  EXPECT_CONTAINS(m.status().message(), "expected F32 [1, 1], found BF16 [1, 1]");
}

TEST_F(Weights, Bf16AndF32InPlace) {
  write("model.safetensors",
        safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"BF16","shape":[2,1],"data_offsets":[8,12]}})",
                          le_bytes<float>({1, 2}) + le_bytes<uint16_t>({0x3f80, 0xc040})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto a = bind_matrix(ck, "a", 1, 2, cache);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->data, ck.find("a")->data);  // zero copy
  auto b = bind_matrix(ck, "b", 2, 1, cache);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->data, ck.find("b")->data);
  EXPECT_EQ(cache.stats().in_place, 2);
  EXPECT_EQ(cache.stats().files_written, 0);
  EXPECT_TRUE(cache_files().empty());

  auto wrong = bind_matrix(ck, "b", 1, 2, cache);
  ASSERT_FALSE(wrong.ok());
  EXPECT_CONTAINS(wrong.status().message(), model_path());
  EXPECT_CONTAINS(wrong.status().message(), "'b'");
  EXPECT_CONTAINS(wrong.status().message(), "expected [1, 2], found [2, 1]");
  auto missing = bind_matrix(ck, "c", 1, 2, cache);
  ASSERT_FALSE(missing.ok());
  EXPECT_CONTAINS(missing.status().message(), "missing tensor 'c' (expected shape [1, 2])");
}

// An FP8 linear weight (published 128x128 blocks, partial edge blocks) binds as FP8 panels
// (a byte per weight) whose products are, bit for bit, the plain ascending-column FMA sums
// over the F32 dequantization that bind_matrix gives (itself checked against the definition
// above); the second loader reuses the file; XDS_WEIGHT_LAYOUT=rows keeps F32 rows.
TEST_F(Weights, Fp8LinearBindsAsFp8PanelsWithTheDequantizedSums) {
  const int64_t rows = 130, cols = 131, n = 3;
  std::vector<uint8_t> q(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i)
    q[i] = static_cast<uint8_t>((i * 37) % 126 | (i % 3 ? 0 : 0x80));
  const std::vector<float> s = {0.0123f, 2.5f, 1e-3f, 0.75f};
  const std::string header =
      "{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[130,131],\"data_offsets\":[0," +
      std::to_string(rows * cols) +
      "]},\"w_scale_inv\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[" +
      std::to_string(rows * cols) + "," + std::to_string(rows * cols + 16) + "]}}";
  write("model.safetensors", safetensors_bytes(header, le_bytes(q) + le_bytes(s)));
  ThreadPool pool(2);
  std::vector<float> x(n * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  for (int loader = 0; loader < 2; ++loader) {
    Checkpoint ck = open();
    RepackCache cache(opts());
    auto w = bind_linear(ck, "w", rows, cols, cache);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(w->layout, MatrixLayout::kPanels16);
    EXPECT_EQ(w->dtype, DType::kF8E4M3);
    EXPECT_EQ(w->bytes(), 10 * 16 * cols);  // a byte per weight, 9 panels and a zero one
    EXPECT_EQ(cache.stats().files_written, loader == 0 ? 1 : 0);
    auto f32 = bind_matrix(ck, "w", rows, cols, cache);
    ASSERT_TRUE(f32.ok()) << f32.status().to_string();
    const float* wf = static_cast<const float*>(f32->data);
    std::vector<float> y(n * rows, NAN);
    kernels::linear_f32(x.data(), n, cols, *w, y.data(), rows, pool);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        float want = 0.0f;
        for (int64_t c = 0; c < cols; ++c) want = std::fma(x[t * cols + c], wf[r * cols + c], want);
        ASSERT_EQ(y[t * rows + r], want) << "t=" << t << " r=" << r;
      }
    }
  }
  ::setenv("XDS_WEIGHT_LAYOUT", "rows", 1);
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto w = bind_linear(ck, "w", rows, cols, cache);
  ::unsetenv("XDS_WEIGHT_LAYOUT");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->layout, MatrixLayout::kRows);
  EXPECT_EQ(w->dtype, DType::kF32);
}

// E4M3 has no infinities; 0x7f and 0xff are NaN. A linear weight holding one is refused
// with the tensor and the element named, and no repack file is left behind.
TEST_F(Weights, Fp8NanElementIsRefusedNamingIt) {
  std::vector<uint8_t> q(20 * 5, 0x38);
  q[7 * 5 + 3] = 0xff;
  write(
      "model.safetensors",
      safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[20,5],"data_offsets":[0,100]},)"
                        R"("w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[100,104]}})",
                        le_bytes(q) + le_bytes<float>({0.5f})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto w = bind_linear(ck, "w", 20, 5, cache);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(w.status().message(), "'w'");
  EXPECT_CONTAINS(w.status().message(), "[7, 3]");
  EXPECT_CONTAINS(w.status().message(), "NaN");
  EXPECT_TRUE(cache_files().empty());
}

// Blocks the panel kernel cannot use (rows not a multiple of 16) or a scale of 2^120 or more
// keep the F32 dequantization.
TEST_F(Weights, Fp8LinearWithUnsuitedBlocksOrScalesStaysF32Rows) {
  std::vector<uint8_t> q(20 * 5, 0x38);
  write(
      "model.safetensors",
      safetensors_bytes(
          R"({"w":{"dtype":"F8_E4M3","shape":[20,5],"data_offsets":[0,100]},)"
          R"("w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[100,104]},)"
          R"("v":{"dtype":"F8_E4M3","shape":[20,5],"data_offsets":[104,204]},)"
          R"("v_scale_inv":{"dtype":"F32","shape":[2,1],"data_offsets":[204,212]}})",
          le_bytes(q) + le_bytes<float>({0x1p121f}) + le_bytes(q) + le_bytes<float>({1.0f, 2.0f})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto w = bind_linear(ck, "w", 20, 5, cache);  // scale 2^121 >= 2^120
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->layout, MatrixLayout::kRows);
  EXPECT_EQ(static_cast<const float*>(w->data)[0], 0x1p121f);
  auto v = bind_linear(ck, "v", 20, 5, cache, 10, 8);  // 10-row blocks
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->layout, MatrixLayout::kRows);
  EXPECT_EQ(static_cast<const float*>(v->data)[19 * 5], 2.0f);
}

TEST_F(Weights, Bf16LinearIsPackedIntoPanelsOnceAndShared) {
  // W = [[1, 2], [3, 4], [5, 6]] in BF16 (1 panel of 16 rows, 13 of them padding).
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,12]},)"
                          R"("f":{"dtype":"F32","shape":[1,2],"data_offsets":[12,20]}})",
                          le_bytes<uint16_t>({0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0}) +
                              le_bytes<float>({1, 2})));
  for (int loader = 0; loader < 2; ++loader) {  // the second finds the repack file
    Checkpoint ck = open();
    RepackCache cache(opts());
    auto w = bind_linear(ck, "w", 3, 2, cache);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(w->layout, MatrixLayout::kPanels16);
    EXPECT_EQ(w->dtype, DType::kBF16);
    EXPECT_EQ(cache.stats().files_written, loader == 0 ? 1 : 0);
    EXPECT_EQ(cache.stats().files_reused, loader == 0 ? 0 : 1);
    // Column c of the panel: rows 0..7 in the even slots, rows 8..15 in the odd ones; the
    // zero panel closing the pair beside it (32 elements a column).
    const auto* p = static_cast<const uint16_t*>(w->data);
    const uint16_t expect[2][3] = {{0x3f80, 0x4040, 0x40a0}, {0x4000, 0x4080, 0x40c0}};
    for (int c = 0; c < 2; ++c) {
      for (int slot = 0; slot < 16; ++slot) {
        const int row = slot % 2 == 0 ? slot / 2 : 8 + slot / 2;
        EXPECT_EQ(p[c * 32 + slot], row < 3 ? expect[c][row] : 0) << c << " " << slot;
      }
    }
    auto f = bind_linear(ck, "f", 1, 2, cache);  // F32 stays row-major, in place
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->layout, MatrixLayout::kRows);
    EXPECT_EQ(f->data, ck.find("f")->data);
  }
  EXPECT_EQ(cache_files().size(), 1u);

  // XDS_WEIGHT_LAYOUT=rows: BF16 in place, row-major, no repack file.
  ::setenv("XDS_WEIGHT_LAYOUT", "rows", 1);
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto w = bind_linear(ck, "w", 3, 2, cache);
  ::unsetenv("XDS_WEIGHT_LAYOUT");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->layout, MatrixLayout::kRows);
  EXPECT_EQ(w->data, ck.find("w")->data);
  EXPECT_EQ(cache.stats().files_written + cache.stats().files_reused, 0);
}

TEST_F(Weights, KvBIsSplitIntoPerHeadAbsorbedPanels) {
  // kv_b_proj for 2 heads, Dn = 3, Dv = 2, C = 5: rows h*5 + i (i < 3: W_UK[h] row i; then
  // W_UV[h]), value 1 + row*5 + c (small integers: exact in BF16 and F16). The panels hold
  // the checkpoint's own elements, BF16 or F16.
  const int64_t heads = 2, dn = 3, dv = 2, lat = 5, rows = heads * (dn + dv);
  auto value = [&](int64_t r, int64_t c) { return static_cast<float>(1 + r * lat + c); };
  // An integer 1 <= v < 2048 in F16: 2^e (1 + m / 1024), bits (e + 15) << 10 | m.
  auto f16_of_integer = [](float v) {
    const int i = static_cast<int>(v), e = std::bit_width(static_cast<unsigned>(i)) - 1;
    return static_cast<uint16_t>(((e + 15) << 10) | ((i - (1 << e)) << (10 - e)));
  };
  auto f16_to_float = [](uint16_t h) {  // normal F16 only (what f16_of_integer writes)
    return std::ldexp(1.0f + static_cast<float>(h & 1023) / 1024.0f, ((h >> 10) & 31) - 15);
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const bool f16 = dtype == DType::kF16;
    SCOPED_TRACE(f16 ? "F16" : "BF16");
    std::vector<uint16_t> bits;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < lat; ++c) {
        const float v = value(r, c);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        bits.push_back(f16 ? f16_of_integer(v) : static_cast<uint16_t>(u >> 16));
      }
    }
    write("model.safetensors",
          safetensors_bytes(fmt::format(R"({{"kv_b":{{"dtype":"{}","shape":[10,5],)"
                                        R"("data_offsets":[0,100]}}}})",
                                        f16 ? "F16" : "BF16"),
                            le_bytes<uint16_t>(bits)));
    Checkpoint ck = open();
    RepackCache cache(opts());
    auto kv_b = bind_matrix(ck, "kv_b", rows, lat, cache);  // F16: its F32 rows
    ASSERT_TRUE(kv_b.ok()) << kv_b.status().to_string();
    auto ah = bind_absorbed_heads(ck, "kv_b", *kv_b, heads, dn, dv, cache);
    ASSERT_TRUE(ah.ok()) << ah.status().to_string();
    ASSERT_EQ(ah->uk_t.size(), 2u);
    ASSERT_EQ(ah->uv.size(), 2u);
    // Element (r, c) of a panel matrix: panel q = r / 16 in pair q / 2, column c of the pair
    // (32 elements: panel 2(q / 2), then the other), slot 2j (j < 8) or 2(j-8)+1.
    auto at = [&](const MatrixRef& m, int64_t r, int64_t c) {
      const int64_t j = r % 16, slot = j < 8 ? 2 * j : 2 * (j - 8) + 1, q = r / 16;
      const auto* p = static_cast<const uint16_t*>(m.data);
      const uint16_t h = p[(q / 2) * m.cols * 32 + c * 32 + (q % 2) * 16 + slot];
      if (h == 0) return 0.0f;
      if (f16) return f16_to_float(h);
      const uint32_t u = uint32_t{h} << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    for (int64_t h = 0; h < heads; ++h) {
      const MatrixRef& uk = ah->uk_t[h];
      const MatrixRef& uv = ah->uv[h];
      EXPECT_EQ(uk.layout, MatrixLayout::kPanels16);
      EXPECT_EQ(uk.dtype, dtype);
      EXPECT_EQ(uv.dtype, dtype);
      EXPECT_EQ(uk.rows, lat);
      EXPECT_EQ(uk.cols, dn);
      EXPECT_EQ(uv.rows, dv);
      EXPECT_EQ(uv.cols, lat);
      for (int64_t c = 0; c < lat; ++c)
        for (int64_t i = 0; i < dn; ++i)
          EXPECT_EQ(at(uk, c, i), value(h * (dn + dv) + i, c)) << "uk_t h=" << h;  // W_UKᵀ
      for (int64_t r = 0; r < dv; ++r)
        for (int64_t c = 0; c < lat; ++c)
          EXPECT_EQ(at(uv, r, c), value(h * (dn + dv) + dn + r, c)) << "uv h=" << h;
      for (int64_t r = dv; r < 16; ++r) EXPECT_EQ(at(uv, r, 0), 0.0f);  // padding rows
    }
    // With XDS_WEIGHT_LAYOUT=rows nothing is re-laid: attention slices kv_b_proj.
    ::setenv("XDS_WEIGHT_LAYOUT", "rows", 1);
    auto none = bind_absorbed_heads(ck, "kv_b", *kv_b, heads, dn, dv, cache);
    ::unsetenv("XDS_WEIGHT_LAYOUT");
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->uk_t.empty());
    EXPECT_TRUE(none->uv.empty());
  }
}

TEST_F(Weights, F16DequantizedToF32) {
  // 0x3c00 = 1, 0xc000 = -2, 0x3800 = 0.5, 0x0001 = 2^-24 (smallest subnormal).
  write("model.safetensors",
        safetensors_bytes(R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}})",
                          le_bytes<uint16_t>({0x3c00, 0xc000, 0x3800, 0x0001})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "h", 2, 2, cache);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->dtype, DType::kF32);
  const float* w = static_cast<const float*>(m->data);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], -2.0f);
  EXPECT_EQ(w[2], 0.5f);
  EXPECT_EQ(w[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(cache.stats().files_written, 1);
}

TEST_F(Weights, F16LinearIsPackedIntoF16Panels) {
  // W = [[1, -2], [0.5, 2^-24], [65504, -0]] in F16: panels of the F16 elements themselves
  // (two bytes a weight), not the F32 rows bind_matrix converts them to.
  const std::vector<uint16_t> w_bits = {0x3c00, 0xc000, 0x3800, 0x0001, 0x7bff, 0x8000};
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F16","shape":[3,2],"data_offsets":[0,12]}})",
                          le_bytes<uint16_t>(w_bits)));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto w = bind_linear(ck, "w", 3, 2, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->layout, MatrixLayout::kPanels16);
  EXPECT_EQ(w->dtype, DType::kF16);
  EXPECT_EQ(cache.stats().files_written, 1);
  const auto* p = static_cast<const uint16_t*>(w->data);
  for (int c = 0; c < 2; ++c) {
    for (int slot = 0; slot < 16; ++slot) {
      const int row = slot % 2 == 0 ? slot / 2 : 8 + slot / 2;
      EXPECT_EQ(p[c * 32 + slot], row < 3 ? w_bits[row * 2 + c] : 0) << c << " " << slot;
    }
  }
  auto shape = bind_linear(ck, "w", 2, 3, cache);
  ASSERT_FALSE(shape.ok());
  EXPECT_CONTAINS(shape.status().message(), "'w'");
  EXPECT_CONTAINS(shape.status().message(), "[2, 3]");

  // XDS_WEIGHT_LAYOUT=rows: F32 rows, as before panels took F16.
  ::setenv("XDS_WEIGHT_LAYOUT", "rows", 1);
  auto rows = bind_linear(ck, "w", 3, 2, cache);
  ::unsetenv("XDS_WEIGHT_LAYOUT");
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  EXPECT_EQ(rows->layout, MatrixLayout::kRows);
  EXPECT_EQ(rows->dtype, DType::kF32);
  EXPECT_EQ(static_cast<const float*>(rows->data)[4], 65504.0f);
}

TEST_F(Weights, MisalignedF16LinearIsBoundAsF32Rows) {
  const std::string header = R"({"pad":{"dtype":"U8","shape":[1,1],"data_offsets":[0,1]},)"
                             R"("w":{"dtype":"F16","shape":[1,2],"data_offsets":[1,5]}})";
  write("model.safetensors",
        safetensors_bytes(header, std::string("\x07", 1) + le_bytes<uint16_t>({0x3c00, 0xc200})));
  Checkpoint ck = open();
  ASSERT_EQ(reinterpret_cast<uintptr_t>(ck.find("w")->data) % 2, 1u);
  RepackCache cache(opts());
  auto w = bind_linear(ck, "w", 1, 2, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->layout, MatrixLayout::kRows);
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(static_cast<const float*>(w->data)[1], -3.0f);
}

TEST_F(Weights, MisalignedBf16IsRepacked) {
  // A 1-byte tensor first puts "w" at an odd address (the header is padded so that the data
  // area starts 8-byte aligned).
  const std::string header = R"({"pad":{"dtype":"U8","shape":[1,1],"data_offsets":[0,1]},)"
                             R"("w":{"dtype":"BF16","shape":[1,2],"data_offsets":[1,5]}})";
  write("model.safetensors",
        safetensors_bytes(header, std::string("\x07", 1) + le_bytes<uint16_t>({0x3f80, 0xc040})));
  Checkpoint ck = open();
  ASSERT_EQ(reinterpret_cast<uintptr_t>(ck.find("w")->data) % 2, 1u);
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "w", 1, 2, cache);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->dtype, DType::kF32);
  EXPECT_EQ(static_cast<const float*>(m->data)[1], -3.0f);
  auto pad = bind_matrix(ck, "pad", 1, 1, cache);
  ASSERT_FALSE(pad.ok());
  EXPECT_EQ(pad.status().code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(pad.status().message(), "dtype U8");
}

// A repack writer killed mid-file leaves `<hash>.xrp.tmp.<pid>.*`; the next loader removes
// it when that pid is gone, and leaves a live writer's temporary and other files alone.
TEST_F(Weights, DeadWritersTemporaryRepackFilesAreRemoved) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // `child` is now a pid with no process
  std::filesystem::create_directories(dir_ / "cache");
  const std::string dead = "0123456789abcdef.xrp.tmp." + std::to_string(child) + ".Ab12Cd";
  const std::string live = "0123456789abcdef.xrp.tmp." + std::to_string(::getpid()) + ".Ef34Gh";
  for (const std::string& name : {dead, live, std::string("notes.txt")}) {
    std::ofstream(dir_ / "cache" / name) << "partial";
  }
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                          R"("w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[4,8]}})",
                          le_bytes<uint8_t>({0x38, 0x40, 0x30, 0xb8}) + le_bytes<float>({2.0f})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "w", 2, 2, cache);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto files = cache_files();
  auto has = [&](const std::string& n) { return std::find(files.begin(), files.end(), n) != files.end(); };
  EXPECT_FALSE(has(dead));
  EXPECT_TRUE(has(live));
  EXPECT_TRUE(has("notes.txt"));
  EXPECT_EQ(files.size(), 3u);  // live, notes.txt and the new repack file
}

TEST_F(Weights, RepackFileIsReusedNotRewritten) {
  const std::vector<uint8_t> q = {0x38, 0x40, 0x30, 0xb8};
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                          R"("w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[4,8]}})",
                          le_bytes(q) + le_bytes<float>({2.0f})));
  struct stat st1, st2;
  {
    Checkpoint ck = open();
    RepackCache cache(opts());
    auto m = bind_matrix(ck, "w", 2, 2, cache);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(static_cast<const float*>(m->data)[3], -2.0f);
    EXPECT_EQ(cache.stats().files_written, 1);
    EXPECT_EQ(cache.stats().files_reused, 0);
  }
  const auto files = cache_files();
  ASSERT_EQ(files.size(), 1u);  // no temporary file left behind
  EXPECT_NE(files[0].find(".xrp"), std::string::npos);
  ASSERT_EQ(::stat(path("cache/" + files[0]).c_str(), &st1), 0);
  {
    Checkpoint ck = open();
    RepackCache cache(opts());  // a second loader, e.g. another process
    auto m = bind_matrix(ck, "w", 2, 2, cache);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(static_cast<const float*>(m->data)[1], 4.0f);
    EXPECT_EQ(cache.stats().files_written, 0);
    EXPECT_EQ(cache.stats().files_reused, 1);
  }
  ASSERT_EQ(cache_files(), files);
  ASSERT_EQ(::stat(path("cache/" + files[0]).c_str(), &st2), 0);
  EXPECT_EQ(st1.st_ino, st2.st_ino);  // not renamed over: the same file
  EXPECT_EQ(st1.st_size, st2.st_size);
  // The reuse marks the file used now (its mtime: the eviction's age), never earlier.
  EXPECT_GE(st2.st_mtim.tv_sec * 1'000'000'000LL + st2.st_mtim.tv_nsec,
            st1.st_mtim.tv_sec * 1'000'000'000LL + st1.st_mtim.tv_nsec);

  // A changed checkpoint (new size and mtime) gets its own repack file.
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                          R"("w_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[4,8]}} )",
                          le_bytes(q) + le_bytes<float>({4.0f})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "w", 2, 2, cache);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(static_cast<const float*>(m->data)[3], -4.0f);
  EXPECT_EQ(cache.stats().files_written, 1);
  EXPECT_EQ(cache_files().size(), 2u);
}

TEST_F(Weights, CorruptRepackFileIsReplaced) {
  write("model.safetensors",
        safetensors_bytes(R"({"h":{"dtype":"F16","shape":[1,1],"data_offsets":[0,2]}})",
                          le_bytes<uint16_t>({0x3c00})));
  {
    Checkpoint ck = open();
    RepackCache cache(opts());
    ASSERT_TRUE(bind_matrix(ck, "h", 1, 1, cache).ok());
  }
  const auto files = cache_files();
  ASSERT_EQ(files.size(), 1u);
  std::filesystem::resize_file(dir_ / "cache" / files[0], 10);  // a torn file
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto m = bind_matrix(ck, "h", 1, 1, cache);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(static_cast<const float*>(m->data)[0], 1.0f);
  EXPECT_EQ(cache.stats().files_written, 1);
}

TEST_F(Weights, VectorsAsF32) {
  write("model.safetensors",
        safetensors_bytes(R"({"n":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                          R"("p":{"dtype":"BF16","shape":[1],"data_offsets":[6,8]},)"
                          R"("h":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}})",
                          le_bytes<uint16_t>({0x3f80, 0xc040, 0x4000, 0}) +
                              le_bytes<float>({0.25f, -7.0f}) + le_bytes<uint16_t>({0xc000})));
  Checkpoint ck = open();
  RepackCache cache(opts());
  auto n = bind_vector_f32(ck, "n", 3, cache);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(std::vector<float>(n->begin(), n->end()), (std::vector<float>{1, -3, 2}));
  auto b = bind_vector_f32(ck, "b", 2, cache);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(static_cast<const void*>(b->data()), ck.find("b")->data);  // in place
  EXPECT_EQ((*b)[1], -7.0f);
  auto h = bind_vector_f32(ck, "h", 1, cache);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ((*h)[0], -2.0f);
  auto wrong = bind_vector_f32(ck, "n", 4, cache);
  ASSERT_FALSE(wrong.ok());
  EXPECT_CONTAINS(wrong.status().message(), "'n': wrong shape: expected [4], found [3]");
  auto missing = bind_vector_f32(ck, "model.norm.weight", 4, cache);
  ASSERT_FALSE(missing.ok());
  EXPECT_CONTAINS(missing.status().message(), "missing tensor 'model.norm.weight'");
}

}  // namespace
}  // namespace xds
