// The fused int8 gate/up kernel (int8_gate_up) against the separate products: h must be
// silu(g) · u computed step by step from the outputs of int8_linear for gate and for up,
// bit for bit, on every path and thread count; close to a float64 SiLU; and its quantized
// h exactly what quantize_rows_int8 makes of the written h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "int8_reference.h"
#include "kernels/cpu/int8_linear.h"

namespace xds::kernels {
namespace {

struct GateUpCase {
  int64_t m, n, k;
};

// Scales large enough that g spans the SiLU's curve (|g| up to ~20).
Int8Rows scaled_rows(int64_t rows, int64_t cols, float scale, std::mt19937& rng) {
  Int8Rows r = random_int8_rows(rows, cols, rng, -127, 127);
  std::uniform_real_distribution<float> d(0.5f, 1.5f);
  for (auto& s : r.scale) s = scale * d(rng);
  return r;
}

TEST(Int8GateUp, FusedEqualsSeparateProductsThenSilu) {
  std::mt19937 rng(12);
  ThreadPool pool(2, ThreadPool::kNoSpin);
  const Int8IsaGuard guard;
  for (const GateUpCase& c :
       {GateUpCase{1, 33, 129}, GateUpCase{3, 64, 515}, GateUpCase{9, 100, 77},
        GateUpCase{17, 47, 1030}, GateUpCase{64, 96, 260},
        GateUpCase{130, 520, 64}}) {  // h quantized on the pool
    const Int8Rows x = scaled_rows(c.m, c.k, 0.02f, rng);
    const float ws = 4.0f / (127.0f * std::sqrt(static_cast<float>(c.k)));
    const Int8Rows gw = scaled_rows(c.n, c.k, ws, rng), uw = scaled_rows(c.n, c.k, ws, rng);
    const Int8Panels gate = Int8Panels::pack(gw.ref()), up = Int8Panels::pack(uw.ref());
    const Int8PanelsRef gr = gate.ref(), ur = up.ref();
    const std::vector<int64_t> gs = reference_sums(x, gw), us = reference_sums(x, uw);
    for (const Int8Isa isa : available_int8_isas()) {
      set_int8_isa(isa);
      const char* name = int8_isa_name(isa);
      std::vector<float> g(static_cast<size_t>(c.m * c.n)), u(g.size()), h(g.size()), h1(g.size());
      int8_linear(x.ref(), gr, {g.data(), nullptr, c.n}, pool);
      int8_linear(x.ref(), ur, {u.data(), nullptr, c.n}, pool);
      Int8Rows hq;
      hq.resize(c.m, c.n);
      const Int8RowsOut hq_out = hq.out();
      int8_gate_up(x.ref(), {&gr, &ur}, {h.data(), nullptr, c.n}, &hq_out, pool);
      int8_gate_up_on_thread(x.ref(), {&gr, &ur}, {h1.data(), nullptr, c.n}, nullptr);
      std::vector<uint16_t> hb(g.size());
      Int8Rows hbq;
      hbq.resize(c.m, c.n);
      const Int8RowsOut hbq_out = hbq.out();
      int8_gate_up(x.ref(), {&gr, &ur}, {nullptr, hb.data(), c.n}, &hbq_out, pool);
      for (int64_t i = 0; i < c.m * c.n; ++i) {
        const int64_t t = i / c.n, r = i % c.n;
        // The separate products are the epilogue of the exact sums (int8_linear_test)...
        ASSERT_EQ(g[i], reference_output(gs[i], gw.scale[r], x.scale[t])) << name << " " << i;
        ASSERT_EQ(u[i], reference_output(us[i], uw.scale[r], x.scale[t])) << name << " " << i;
        // ...and the fused h is SiLU's steps on them.
        const float want = reference_silu_mul(g[i], u[i]);
        ASSERT_EQ(std::bit_cast<uint32_t>(h[i]), std::bit_cast<uint32_t>(want))
            << name << " token " << t << " row " << r << ": " << h[i] << " vs " << want;
        ASSERT_EQ(std::bit_cast<uint32_t>(h1[i]), std::bit_cast<uint32_t>(want))
            << name << " " << i;
        ASSERT_EQ(hb[i], f32_to_bf16(want)) << name << " " << i;
        // The kernels' exp is within 2 ulp: h is within a few ulp of a float64 SiLU.
        const double gd = g[i], exact = gd / (1.0 + std::exp(-gd)) * u[i];
        ASSERT_LE(std::fabs(h[i] - exact), 1e-6 * std::fabs(exact) + 1e-30) << name << " " << i;
      }
      const Int8Rows want_q = quantize_int8(h.data(), c.m, c.n);
      EXPECT_EQ(hq.q, want_q.q) << name;
      EXPECT_EQ(hq.scale, want_q.scale) << name;
      const Int8Rows want_bq = quantize_int8(hb.data(), c.m, c.n);
      EXPECT_EQ(hbq.q, want_bq.q) << name;
      EXPECT_EQ(hbq.scale, want_bq.scale) << name;
    }
  }
}

}  // namespace
}  // namespace xds::kernels
