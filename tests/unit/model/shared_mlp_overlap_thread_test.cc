// SharedMlpOverlap: the shared MLP in slices, claimed by several threads, against a plain
// double-precision MLP and, bit for bit, against the same MLP run whole (linear_f32 on each
// matrix, then silu_mul). Also run under ThreadSanitizer (label 'tsan').
#include "model/shared_mlp_overlap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/ops.h"
#include "tensor/dtype.h"

namespace xds {
namespace {

// A BF16 (or F16) weight [rows, cols] with values in [-0.5, 0.5), row-major and as panels.
struct Weight {
  std::vector<uint16_t> rows_major, panels;
  MatrixRef ref;
  double at(int64_t r, int64_t c) const {
    const uint16_t v = rows_major[r * ref.cols + c];
    return ref.dtype == DType::kF16 ? f16_to_f32(v) : bf16_to_f32(v);
  }
};

Weight make_weight(int64_t rows, int64_t cols, std::mt19937& rng, DType dtype) {
  std::uniform_real_distribution<float> d(-0.5f, 0.5f);
  Weight w;
  w.rows_major.resize(static_cast<size_t>(rows * cols));
  for (auto& v : w.rows_major) v = dtype == DType::kF16 ? f32_to_f16(d(rng)) : f32_to_bf16(d(rng));
  w.ref = {dtype, nullptr, rows, cols, MatrixLayout::kPanels16};
  w.panels.resize(static_cast<size_t>(w.ref.bytes() / 2));
  kernels::pack_panels16(w.rows_major.data(), rows, cols, 0, w.ref.panels(), w.panels.data());
  w.ref.data = w.panels.data();
  return w;
}

struct Mlp {
  // D = 64, I = 40: the last panel of gate/up is partial (rows 32..39).
  static constexpr int64_t kD = 64, kI = 40;
  Weight gate, up, down;
  MlpWeights refs() const { return {gate.ref, up.ref, down.ref}; }
};

Mlp make_mlp(uint32_t seed, DType dtype = DType::kBF16) {
  std::mt19937 rng(seed);
  Mlp m;
  m.gate = make_weight(Mlp::kI, Mlp::kD, rng, dtype);
  m.up = make_weight(Mlp::kI, Mlp::kD, rng, dtype);
  m.down = make_weight(Mlp::kD, Mlp::kI, rng, dtype);
  return m;
}

// out = (silu(x Wgᵀ) ⊙ x Wuᵀ) Wdᵀ in double.
std::vector<double> reference(const Mlp& m, const std::vector<float>& x, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n * Mlp::kD), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> h(Mlp::kI);
    for (int64_t i = 0; i < Mlp::kI; ++i) {
      double g = 0.0, u = 0.0;
      for (int64_t c = 0; c < Mlp::kD; ++c) {
        g += m.gate.at(i, c) * x[t * Mlp::kD + c];
        u += m.up.at(i, c) * x[t * Mlp::kD + c];
      }
      h[i] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t r = 0; r < Mlp::kD; ++r)
      for (int64_t i = 0; i < Mlp::kI; ++i) out[t * Mlp::kD + r] += m.down.at(r, i) * h[i];
  }
  return out;
}

// The same MLP run whole, one matrix at a time.
std::vector<float> whole(const Mlp& m, const std::vector<float>& x, int64_t n) {
  ThreadPool pool(1);
  std::vector<float> g(static_cast<size_t>(n * Mlp::kI)), u(g.size()),
      out(static_cast<size_t>(n * Mlp::kD));
  kernels::linear_f32(x.data(), n, Mlp::kD, m.gate.ref, g.data(), Mlp::kI, pool);
  kernels::linear_f32(x.data(), n, Mlp::kD, m.up.ref, u.data(), Mlp::kI, pool);
  kernels::silu_mul(g.data(), u.data(), n * Mlp::kI, g.data());
  kernels::linear_f32(g.data(), n, Mlp::kI, m.down.ref, out.data(), Mlp::kD, pool);
  return out;
}

// Claims slices until every one is claimed, as LocalMoeExchange's threads do after their
// experts.
void drain(SharedMlpOverlap& work) {
  for (;;) {
    const OverlapWork::Slice r = work.run_slice();
    if (r == OverlapWork::Slice::kDone) return;
    if (r == OverlapWork::Slice::kNotReady) std::this_thread::yield();
  }
}

// drain on `threads` threads at once (this one and threads - 1 more).
void drain_on(SharedMlpOverlap& work, int threads) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back([&] { drain(work); });
  drain(work);
  for (auto& th : pool) th.join();
}

TEST(SharedMlpOverlap, SlicesOnManyThreadsEqualTheWholeMlpBitForBit) {
  const Mlp m = make_mlp(3);
  ASSERT_TRUE(SharedMlpOverlap::supported(m.refs()));
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const int64_t n : {1, 7, 16}) {
    std::vector<float> x(static_cast<size_t>(n * Mlp::kD));
    for (float& v : x) v = d(rng);
    const std::vector<double> ref = reference(m, x, n);
    const std::vector<float> plain = whole(m, x, n);
    for (const int threads : {1, 3}) {
      for (const double slice_flops : {1.0, SharedMlpOverlap::kSliceFlops}) {
        std::vector<float> gate(static_cast<size_t>(n * Mlp::kI)), up(gate.size());
        std::vector<float> out(static_cast<size_t>(n * Mlp::kD), -1.0f);
        const MlpWeights w = m.refs();
        SharedMlpOverlap work(w, x.data(), n, gate.data(), up.data(), out.data(), slice_flops);
        if (slice_flops == 1.0) {
          // The smallest slice is a pair of panels: gate 3 panels in 2 slices, up 2, down
          // 4 panels in 2.
          EXPECT_EQ(work.slices(), 2 + 2 + 2);
        } else {
          EXPECT_EQ(work.slices(), 3);  // one slice per matrix
        }
        drain_on(work, threads);
        for (int64_t i = 0; i < n * Mlp::kD; ++i) {
          ASSERT_EQ(std::memcmp(&out[i], &plain[i], sizeof(float)), 0)
              << "n=" << n << " threads=" << threads << " slice_flops=" << slice_flops
              << " i=" << i;
          ASSERT_NEAR(out[i], ref[i], 1e-4 * (1.0 + std::fabs(ref[i]))) << "n=" << n << " i=" << i;
        }
      }
    }
  }
}

// The fast mode's MLP run whole: x and h rounded to bf16, every matrix through linear_bf16.
std::vector<float> whole_bf16(const Mlp& m, const std::vector<float>& x, int64_t n) {
  ThreadPool pool(1);
  std::vector<uint16_t> xb(x.size()), hb(static_cast<size_t>(n * Mlp::kI));
  kernels::round_to_bf16(x.data(), n * Mlp::kD, xb.data());
  std::vector<float> g(static_cast<size_t>(n * Mlp::kI)), u(g.size()),
      out(static_cast<size_t>(n * Mlp::kD));
  kernels::linear_bf16(xb.data(), n, Mlp::kD, m.gate.ref, g.data(), Mlp::kI, pool);
  kernels::linear_bf16(xb.data(), n, Mlp::kD, m.up.ref, u.data(), Mlp::kI, pool);
  kernels::silu_mul(g.data(), u.data(), n * Mlp::kI, g.data());
  kernels::round_to_bf16(g.data(), n * Mlp::kI, hb.data());
  kernels::linear_bf16(hb.data(), n, Mlp::kI, m.down.ref, out.data(), Mlp::kD, pool);
  return out;
}

// With bf16 products the slices equal the fast mode's whole MLP bit for bit, and stay
// within bf16 rounding of the double reference (x and h rounded: ~2^-8 relative each):
// BF16 panels (the dot-product kernel where the build has it) and F16 panels (the fp32
// kernel on the widened bf16 values, as linear_bf16 runs them).
TEST(SharedMlpOverlap, Bf16SlicesEqualTheFastModesWholeMlpBitForBit) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
  SCOPED_TRACE(dtype_name(dtype));
  const Mlp m = make_mlp(7, dtype);
  ASSERT_TRUE(SharedMlpOverlap::supported(m.refs()));
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const int64_t n : {1, 7, 16}) {
    std::vector<float> x(static_cast<size_t>(n * Mlp::kD));
    for (float& v : x) v = d(rng);
    const std::vector<double> ref = reference(m, x, n);
    const std::vector<float> plain = whole_bf16(m, x, n);
    for (const int threads : {1, 3}) {
      std::vector<float> gate(static_cast<size_t>(n * Mlp::kI)), up(gate.size());
      std::vector<float> out(static_cast<size_t>(n * Mlp::kD), -1.0f);
      const MlpWeights w = m.refs();
      SharedMlpOverlap work(w, x.data(), n, gate.data(), up.data(), out.data(), 1.0, true);
      drain_on(work, threads);
      double scale = 0;
      for (const double v : ref) scale = std::max(scale, std::fabs(v));
      for (int64_t i = 0; i < n * Mlp::kD; ++i) {
        ASSERT_EQ(std::memcmp(&out[i], &plain[i], sizeof(float)), 0)
            << "n=" << n << " threads=" << threads << " i=" << i;
        ASSERT_NEAR(out[i], ref[i], 3e-2 * scale) << "n=" << n << " i=" << i;
      }
    }
  }
  }
}

// One thread alone never waits: the gate/up slices come first, then the down slices, then
// kDone, and kDone again after that.
TEST(SharedMlpOverlap, OneThreadRunsGateUpThenDownThenIsDone) {
  const Mlp m = make_mlp(5);
  const int64_t n = 4;
  std::vector<float> x(static_cast<size_t>(n * Mlp::kD), 0.25f),
      gate(static_cast<size_t>(n * Mlp::kI)), up(gate.size()),
      out(static_cast<size_t>(n * Mlp::kD));
  const MlpWeights w = m.refs();
  SharedMlpOverlap work(w, x.data(), n, gate.data(), up.data(), out.data(), 1.0);
  for (int64_t i = 0; i < work.slices(); ++i)
    ASSERT_EQ(work.run_slice(), OverlapWork::Slice::kRan) << i;
  EXPECT_EQ(work.run_slice(), OverlapWork::Slice::kDone);
  EXPECT_EQ(work.run_slice(), OverlapWork::Slice::kDone);
}

// Row-major or F32 weights cannot run in panel slices.
TEST(SharedMlpOverlap, OnlyPanelWeightsAreSupported) {
  Mlp m = make_mlp(6);
  MlpWeights w = m.refs();
  EXPECT_TRUE(SharedMlpOverlap::supported(w));
  w.down_proj.layout = MatrixLayout::kRows;
  EXPECT_FALSE(SharedMlpOverlap::supported(w));
}

}  // namespace
}  // namespace xds
