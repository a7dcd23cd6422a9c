// Pure routing and row functions: expert map, plan_routes, group_by_expert, INT8 rows,
// exchange staging layout. Expected values are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "xccl/a2e.h"
#include "xccl/expert_map.h"
#include "xccl/moe.h"
#include "xccl/rowops.h"

namespace xds::xccl {
namespace {

TEST(XcclExpertMap, IdentityWithSpareSlots) {
  // 6 logical experts over 2 devices with 4 slots: 3 per device, slot 3 is spare.
  ExpertMap m = ExpertMap::identity(6, 2, 4, 9);
  ASSERT_TRUE(m.validate().ok());
  EXPECT_EQ(m.version, 9u);
  EXPECT_EQ(m.physical(0, 0), 0);
  EXPECT_EQ(m.physical(2, 0), 2);
  EXPECT_EQ(m.physical(3, 0), 4);  // device 1, slot 0
  EXPECT_EQ(m.physical(5, 0), 6);
  m.replicas[1].push_back(7);  // replica in device 1's spare slot
  EXPECT_EQ(m.physical(1, 0), 1);
  EXPECT_EQ(m.physical(1, 1), 7);  // round-robin by token
  m.replicas[2] = {8};
  EXPECT_NE(m.validate().message().find("slot 8 outside [0, 8)"), std::string::npos);
}

// The 3-token case, hand-derived on an identity map of 8 experts on 2 devices (0-3 on device
// 0, 4-7 on device 1):
//   token 0: experts 1, 5, 2  -> device 0 {1, 2}, device 1 {1}
//   token 1: experts 6, 7, -1 -> device 1 {2, 3}
//   token 2: experts 0, 3, 2  -> device 0 {0, 3, 2}
const std::vector<int32_t> kThreeTokenIds = {1, 5, 2, 6, 7, -1, 0, 3, 2};
const std::vector<float> kThreeTokenWeights = {.1f, .2f, .3f, .4f, .5f, .6f, .7f, .8f, .9f};

void expect_three_token_plan(const RoutePlan& plan) {
  const auto& d0 = plan.per_device[0];
  const auto& d1 = plan.per_device[1];
  ASSERT_EQ(d0.size(), 2u);
  ASSERT_EQ(d1.size(), 2u);
  EXPECT_EQ(d0[0].token, 0u);
  EXPECT_EQ(d0[0].n_local, 2);
  EXPECT_EQ(d0[0].local_expert[0], 1);
  EXPECT_EQ(d0[0].local_expert[1], 2);
  EXPECT_FLOAT_EQ(d0[0].weight[1], .3f);
  EXPECT_EQ(d0[1].token, 2u);
  EXPECT_EQ(d0[1].n_local, 3);
  EXPECT_EQ(d1[0].token, 0u);
  EXPECT_EQ(d1[0].n_local, 1);
  EXPECT_EQ(d1[0].local_expert[0], 1);
  EXPECT_EQ(d1[1].token, 1u);
  EXPECT_EQ(d1[1].local_expert[1], 3);
  EXPECT_FLOAT_EQ(d1[1].weight[1], .5f);
}

TEST(XcclRouting, PlanSendsATokenOncePerDeviceWithItsLocalExperts) {
  const ExpertMap m = ExpertMap::identity(8, 2, 4);
  const auto& ids = kThreeTokenIds;
  const auto& w = kThreeTokenWeights;
  auto plan = plan_routes(m, ids, w, 3, 3);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  expect_three_token_plan(*plan);
  // Out-of-range expert ids are an error naming the token.
  const std::vector<int32_t> bad = {1, 9, 2};
  EXPECT_NE(plan_routes(m, bad, w, 1, 3).status().message().find("token 0 expert 9"),
            std::string::npos);
}

TEST(XcclRouting, PlanIntoAReusedPlanEqualsTheHandDerivedOne) {
  const ExpertMap m = ExpertMap::identity(8, 2, 4);
  // First a bigger plan: 4 tokens x top-4, every expert used, so every list and slot is dirty.
  const std::vector<int32_t> big_ids = {0, 1, 4, 5, 2, 3, 6, 7, 7, 6, 5, 4, 3, 2, 1, 0};
  const std::vector<float> big_w(16, 9.f);
  RoutePlan plan;
  ASSERT_TRUE(plan_routes_into(m, big_ids, big_w, 4, 4, plan).ok());
  ASSERT_EQ(plan.per_device[0].size(), 3u);  // tokens 0, 1, 3
  ASSERT_EQ(plan.per_device[1].size(), 3u);  // tokens 0, 1, 2
  // Then the 3-token plan of the test above (hand-derived there): same entries, and the slots
  // past n_local are blank (zero), as on a fresh plan.
  const auto& ids = kThreeTokenIds;
  const auto& w = kThreeTokenWeights;
  ASSERT_TRUE(plan_routes_into(m, ids, w, 3, 3, plan).ok());
  expect_three_token_plan(plan);
  const auto& d0 = plan.per_device[0];
  const auto& d1 = plan.per_device[1];
  EXPECT_EQ(d0[0].local_expert[2], 0);
  EXPECT_EQ(d0[0].weight[2], 0.f);
  EXPECT_EQ(d0[1].local_expert[3], 0);
  EXPECT_EQ(d1[0].local_expert[1], 0);
  EXPECT_EQ(d1[1].n_local, 2);
  // Zero tokens: empty lists; negative: an error.
  ASSERT_TRUE(plan_routes_into(m, ids, w, 0, 3, plan).ok());
  EXPECT_TRUE(plan.per_device[0].empty() && plan.per_device[1].empty());
  EXPECT_FALSE(plan_routes_into(m, ids, w, -1, 3, plan).ok());
}

TEST(XcclRouting, GroupByExpertOrdersByExpertThenSourceThenEntry) {
  // Source 0 sends token 4 (experts 2, 0) and token 7 (expert 2); source 1 sends token 1 (expert
  // 0).
  RouteEntry a{}, b{}, c{};
  a.token = 4;
  a.n_local = 2;
  a.local_expert[0] = 2;
  a.local_expert[1] = 0;
  a.weight[0] = 1;
  a.weight[1] = 2;
  b.token = 7;
  b.n_local = 1;
  b.local_expert[0] = 2;
  b.weight[0] = 3;
  c.token = 1;
  c.n_local = 1;
  c.local_expert[0] = 0;
  c.weight[0] = 4;
  const std::vector<RouteEntry> s0 = {a, b}, s1 = {c};
  const std::vector<std::span<const RouteEntry>> from = {s0, s1};
  const RecvLayout L = group_by_expert(from, 3);
  // Expert 0: (src 0, token 4), (src 1, token 1); expert 1: none; expert 2: (0, 4), (0, 7).
  ASSERT_EQ(L.n_rows(), 4);
  EXPECT_EQ(L.expert_offset, (std::vector<int32_t>{0, 2, 2, 4}));
  EXPECT_EQ(L.rows[0].token, 4u);
  EXPECT_EQ(L.rows[0].weight, 2.f);
  EXPECT_EQ(L.rows[0].first, 0);  // token 4's first expert is 2, pulled into row 2
  EXPECT_EQ(L.rows[1].src, 1);
  EXPECT_EQ(L.rows[2].token, 4u);
  EXPECT_EQ(L.rows[2].first, 1);
  EXPECT_EQ(L.rows[3].token, 7u);
  EXPECT_EQ(L.entry_row[0][0 * kMaxTopk + 0], 2u);
  EXPECT_EQ(L.entry_row[0][0 * kMaxTopk + 1], 0u);
  EXPECT_EQ(L.entry_row[1][0], 1u);
  // Into a layout that held a bigger grouping before: the same table.
  RecvLayout R;
  const std::vector<RouteEntry> big(5, a);
  const std::vector<std::span<const RouteEntry>> big_from = {big, big, s1};
  group_by_expert_into(big_from, 3, R);
  ASSERT_EQ(R.n_rows(), 21);
  group_by_expert_into(from, 3, R);
  ASSERT_EQ(R.n_rows(), 4);
  EXPECT_EQ(R.expert_offset, (std::vector<int32_t>{0, 2, 2, 4}));
  ASSERT_EQ(R.entry_row.size(), 2u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(R.rows[size_t(r)].src, L.rows[size_t(r)].src);
    EXPECT_EQ(R.rows[size_t(r)].entry, L.rows[size_t(r)].entry);
    EXPECT_EQ(R.rows[size_t(r)].token, L.rows[size_t(r)].token);
    EXPECT_EQ(R.rows[size_t(r)].first, L.rows[size_t(r)].first);
    EXPECT_EQ(R.rows[size_t(r)].weight, L.rows[size_t(r)].weight);
  }
  EXPECT_EQ(R.entry_row[0][0 * kMaxTopk + 0], 2u);
  EXPECT_EQ(R.entry_row[0][0 * kMaxTopk + 1], 0u);
  EXPECT_EQ(R.entry_row[0][1 * kMaxTopk + 0], 3u);
  EXPECT_EQ(R.entry_row[1][0], 1u);
  EXPECT_EQ(rounds_needed(0, 8), 0);
  EXPECT_EQ(rounds_needed(17, 8), 3);
}

TEST(XcclRowOps, Int8RowsStayWithinHalfAScaleAndCarryHalfTheBytes) {
  const int H = 7168;
  std::vector<uint16_t> x(H), y(H);
  for (int h = 0; h < H; ++h) x[size_t(h)] = float_to_bf16(std::sin(float(h)) * (h % 7 + 1));
  std::vector<std::byte> q(int8_row_bytes(H));
  const float scale = quantize_row_int8(x.data(), H, q.data());
  float amax = 0;
  for (int h = 0; h < H; ++h) amax = std::max(amax, std::fabs(bf16_to_float(x[size_t(h)])));
  EXPECT_FLOAT_EQ(scale, amax / 127.f);
  dequantize_row_int8(q.data(), H, y.data());
  for (int h = 0; h < H; ++h) {
    const float a = bf16_to_float(x[size_t(h)]), b = bf16_to_float(y[size_t(h)]);
    ASSERT_LE(std::fabs(a - b), scale / 2 + std::fabs(a) / 128.f) << h;
  }
  // 7168 int8 values + 4-byte scale vs 7168 * 2 bytes.
  EXPECT_EQ(int8_row_bytes(H), 7172u);
  EXPECT_NEAR(double(int8_row_bytes(H)) / (2.0 * H), 0.5, 0.001);
  // An all-zero row quantizes to zeros.
  std::vector<uint16_t> z(16, 0), zz(16, 1);
  std::vector<std::byte> qz(int8_row_bytes(16));
  quantize_row_int8(z.data(), 16, qz.data());
  dequantize_row_int8(qz.data(), 16, zz.data());
  for (uint16_t v : zz) EXPECT_EQ(v, 0);
}

// The INT8 kernels (vectorised) against a plain per-element loop written here: scale =
// max|x| / 127 over the non-NaN values, q = nearbyint(x / scale) clamped to [-127, 127],
// back = bf16(q * scale). Every byte and every bf16 must match, at widths around the 16- and
// 32-column steps (tails), with signs, zeros, tiny and large magnitudes.
TEST(XcclRowOps, Int8KernelsMatchAPlainPerElementLoop) {
  uint64_t s = 12345;
  auto next = [&] { return s = s * 6364136223846793005ull + 1442695040888963407ull; };
  for (int H : {1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 2047, 2048, 7168}) {
    for (int pass = 0; pass < 5; ++pass) {
      std::vector<uint16_t> x(static_cast<size_t>(H));
      for (auto& v : x) {
        const double mag = std::ldexp(double(next() >> 40) / double(1 << 24), int(next() >> 60) - 6);
        v = float_to_bf16(float((next() >> 63) ? -mag : mag));
      }
      if (pass == 1) x[size_t(next() % uint64_t(H))] = 0x8000;  // -0
      if (pass == 2) std::fill(x.begin(), x.end(), uint16_t(0));
      if (pass == 3) x[size_t(next() % uint64_t(H))] = float_to_bf16(-1000.f);  // the max is negative
      if (pass == 4) x[size_t(next() % uint64_t(H))] = 0x7fc1;  // a NaN: skipped by the max, -127
      double amax = 0;
      for (uint16_t v : x)
        if (!std::isnan(bf16_to_float(v))) amax = std::max(amax, std::fabs(double(bf16_to_float(v))));
      const float scale = amax > 0 ? float(amax) / 127.f : 1.f;
      std::vector<std::byte> q(int8_row_bytes(H));
      ASSERT_EQ(quantize_row_int8(x.data(), H, q.data()), scale) << H;
      float stored;
      std::memcpy(&stored, q.data() + int8_row_bytes(H) - 4, 4);
      EXPECT_EQ(stored, scale);
      std::vector<uint16_t> y(static_cast<size_t>(H));
      dequantize_row_int8(q.data(), H, y.data());
      for (int h = 0; h < H; ++h) {
        float r = std::nearbyint(bf16_to_float(x[size_t(h)]) * (1.f / scale));
        r = std::isnan(r) ? -127.f : std::min(127.f, std::max(-127.f, r));
        ASSERT_EQ(int(int8_t(q[size_t(h)])), int(r)) << "H " << H << " h " << h;
        ASSERT_EQ(y[size_t(h)], float_to_bf16(float(int(r)) * scale)) << "H " << H << " h " << h;
      }
    }
  }
}

TEST(XcclRowOps, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // halfway between 0x3f80 and 0x3f81: even
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // halfway between 0x3f81 and 0x3f82: even
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
}

// The combine row kernel against a plain double-precision sum (odd widths exercise the
// vector body and the scalar tail; 0 terms give zeros). Tolerance: f32 accumulation of n
// terms (n * 2^-23 of the magnitude sum) plus the final bf16 rounding (2^-8 of |sum|).
TEST(XcclRowOps, WeightedSumMatchesAPlainDoubleSum) {
  for (int hidden : {1, 15, 16, 37, 2048 + 5}) {
    for (int n : {0, 1, 3, 9}) {
      std::vector<std::vector<uint16_t>> rows(size_t(n), std::vector<uint16_t>(size_t(hidden), 0));
      std::vector<const uint16_t*> ptr;
      std::vector<float> w;
      for (int j = 0; j < n; ++j) {
        for (int h = 0; h < hidden; ++h)
          rows[size_t(j)][size_t(h)] = float_to_bf16(std::sin(float(h * 7 + j)) * float(j + 1));
        ptr.push_back(rows[size_t(j)].data());
        w.push_back(0.25f + 0.5f * float(j % 3));
      }
      std::vector<uint16_t> out(size_t(hidden), 0xFFFF);
      weighted_sum_bf16(ptr.data(), w.data(), n, hidden, out.data());
      for (int h = 0; h < hidden; ++h) {
        double ref = 0, mag = 0;
        for (int j = 0; j < n; ++j) {
          const double term = double(w[size_t(j)]) * bf16_to_float(rows[size_t(j)][size_t(h)]);
          ref += term;
          mag += std::fabs(term);
        }
        const double tol = std::fabs(ref) / 256.0 + mag * n * 1.2e-7 + 1e-30;
        ASSERT_NEAR(bf16_to_float(out[size_t(h)]), ref, tol)
            << "hidden " << hidden << " terms " << n << " column " << h;
      }
    }
  }
}

TEST(XcclExchangeLayout, RegionsFollowTheDrawnOrder) {
  MoeConfig c{.hidden = 100, .topk = 8, .max_tokens = 10, .slots_per_device = 4, .int8 = true};
  const ExchangeLayout l = exchange_layout(c, 3, 2, 4100);
  EXPECT_EQ(l.routes, 4160u);  // align64(4100)
  EXPECT_EQ(l.input, 6272u);   // align64(4160 + 2 receivers * 10 tokens * 104 B = 6240)
  EXPECT_EQ(l.qrows, 8320u);   // align64(6272 + 10 * 100 * 2 = 8272)
  EXPECT_EQ(l.presum, 9600u);  // 8320 + 10 * 128 (int8 row 100 + 4 = 104 B, stride 128)
  EXPECT_EQ(l.end, 15616u);    // align64(9600 + 3 senders * 10 * 200 = 15600)
  c.int8 = false;
  EXPECT_EQ(exchange_layout(c, 3, 2, 4100).presum, 8320u);  // no INT8 rows
}

TEST(XcclExchangeLayout, StagingIsSizedByRowAndVectorBytes) {
  MoeConfig c{.hidden = 100, .topk = 8, .max_tokens = 10, .slots_per_device = 4};
  c.row_dtype = RowDType::kF32;
  c.vector_dtype = RowDType::kF32;
  ExchangeLayout l = exchange_layout(c, 3, 2, 4100);
  EXPECT_EQ(l.routes, 4160u);
  EXPECT_EQ(l.input, 6272u);
  EXPECT_EQ(l.qrows, 10304u);   // align64(6272 + 10 tokens * 100 * 4 B = 10272)
  EXPECT_EQ(l.presum, 10304u);  // no INT8 rows
  EXPECT_EQ(l.end, 22336u);     // align64(10304 + 3 senders * 10 * 100 * 4 = 22304)
  c.vector_dtype = RowDType::kBf16;
  EXPECT_EQ(exchange_layout(c, 3, 2, 4100).end, 16320u);  // align64(10304 + 6000 = 16304)
  EXPECT_EQ(moe_staging_bytes(c, 2), exchange_layout(c, 2, 2, 0).end);
}

}  // namespace
}  // namespace xds::xccl
