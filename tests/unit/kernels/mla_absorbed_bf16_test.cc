// The bf16 products of the absorbed MLA kernel (AbsorbedQuery::bf16) against plain
// double-precision attention over the bf16-rounded queries and cached rows.
//
// The kernel rounds q_abs, q_pe, the cached rows and the probabilities to bf16. The reference
// rounds the first three the same way and keeps p exact, so the one difference it allows is
// p's rounding: each unnormalised p is off by at most 2^-9 of itself (round to nearest), and
// the normaliser is the sum of the unrounded p, so an output moves by at most
// 2^-9 · max |latent| (= 2^-9 here, the rows in [-1, 1]), plus fp32 accumulation (1e-4 is
// ample). Unrounded queries or rows, or a wrong pairing of columns or rows, miss by far more
// (a score of 576 terms moves by ~0.3 when its query is not rounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

constexpr double kTolerance = 1.0 / 512 + 1e-4;

// Each test on the bf16 products (the AVX-512 panel ISA selected), or skipped where the
// build has none; the default ISA comes back afterwards.
class MlaAbsorbedBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!panel_isa_available(PanelIsa::kAvx512)) GTEST_SKIP() << "this build has only AVX2";
    set_panel_isa(PanelIsa::kAvx512);
    if (!absorbed_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  }
  const IsaGuard guard_;
};

TEST_F(MlaAbsorbedBf16, MatchesReferenceOnRoundedInputs) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t bs = 16, blocks = 20;
  const std::vector<int32_t> table = permuted_block_table(blocks, 7, 3);
  struct Dims {
    int64_t lat, dr;
  };
  // lat 24 + dr 7: an odd row (a zero column pairs with the last), lat not a multiple of 16
  // (masked columns in p·latent); 32 + 8 and 48 + 0 (no rope plane). Heads 3 and 11 leave
  // lanes unused, 20 is two groups. ctx 1, 37 and 257 (odd slices: a zero row pairs with the
  // last), 300 (three slices: the online softmax rescales). Padded rows hold NaN.
  for (const auto [lat, dr] : {Dims{24, 7}, Dims{32, 8}, Dims{48, 0}})
    for (const bool padded : {false, true})
      for (const int64_t heads : {3, 11, 16, 20}) {
        const int64_t ld = padded ? padded_latent_stride(lat) : lat;
        std::vector<float> latent(static_cast<size_t>(blocks * bs * ld)),
            rope(static_cast<size_t>(blocks * bs * std::max<int64_t>(dr, 1)));
        for (auto* v : {&latent, &rope})
          for (float& x : *v) x = d(rng);
        for (int64_t row = 0; row < blocks * bs; ++row)
          for (int64_t c = lat; c < ld; ++c) latent[row * ld + c] = std::nanf("");
        const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr, ld};
        for (const int64_t ctx : {1, 37, 257, 300}) {
          for (const float scale : {0.3f, 2.0f}) {
            std::vector<float> q_abs(static_cast<size_t>(heads * lat)),
                q_pe(static_cast<size_t>(heads * std::max<int64_t>(dr, 1)));
            for (auto* v : {&q_abs, &q_pe})
              for (float& x : *v) x = d(rng);
            std::vector<float> out(static_cast<size_t>(heads * lat), -3.0f);
            AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, out.data(), lat};
            q.bf16 = true;
            mla_absorbed_attention(q, 0, heads, kv, ctx, scale);
            const std::vector<double> ref =
                reference_absorbed(q_abs, q_pe, heads, kv, ctx, scale, bf16);
            for (int64_t i = 0; i < heads * lat; ++i)
              ASSERT_NEAR(out[i], ref[i], kTolerance)
                  << "lat=" << lat << " dr=" << dr << " ld=" << ld << " heads=" << heads
                  << " ctx=" << ctx << " scale=" << scale << " i=" << i;
          }
        }
      }
}

// bf16 planes (the bf16 KV cache) hold the rows the kernel rounds fp32 planes to, so the
// kernel gives the same bits on either, and both match the reference.
TEST_F(MlaAbsorbedBf16, Bf16PlanesGiveTheBitsOfFp32Planes) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t bs = 16, blocks = 24, heads = 16;
  const std::vector<int32_t> table = permuted_block_table(blocks, 5, 7);
  struct Dims {
    int64_t lat, dr;
  };
  for (const auto [lat, dr] : {Dims{24, 7}, Dims{64, 16}, Dims{48, 0}}) {
    const int64_t ld = padded_latent_stride(lat), ld16 = padded_latent_stride(lat, 2);
    const int64_t rows = blocks * bs, drs = std::max<int64_t>(dr, 1);
    std::vector<float> latent(static_cast<size_t>(rows * ld)),
        rope(static_cast<size_t>(rows * drs));
    for (auto* v : {&latent, &rope})
      for (float& x : *v) x = d(rng);
    std::vector<uint16_t> latent16(static_cast<size_t>(rows * ld16), 0x7FC0),  // NaN padding
        rope16(static_cast<size_t>(rows * drs));
    for (int64_t r = 0; r < rows; ++r) {
      kv_row_to_bf16(latent.data() + r * ld, lat, latent16.data() + r * ld16);
      kv_row_to_bf16(rope.data() + r * dr, dr, rope16.data() + r * dr);
    }
    const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr, ld};
    LatentKvView kv16{nullptr, nullptr, table.data(), bs, lat, dr, ld16};
    kv16.latent16 = latent16.data();
    kv16.rope16 = rope16.data();
    for (const int64_t ctx : {1, 37, 300}) {
      std::vector<float> q_abs(static_cast<size_t>(heads * lat)),
          q_pe(static_cast<size_t>(heads * drs));
      for (auto* v : {&q_abs, &q_pe})
        for (float& x : *v) x = d(rng);
      std::vector<float> out(static_cast<size_t>(heads * lat)), out16(out.size());
      AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, out.data(), lat};
      q.bf16 = true;
      mla_absorbed_attention(q, 0, heads, kv, ctx, 0.5f);
      q.out = out16.data();
      mla_absorbed_attention(q, 0, heads, kv16, ctx, 0.5f);
      ASSERT_EQ(std::memcmp(out.data(), out16.data(), sizeof(float) * out.size()), 0)
          << "lat=" << lat << " dr=" << dr << " ctx=" << ctx;
      const std::vector<double> ref = reference_absorbed(q_abs, q_pe, heads, kv, ctx, 0.5f, bf16);
      for (int64_t i = 0; i < heads * lat; ++i)
        ASSERT_NEAR(out16[i], ref[i], kTolerance) << "lat=" << lat << " ctx=" << ctx << " i=" << i;
    }
  }
}

TEST_F(MlaAbsorbedBf16, PartsMergeIntoTheWholeContext) {
  std::mt19937 rng(37);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t lat = 64, dr = 16, bs = 16, blocks = 40, heads = 16, ctx = 513;
  const std::vector<int32_t> table = permuted_block_table(blocks, 11, 5);
  std::vector<float> latent(static_cast<size_t>(blocks * bs * lat)),
      rope(static_cast<size_t>(blocks * bs * dr)), q_abs(static_cast<size_t>(heads * lat)),
      q_pe(static_cast<size_t>(heads * dr));
  for (auto* v : {&latent, &rope, &q_abs, &q_pe})
    for (float& x : *v) x = d(rng);
  const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr};
  const float scale = 1.0f;
  const std::vector<double> ref = reference_absorbed(q_abs, q_pe, heads, kv, ctx, scale, bf16);
  // 513 rows as the model splits them (257 + 256), and an odd cut.
  for (const std::vector<int64_t>& cut : {std::vector<int64_t>{0, 257, 513}, {0, 1, 300, 513}}) {
    AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, nullptr, lat};
    q.bf16 = true;
    const std::vector<float> out = attend_in_parts(q, heads, kv, cut, scale);
    for (int64_t i = 0; i < heads * lat; ++i)
      ASSERT_NEAR(out[i], ref[i], kTolerance) << "parts=" << cut.size() - 1 << " i=" << i;
  }
}

}  // namespace
}  // namespace xds::kernels
