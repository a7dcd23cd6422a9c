// The MLA kernels (expanded prefill, absorbed decode in whole or in parts) against plain
// double-precision attention.
#include "kernels/cpu/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absorbed_parts.h"
#include "isa_for_tests.h"
#include "kernels/cpu/linear_panels.h"

namespace xds::kernels {
namespace {

TEST(MlaExpanded, MatchesCausalAttentionReference) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t heads = 3;
  const IsaGuard guard;
  // m = 70 crosses the 64-row block and four 16-query tiles; p0 = 5 cached positions before
  // the chunk. Head sizes: dv = 12 and 40 leave partial groups of value columns; dn = 20
  // puts the rope columns mid-block in the transposed keys, dr = 8 and 12 are partial blocks.
  struct Dims {
    int64_t dn, dr, dv;
  };
  for (const auto [dn, dr, dv] : {Dims{16, 8, 12}, Dims{20, 12, 40}}) {
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      const int64_t dq = dn + dr, dkv = dn + dv;
      for (const auto& [m, p0] : {std::pair<int64_t, int64_t>{70, 5}, {9, 0}, {1, 30}, {33, 14}}) {
        const int64_t ctx = p0 + m;
        std::vector<float> q(static_cast<size_t>(m * heads * dq)),
            kv(static_cast<size_t>(ctx * heads * dkv)), rope(static_cast<size_t>(ctx * dr)),
            out(static_cast<size_t>(m * heads * dv), -9.0f);
        for (auto* v : {&q, &kv, &rope})
          for (float& x : *v) x = d(rng);
        const float scale = 0.37f;
        const ExpandedChunk c{q.data(),    heads * dq, kv.data(),  heads * dkv,
                              rope.data(), out.data(), heads * dv, m,
                              p0,          dn,         dr,         dv};
        std::vector<float> scratch(
            static_cast<size_t>(expanded_scratch_floats(dn, dr, dv, m, ctx)));
        for (int64_t h = 0; h < heads; ++h) mla_expanded_attention(c, h, scale, scratch.data());

        for (int64_t t = 0; t < m; ++t) {
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t visible = p0 + t + 1;
            std::vector<double> s(static_cast<size_t>(visible));
            const float* qt = q.data() + (t * heads + h) * dq;
            for (int64_t j = 0; j < visible; ++j) {
              double acc = 0.0;
              const float* k = kv.data() + (j * heads + h) * dkv;
              for (int64_t i = 0; i < dn; ++i) acc += double(qt[i]) * k[i];
              for (int64_t i = 0; i < dr; ++i) acc += double(qt[dn + i]) * rope[j * dr + i];
              s[j] = acc * scale;
            }
            const double mx = *std::max_element(s.begin(), s.end());
            double z = 0.0;
            for (double& x : s) z += (x = std::exp(x - mx));
            for (int64_t i = 0; i < dv; ++i) {
              double ref = 0.0;
              for (int64_t j = 0; j < visible; ++j)
                ref += s[j] / z * kv[(j * heads + h) * dkv + dn + i];
              ASSERT_NEAR(out[(t * heads + h) * dv + i], ref, 2e-5)
                  << panel_isa_name(isa) << " dn=" << dn << " m=" << m << " p0=" << p0 << " t=" << t
                  << " h=" << h << " i=" << i;
            }
          }
        }
      }
    }
  }
}

// The AVX-512 kernel sums every score and output in ascending order whatever the tiling:
// a prompt run as one chunk or as two (the second over the first's keys) gives the same
// bits for every query. dv = 40: two full groups of value columns and a partial one.
TEST(MlaExpanded, ChunkingDoesNotChangeTheBits) {
  if (available_isas().size() < 2) GTEST_SKIP() << "this build has only AVX2";
  const IsaGuard guard;
  set_panel_isa(PanelIsa::kAvx512);
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t heads = 2, dn = 32, dr = 16, dv = 40, dq = dn + dr, dkv = dn + dv, len = 83;
  std::vector<float> q(static_cast<size_t>(len * heads * dq)),
      kv(static_cast<size_t>(len * heads * dkv)), rope(static_cast<size_t>(len * dr));
  for (auto* v : {&q, &kv, &rope})
    for (float& x : *v) x = d(rng);
  auto run = [&](int64_t p0, int64_t m, float* out) {
    const ExpandedChunk c{q.data() + p0 * heads * dq,
                          heads * dq,
                          kv.data(),
                          heads * dkv,
                          rope.data(),
                          out + p0 * heads * dv,
                          heads * dv,
                          m,
                          p0,
                          dn,
                          dr,
                          dv};
    std::vector<float> scratch(static_cast<size_t>(expanded_scratch_floats(dn, dr, dv, m, p0 + m)));
    for (int64_t h = 0; h < heads; ++h) mla_expanded_attention(c, h, 0.3f, scratch.data());
  };
  std::vector<float> whole(static_cast<size_t>(len * heads * dv)), split(whole.size());
  run(0, len, whole.data());
  run(0, 29, split.data());  // 29 and 54: neither a multiple of the 16-query tile
  run(29, len - 29, split.data());
  for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(whole[i], split[i]) << "i=" << i;
}

TEST(MlaAbsorbed, MatchesReferenceOverPagedBlocks) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t dr = 8, bs = 16, blocks = 20;
  // Context position s lives in block table[s / bs]: a permutation, so blocks are not in order.
  const std::vector<int32_t> table = permuted_block_table(blocks, 7, 3);
  // lat 24: one 16-column tile and 8 columns one by one; lat 32: two tiles (AVX-512: one
  // 32-column tile); lat 48: a 32-column tile and a 16-column one.
  // 3 and 8 heads (8 lanes), 11 and 16 (16 lanes, padded), 20 (16 + 4); ctx crosses blocks,
  // and from 129 on the 128-row slices (the online softmax rescales earlier slices' sums;
  // scale 2 makes the distribution peaked so that the running max moves between slices).
  // Latent rows dense (ld = lat) or padded to an odd number of lines (ld = 48); the padding
  // holds NaN, so a kernel that reads it fails.
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas())
    for (const int64_t lat : {24, 32, 48})
      for (const bool padded : {false, true})
        for (const float scale : {0.29f, 2.0f})
          for (const int64_t heads : {3, 8, 11, 16, 20}) {
            const int64_t ld = padded ? padded_latent_stride(lat) : lat;
            std::vector<float> latent(static_cast<size_t>(blocks * bs * ld)),
                rope(static_cast<size_t>(blocks * bs * dr));
            for (auto* v : {&latent, &rope})
              for (float& x : *v) x = d(rng);
            for (int64_t row = 0; row < blocks * bs; ++row)
              for (int64_t c = lat; c < ld; ++c) latent[row * ld + c] = std::nanf("");
            const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr, ld};
            set_panel_isa(isa);
            for (const int64_t ctx : {1, 5, 37, 64, 129, 300}) {
              std::vector<float> q_abs(static_cast<size_t>(heads * lat)),
                  q_pe(static_cast<size_t>(heads * dr));
              for (auto* v : {&q_abs, &q_pe})
                for (float& x : *v) x = d(rng);
              std::vector<float> out(static_cast<size_t>(heads * lat), -3.0f);
              const AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, out.data(), lat};
              // Heads [1, heads) only, as a thread with a group of heads does; head 0 stays
              // untouched.
              mla_absorbed_attention(q, 1, heads, kv, ctx, scale);
              for (int64_t i = 0; i < lat; ++i) ASSERT_EQ(out[i], -3.0f);
              for (int64_t h = 1; h < heads; ++h) {
                std::vector<double> s(static_cast<size_t>(ctx));
                for (int64_t j = 0; j < ctx; ++j) {
                  const float* l = kv.latent_at(j);
                  const float* r = kv.rope_at(j);
                  double acc = 0.0;
                  for (int64_t c = 0; c < lat; ++c) acc += double(q_abs[h * lat + c]) * l[c];
                  for (int64_t c = 0; c < dr; ++c) acc += double(q_pe[h * dr + c]) * r[c];
                  s[j] = acc * scale;
                }
                const double mx = *std::max_element(s.begin(), s.end());
                double z = 0.0;
                for (double& x : s) z += (x = std::exp(x - mx));
                for (int64_t c = 0; c < lat; ++c) {
                  double ref = 0.0;
                  for (int64_t j = 0; j < ctx; ++j) ref += s[j] / z * kv.latent_at(j)[c];
                  ASSERT_NEAR(out[h * lat + c], ref, 2e-5)
                      << panel_isa_name(isa) << " lat=" << lat << " ld=" << ld << " scale=" << scale
                      << " heads=" << heads << " ctx=" << ctx << " h=" << h;
                }
              }
            }
          }
}

// Parts of the context computed separately, then merged, equal the attention of the whole
// context; the parts may cut through blocks and slices anywhere.
TEST(MlaAbsorbed, PartsMergeIntoTheWholeContext) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t lat = 32, dr = 8, bs = 16, blocks = 20, heads = 16, ctx = 300;
  const std::vector<int32_t> table = permuted_block_table(blocks, 11, 5);
  std::vector<float> latent(static_cast<size_t>(blocks * bs * lat)),
      rope(static_cast<size_t>(blocks * bs * dr));
  std::vector<float> q_abs(static_cast<size_t>(heads * lat)), q_pe(static_cast<size_t>(heads * dr));
  for (auto* v : {&latent, &rope, &q_abs, &q_pe})
    for (float& x : *v) x = d(rng);
  const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr};
  const float scale = 1.5f;
  const std::vector<double> ref = reference_absorbed(q_abs, q_pe, heads, kv, ctx, scale);
  const std::vector<std::vector<int64_t>> cuts = {
      {0, 300}, {0, 100, 257, 300}, {0, 1, 299, 300}, {0, 128, 256, 300}};
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas())
    for (const auto& cut : cuts) {
      set_panel_isa(isa);
      const AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, nullptr, lat};
      const std::vector<float> out = attend_in_parts(q, heads, kv, cut, scale);
      for (int64_t i = 0; i < heads * lat; ++i)
        ASSERT_NEAR(out[i], ref[i], 2e-5)
            << panel_isa_name(isa) << " parts=" << cut.size() - 1 << " i=" << i;
    }
}

// Both instruction sets sum every score and every output in the same order: the same bits.
TEST(MlaAbsorbed, InstructionSetsGiveTheSameBits) {
  if (available_isas().size() < 2) GTEST_SKIP() << "this build has only AVX2";
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t lat = 80, dr = 16, bs = 16, blocks = 24, ctx = 370;  // 80 = 32 + 32 + 16
  const int64_t ld = padded_latent_stride(lat);
  const std::vector<int32_t> table = permuted_block_table(blocks, 5, 2);
  std::vector<float> latent(static_cast<size_t>(blocks * bs * ld)),
      rope(static_cast<size_t>(blocks * bs * dr));
  for (auto* v : {&latent, &rope})
    for (float& x : *v) x = d(rng);
  const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr, ld};
  const IsaGuard guard;
  for (const int64_t heads : {9, 13, 16}) {
    std::vector<float> q_abs(static_cast<size_t>(heads * lat)),
        q_pe(static_cast<size_t>(heads * dr));
    for (auto* v : {&q_abs, &q_pe})
      for (float& x : *v) x = d(rng);
    std::vector<std::vector<float>> outs;
    for (const PanelIsa isa : available_isas()) {
      set_panel_isa(isa);
      std::vector<float> out(static_cast<size_t>(heads * lat));
      const AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, out.data(), lat};
      mla_absorbed_attention(q, 0, heads, kv, ctx, 0.7f);
      outs.push_back(out);
    }
    for (size_t i = 0; i < outs[0].size(); ++i)
      ASSERT_EQ(outs[0][i], outs[1][i]) << "heads=" << heads << " i=" << i;
  }
}

// Hand-derived: the stride is the smallest odd number of 16-float lines holding the row.
TEST(MlaAbsorbed, PaddedLatentStrideIsAnOddNumberOfLines) {
  EXPECT_EQ(padded_latent_stride(512), 528);  // 32 lines -> 33
  EXPECT_EQ(padded_latent_stride(500), 528);  // 32 lines (rounded up) -> 33
  EXPECT_EQ(padded_latent_stride(24), 48);    // 2 -> 3
  EXPECT_EQ(padded_latent_stride(16), 16);    // 1, already odd
  EXPECT_EQ(padded_latent_stride(33), 48);    // 3 lines (rounded up), odd
  EXPECT_EQ(padded_latent_stride(1), 16);
}

// Hand-derived: H 2, C 4, Dn 3, Dr 1, Dv 5; a chunk of 2 tokens after 2 cached ones has
// 2·2 + 2·3/2 = 7 (query, row) pairs. Absorbed products 7·2·(2·5 + 2·4) = 252, W_UK and W_UV
// 2·2·2·4·8 = 256; expanded products 7·2·(2·4 + 2·5) = 252, kv_b_proj over 4 rows
// 4·2·4·2·8 = 512. One decode token over ctx rows: 2·ctx·H·(2C + Dr).
TEST(MlaFlops, HandDerivedCounts) {
  const MlaShape s{2, 4, 3, 1, 5};
  EXPECT_DOUBLE_EQ(mla_absorbed_pair_flops(s, 7), 252.0);
  EXPECT_DOUBLE_EQ(mla_expanded_pair_flops(s, 7), 252.0);
  const MlaChunkFlops f = mla_chunk_flops(s, 2, 2);
  EXPECT_DOUBLE_EQ(f.absorbed, 256.0 + 252.0);
  EXPECT_DOUBLE_EQ(f.expanded, 512.0 + 252.0);
  EXPECT_DOUBLE_EQ(mla_absorbed_pair_flops(s, 300), 2.0 * 300 * 2 * (2 * 4 + 1));
}

// The split is a function of the context length that covers it exactly.
TEST(MlaAbsorbed, ContextSplitCoversTheContext) {
  for (const int64_t ctx : {1, 127, 128, 255, 256, 257, 513, 1000, 4096, 100000}) {
    const AbsorbedSplit sp = absorbed_context_split(ctx);
    EXPECT_GE(sp.count, 1);
    EXPECT_LE(sp.count, kAbsorbedMaxParts) << ctx;
    if (sp.count > 1) {
      EXPECT_GE(sp.rows, kAbsorbedPartMinRows) << ctx;
    }
    EXPECT_GE(sp.count * sp.rows, ctx) << ctx;        // covers the context
    EXPECT_LT((sp.count - 1) * sp.rows, ctx) << ctx;  // no empty part
    if (ctx < kAbsorbedPartMinRows) {
      EXPECT_EQ(sp.count, 1) << ctx;
    }
  }
}

// AbsorbedNextRows is a prefetch hint: whatever it names (rows of another sequence, more
// rows than a slice, planes of the other element type), the output keeps its bits, on
// every instruction set and with bf16 products where the build has them.
TEST(MlaAbsorbed, NextRowsHintChangesNoBits) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t lat = 64, dr = 16, bs = 16, blocks = 40, heads = 16, ctx = 300;
  const int64_t ld = padded_latent_stride(lat), ld16 = padded_latent_stride(lat, 2);
  const std::vector<int32_t> table = permuted_block_table(blocks, 7, 3),
                             other_table = permuted_block_table(blocks, 11, 5);
  std::vector<float> latent(static_cast<size_t>(blocks * bs * ld)),
      rope(static_cast<size_t>(blocks * bs * dr)), q_abs(static_cast<size_t>(heads * lat)),
      q_pe(static_cast<size_t>(heads * dr));
  for (auto* v : {&latent, &rope, &q_abs, &q_pe})
    for (float& x : *v) x = d(rng);
  std::vector<uint16_t> latent16(static_cast<size_t>(blocks * bs * ld16)),
      rope16(static_cast<size_t>(blocks * bs * dr));
  const bool bf16 = absorbed_bf16_available();
  if (bf16) {
    for (int64_t r = 0; r < blocks * bs; ++r) {
      kv_row_to_bf16(latent.data() + r * ld, lat, latent16.data() + r * ld16);
      kv_row_to_bf16(rope.data() + r * dr, dr, rope16.data() + r * dr);
    }
  }
  const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr, ld};
  const LatentKvView other{latent.data(), rope.data(), other_table.data(), bs, lat, dr, ld};
  LatentKvView kv16{nullptr, nullptr, table.data(), bs, lat, dr, ld16};
  kv16.latent16 = latent16.data();
  kv16.rope16 = rope16.data();
  const AbsorbedNextRows hints[] = {{other, 0, 600}, {other, 290, 300}, {kv, 1, 2}, {kv16, 0, 600}};
  const IsaGuard guard;
  for (const PanelIsa isa : available_isas()) {
    set_panel_isa(isa);
    for (const bool products16 : {false, true}) {
      if (products16 && !absorbed_bf16_available()) continue;
      const LatentKvView* views[] = {&kv, &kv16};
      for (const LatentKvView* view : views) {
        if (view == &kv16 && !products16) continue;  // bf16 planes: bf16 products only
        std::vector<float> plain(static_cast<size_t>(heads * lat));
        AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, plain.data(), lat};
        q.bf16 = products16;
        mla_absorbed_attention(q, 0, heads, *view, ctx, 0.3f);
        for (const AbsorbedNextRows& hint : hints) {
          if (hint.kv.bf16() && !bf16) continue;
          std::vector<float> hinted(plain.size());
          q.out = hinted.data();
          mla_absorbed_attention(q, 0, heads, *view, ctx, 0.3f, &hint);
          ASSERT_EQ(std::memcmp(plain.data(), hinted.data(), sizeof(float) * plain.size()), 0)
              << panel_isa_name(isa) << " bf16 products " << products16 << " bf16 planes "
              << view->bf16() << " hint rows [" << hint.begin << ", " << hint.end << ")";
        }
      }
    }
  }
}

// DeepSeek-V3's cache shape (C = 512 in rows of 528 floats, Dr = 64) takes the AVX-512
// scores tiles with the row stride as a constant (runs of up to 16 rows of one block); the
// same rows at another stride (560) take the pointer-per-row tiles. Both sum every score in
// the same order, so the same bits, and both match the double reference. Blocks of 8, 16
// and 64 rows, out of order; contexts and parts that start and end inside blocks.
TEST(MlaAbsorbed, StridedTilesGiveTheBitsOfPointerTiles) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const int64_t lat = 512, dr = 64, ld = padded_latent_stride(lat), other_ld = 560, rows = 640;
  ASSERT_EQ(ld, 528);
  std::vector<float> latent(static_cast<size_t>(rows * ld)),
      wide(static_cast<size_t>(rows * other_ld)), rope(static_cast<size_t>(rows * dr));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < lat; ++c) latent[r * ld + c] = wide[r * other_ld + c] = d(rng);
  for (float& x : rope) x = d(rng);
  const IsaGuard guard;
  for (const int64_t bs : {8, 16, 64}) {
    const std::vector<int32_t> table = permuted_block_table(rows / bs, 3, 1);
    const LatentKvView kv{latent.data(), rope.data(), table.data(), bs, lat, dr, ld};
    const LatentKvView kv_wide{wide.data(), rope.data(), table.data(), bs, lat, dr, other_ld};
    for (const int64_t heads : {11, 16}) {
      std::vector<float> q_abs(static_cast<size_t>(heads * lat)),
          q_pe(static_cast<size_t>(heads * dr));
      for (auto* v : {&q_abs, &q_pe})
        for (float& x : *v) x = d(rng);
      const float scale = 0.08f;
      const std::vector<std::vector<int64_t>> cuts = {{0, 37}, {0, 513}, {0, 100, 257, 600}};
      for (const auto& cut : cuts) {
        const std::vector<double> ref =
            reference_absorbed(q_abs, q_pe, heads, kv, cut.back(), scale);
        for (const PanelIsa isa : available_isas()) {
          set_panel_isa(isa);
          const AbsorbedQuery q{q_abs.data(), lat, q_pe.data(), dr, nullptr, lat};
          const std::vector<float> strided = attend_in_parts(q, heads, kv, cut, scale);
          const std::vector<float> pointers = attend_in_parts(q, heads, kv_wide, cut, scale);
          for (int64_t i = 0; i < heads * lat; ++i) {
            ASSERT_EQ(strided[i], pointers[i])
                << panel_isa_name(isa) << " bs=" << bs << " heads=" << heads
                << " ctx=" << cut.back() << " i=" << i;
            ASSERT_NEAR(strided[i], ref[i], 2e-5)
                << panel_isa_name(isa) << " bs=" << bs << " heads=" << heads
                << " ctx=" << cut.back() << " i=" << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace xds::kernels
