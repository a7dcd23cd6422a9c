// The absorbed MLA kernel over an INT8 latent plane (LatentKvView::int8()) against plain
// double-precision attention over the rows the test dequantizes itself (q · scale, one fp32
// product, as int8_quant.h defines), on every instruction set of the build and with the
// fp32 and (where available) bf16 products. The planes lie blocks apart with gaps between
// blocks (non-default block strides) and a permuted block table; latent rows are padded and
// the padding holds 127, the gaps NaN / 127: a kernel that reads them misses by far.
// The bf16 products convert the int8 rows straight into their bf16 rows per slice: two more
// tests pin those rows' bits and that the next-rows prefetch hint leaves the bits alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absorbed_parts.h"
#include "isa_for_tests.h"
#include "kernels/cpu/mla_attention.h"
#include "tensor/dtype.h"

namespace xds::kernels {
namespace {

float bf16(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

// fp32 products: fp32 accumulation over up to ~1100 rows of values in [-1, 1] (the kernel
// tests of the float planes hold 2e-5 at 300 rows). bf16 products: the bf16 test's bound
// (p rounded to bf16: 2^-9 of max |latent| = 1), the reference rounding queries and rows.
constexpr double kF32Tolerance = 5e-5;
constexpr double kBf16Tolerance = 1.0 / 512 + 1e-4;

// An INT8 cache of `blocks` blocks: latent [block][bs][ld] int8 with `gap` bytes after each
// block, scales [block][bs] with 3 floats after each, rope [block][bs][dr] fp32 or bf16 with
// 5 elements after each.
struct Int8Planes {
  int64_t lat = 0, dr = 0, ld = 0, bs = 0, blocks = 0;
  bool rope_bf16 = false;
  std::vector<int8_t> latent;
  std::vector<float> scale, rope;
  std::vector<uint16_t> rope16;

  static constexpr int64_t kLatentGap = 64, kScaleGap = 3, kRopeGap = 5;

  int64_t latent_block() const { return bs * ld + kLatentGap; }
  int64_t scale_block() const { return bs + kScaleGap; }
  int64_t rope_block() const { return bs * dr + kRopeGap; }

  void fill(std::mt19937& rng) {
    std::uniform_int_distribution<int> qd(-127, 127);
    std::uniform_real_distribution<float> sd(0.5f / 127, 1.0f / 127), rd(-1.0f, 1.0f);
    latent.assign(static_cast<size_t>(blocks * latent_block()), int8_t{127});
    scale.assign(static_cast<size_t>(blocks * scale_block()), std::nanf(""));
    rope.assign(static_cast<size_t>(blocks * rope_block()), std::nanf(""));
    rope16.assign(rope.size(), uint16_t{0x7fc0});
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t r = 0; r < bs; ++r) {
        int8_t* q = latent.data() + b * latent_block() + r * ld;
        for (int64_t c = 0; c < lat; ++c) q[c] = static_cast<int8_t>(qd(rng));
        // Row 3 of block 1 is a zero row (scale 0), as the quantizer leaves one.
        scale[b * scale_block() + r] = b == 1 && r == 3 ? 0.0f : sd(rng);
        for (int64_t c = 0; c < dr; ++c) {
          const float v = rd(rng);
          rope[b * rope_block() + r * dr + c] = rope_bf16 ? bf16(v) : v;
          rope16[b * rope_block() + r * dr + c] = f32_to_bf16(v);
        }
      }
    }
  }

  LatentKvView view(const std::vector<int32_t>& table) const {
    LatentKvView v;
    v.latent8 = latent.data();
    v.latent_scale = scale.data();
    if (rope_bf16) {
      v.rope16 = rope16.data();
    } else {
      v.rope = rope.data();
    }
    v.block_table = table.data();
    v.block_size = bs;
    v.latent_dim = lat;
    v.rope_dim = dr;
    v.latent_ld = ld;
    v.latent_block_stride = latent_block();
    v.scale_block_stride = scale_block();
    v.rope_block_stride = rope_block();
    return v;
  }

  // The same rows dequantized by the test: compact fp32 planes [blocks][bs][lat], [..][dr].
  struct Float {
    std::vector<float> latent, rope;
  };
  Float dequantized() const {
    Float f;
    f.latent.resize(static_cast<size_t>(blocks * bs * lat));
    f.rope.resize(static_cast<size_t>(blocks * bs * std::max<int64_t>(dr, 1)));
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < bs; ++r) {
        const float s = scale[b * scale_block() + r];
        for (int64_t c = 0; c < lat; ++c)
          f.latent[(b * bs + r) * lat + c] =
              static_cast<float>(latent[b * latent_block() + r * ld + c]) * s;
        for (int64_t c = 0; c < dr; ++c)
          f.rope[(b * bs + r) * dr + c] = rope[b * rope_block() + r * dr + c];
      }
    return f;
  }
};

TEST(MlaInt8Kv, DequantizesHandDerivedRows) {
  // Two blocks of 2 rows, lat 3 (ld 4), dr 2, block table {1, 0}: position 0 is block 1.
  const std::vector<int8_t> latent = {0, 0, 0, 0, 0, 0, 0, 0, 1, -2, 127, 9, 4, 0, -127, 9};
  const std::vector<float> scale = {0.0f, 0.0f, 0.5f, 0.25f};
  const std::vector<uint16_t> rope16 = {0, 0, 0, 0, 0x3f80, 0xc000, 0x4040, 0x3f00};
  const std::vector<int32_t> table = {1, 0};
  LatentKvView v;
  v.latent8 = latent.data();
  v.latent_scale = scale.data();
  v.rope16 = rope16.data();
  v.block_table = table.data();
  v.block_size = 2;
  v.latent_dim = 3;
  v.rope_dim = 2;
  v.latent_ld = 4;
  float lat[2 * 5], rope[2 * 2];
  dequantize_int8_kv_rows(v, 0, 2, lat, 5, rope);
  const float want_lat[] = {0.5f, -1.0f, 63.5f, 1.0f, 0.0f, -31.75f};
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(lat[r * 5 + c], want_lat[r * 3 + c]) << r << "," << c;
  const float want_rope[] = {1.0f, -2.0f, 3.0f, 0.5f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rope[i], want_rope[i]) << i;
}

struct Case {
  int64_t lat, dr, bs, heads;
  bool padded, rope_bf16;
  std::vector<int64_t> ctxs;
};

TEST(MlaInt8Kv, AbsorbedMatchesDequantizedReference) {
  std::mt19937 rng(83);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const bool have_bf16 = panel_isa_available(PanelIsa::kAvx512) && [] {
    const IsaGuard g;
    set_panel_isa(PanelIsa::kAvx512);
    return absorbed_bf16_available();
  }();
  // DeepSeek-V3's shape (C = 512 in padded rows, Dr = 64: the strided tiles; 1100 rows cross
  // two kInt8ChunkRows boundaries, so chunks fold); odd widths and blocks of 5 (chunks that
  // start inside a block, bf16 rows copied); a bf16 rope plane; no rope plane.
  const std::vector<Case> cases = {
      {512, 64, 16, 16, true, false, {1, 600, 1100}},
      {31, 7, 5, 20, true, false, {1, 37, 530}},
      {48, 8, 16, 3, false, true, {129, 515}},
      {40, 0, 16, 11, false, false, {70}},
  };
  const IsaGuard guard;
  for (const Case& k : cases) {
    const int64_t max_ctx = *std::max_element(k.ctxs.begin(), k.ctxs.end());
    const int64_t blocks = (max_ctx + k.bs - 1) / k.bs;
    if (k.rope_bf16 && !have_bf16) continue;  // a bf16 rope plane is written only there
    Int8Planes p;
    p.lat = k.lat, p.dr = k.dr, p.bs = k.bs, p.blocks = blocks, p.rope_bf16 = k.rope_bf16;
    p.ld = k.padded ? padded_latent_stride(k.lat, 1) : k.lat;
    p.fill(rng);
    const std::vector<int32_t> table = permuted_block_table(blocks, 7, 3);
    const LatentKvView kv = p.view(table);
    const Int8Planes::Float f = p.dequantized();
    const LatentKvView ref_kv{f.latent.data(), f.rope.data(), table.data(), k.bs, k.lat, k.dr};
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      for (const bool use_bf16 : {false, true}) {
        if (use_bf16 && !(isa == PanelIsa::kAvx512 && absorbed_bf16_available())) continue;
        for (const int64_t ctx : k.ctxs) {
          std::vector<float> q_abs(static_cast<size_t>(k.heads * k.lat)),
              q_pe(static_cast<size_t>(k.heads * std::max<int64_t>(k.dr, 1)));
          for (auto* v : {&q_abs, &q_pe})
            for (float& x : *v) x = d(rng);
          const float scale = 1.5f / std::sqrt(static_cast<float>(k.lat + k.dr));
          const std::vector<double> ref =
              use_bf16 ? reference_absorbed(q_abs, q_pe, k.heads, ref_kv, ctx, scale, bf16)
                       : reference_absorbed(q_abs, q_pe, k.heads, ref_kv, ctx, scale);
          const double tol = use_bf16 ? kBf16Tolerance : kF32Tolerance;
          std::vector<float> out(static_cast<size_t>(k.heads * k.lat), -3.0f);
          const AbsorbedQuery q{q_abs.data(), k.lat, q_pe.data(), k.dr,
                                out.data(),   k.lat, use_bf16};
          mla_absorbed_attention(q, 0, k.heads, kv, ctx, scale);
          // In parts as the model splits a long context (one cut inside a block).
          const std::vector<float> parts =
              ctx > 2 ? attend_in_parts(q, k.heads, kv, {0, ctx / 3 + 1, ctx}, scale) : out;
          for (size_t i = 0; i < out.size(); ++i) {
            ASSERT_NEAR(out[i], ref[i], tol) << panel_isa_name(isa) << (use_bf16 ? " bf16" : " f32")
                                             << " lat=" << k.lat << " ctx=" << ctx << " i=" << i;
            if (ctx > 2) {
              ASSERT_NEAR(parts[i], ref[i], tol)
                  << "parts " << panel_isa_name(isa) << " lat=" << k.lat << " ctx=" << ctx;
            }
          }
        }
      }
    }
  }
}

// Whether the bf16 products run with the AVX-512 panels selected (the guard restores the ISA).
bool select_bf16_products() {
  if (!panel_isa_available(PanelIsa::kAvx512)) return false;
  set_panel_isa(PanelIsa::kAvx512);
  return absorbed_bf16_available();
}

// DeepSeek-V3's latent shape over `blocks` blocks of 16 (padded rows, bf16 rope, the gaps of
// Int8Planes).
Int8Planes v3_planes(int64_t blocks, std::mt19937& rng) {
  Int8Planes p;
  p.lat = 512, p.dr = 64, p.bs = 16, p.blocks = blocks, p.rope_bf16 = true;
  p.ld = padded_latent_stride(p.lat, 1);
  p.fill(rng);
  return p;
}

// The bf16 products' row of an INT8 latent is q · scale in fp32 rounded to nearest even
// bf16, the rounding of the dequantized row (what the reference of the test above takes):
// over one row (p = 1) out is that row to the bit. Every int8 value, a scale whose products
// need rounding (3q · 2^-9 for 3|q| >= 256 has 9 significant bits: q = 127 is halfway
// between 380 and 382 · 2^-9 and rounds to the even 380).
TEST(MlaInt8Kv, Bf16ProductsRoundTheDequantizedRow) {
  const IsaGuard guard;
  if (!select_bf16_products()) GTEST_SKIP() << "no AVX512_BF16 attention kernel";
  std::mt19937 rng(29);
  Int8Planes p = v3_planes(2, rng);
  const std::vector<int32_t> table = {1, 0};  // position 0: block 1, row 0
  constexpr float kScale = 3.0f / 512;
  int8_t* row = p.latent.data() + p.latent_block();
  for (int64_t c = 0; c < p.lat; ++c) row[c] = static_cast<int8_t>(c % 255 - 127);
  p.scale[static_cast<size_t>(p.scale_block())] = kScale;
  const int64_t heads = 16;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> q_abs(static_cast<size_t>(heads * p.lat)),
      q_pe(static_cast<size_t>(heads * p.dr));
  for (auto* v : {&q_abs, &q_pe})
    for (float& x : *v) x = d(rng);
  std::vector<float> out(static_cast<size_t>(heads * p.lat), -3.0f);
  const AbsorbedQuery q{q_abs.data(), p.lat, q_pe.data(), p.dr, out.data(), p.lat, true};
  mla_absorbed_attention(q, 0, heads, p.view(table), 1, 0.125f);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t c = 0; c < p.lat; ++c)
      ASSERT_EQ(out[h * p.lat + c], bf16(static_cast<float>(row[c]) * kScale)) << h << "," << c;
}

// The same over many slices: the bf16 products over an INT8 view give the bits of the bf16
// products over bf16 planes holding its dequantized rows rounded to nearest even, whole
// context and parts (1100 rows: slices of 128 and odd ones, a permuted block table, parts
// cut inside a block; the INT8 rows pass through the slice copy, the bf16 planes are read
// in place).
TEST(MlaInt8Kv, Bf16ProductsGiveTheBitsOfBf16PlanesOfTheRoundedRows) {
  const IsaGuard guard;
  if (!select_bf16_products()) GTEST_SKIP() << "no AVX512_BF16 attention kernel";
  std::mt19937 rng(37);
  const Int8Planes p = v3_planes(70, rng);
  const std::vector<int32_t> table = permuted_block_table(70, 3, 11);
  const Int8Planes::Float f = p.dequantized();
  std::vector<uint16_t> lat16(f.latent.size()), rope16(f.rope.size());
  for (size_t i = 0; i < f.latent.size(); ++i) lat16[i] = f32_to_bf16(f.latent[i]);
  for (size_t i = 0; i < f.rope.size(); ++i) rope16[i] = f32_to_bf16(f.rope[i]);
  LatentKvView bf16_kv;
  bf16_kv.latent16 = lat16.data(), bf16_kv.rope16 = rope16.data();
  bf16_kv.block_table = table.data(), bf16_kv.block_size = p.bs;
  bf16_kv.latent_dim = p.lat, bf16_kv.rope_dim = p.dr;
  const int64_t heads = 16, ctx = 1100;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> q_abs(static_cast<size_t>(heads * p.lat)),
      q_pe(static_cast<size_t>(heads * p.dr));
  for (auto* v : {&q_abs, &q_pe})
    for (float& x : *v) x = d(rng);
  auto attend = [&](const LatentKvView& kv) {
    std::vector<float> out(static_cast<size_t>(heads * p.lat), -3.0f);
    const AbsorbedQuery q{q_abs.data(), p.lat, q_pe.data(), p.dr, out.data(), p.lat, true};
    mla_absorbed_attention(q, 0, heads, kv, ctx, 0.07f);
    const std::vector<float> parts = attend_in_parts(q, heads, kv, {0, 517, ctx}, 0.07f);
    out.insert(out.end(), parts.begin(), parts.end());
    return out;
  };
  EXPECT_EQ(attend(p.view(table)), attend(bf16_kv));
}

// The prefetch hint (AbsorbedNextRows) is only a hint: a part of an INT8 view attended with
// the next part's rows as its hint, with a float view's rows (another element type: not
// fetched) or with none gives the same bits, with both products. 700 rows over 44 blocks in
// a permuted table: the hint's rows start inside a block.
TEST(MlaInt8Kv, NextRowsHintLeavesTheBitsAlone) {
  std::mt19937 rng(31);
  const Int8Planes p = v3_planes(44, rng);
  const std::vector<int32_t> table = permuted_block_table(44, 9, 5);
  const LatentKvView kv = p.view(table);
  const Int8Planes::Float f = p.dequantized();
  const LatentKvView float_kv{f.latent.data(), f.rope.data(), table.data(), p.bs, p.lat, p.dr};
  const int64_t heads = 16, cut = 301, ctx = 700;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> q_abs(static_cast<size_t>(heads * p.lat)),
      q_pe(static_cast<size_t>(heads * p.dr));
  for (auto* v : {&q_abs, &q_pe})
    for (float& x : *v) x = d(rng);
  const IsaGuard guard;
  for (const bool use_bf16 : {false, true}) {
    if (use_bf16 && !select_bf16_products()) continue;
    const AbsorbedQuery q{q_abs.data(), p.lat, q_pe.data(), p.dr, nullptr, p.lat, use_bf16};
    auto attend = [&](const AbsorbedNextRows* next) {
      std::vector<float> out(static_cast<size_t>(heads * (p.lat + 2)), -5.0f);
      float* m = out.data() + heads * p.lat;
      mla_absorbed_attention_part(q, 0, heads, kv, 0, cut, 0.06f, {out.data(), p.lat, m, m + heads},
                                  next);
      return out;
    };
    const std::vector<float> alone = attend(nullptr);
    const AbsorbedNextRows next_int8{kv, cut, ctx}, next_float{float_kv, cut, ctx};
    EXPECT_EQ(attend(&next_int8), alone) << (use_bf16 ? "bf16" : "f32");
    EXPECT_EQ(attend(&next_float), alone) << (use_bf16 ? "bf16" : "f32");
  }
}

}  // namespace
}  // namespace xds::kernels
