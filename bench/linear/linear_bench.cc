// bench_linear: the linear kernel (bf16 weights, fp32 activations) at decode and prefill
// shapes, beside OpenBLAS sgemm on the same problem (weights widened to fp32 first, the
// widening timed separately), and the machine's limits measured in the same run.
// Prints a table and writes bench_linear.json.
#include <cblas.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "kernels/cpu/linear.h"
#include "machine_limits.h"

using namespace xds;

int main(int argc, char** argv) {
  ThreadPool pool(2);
  openblas_set_num_threads(2);
  const bench::MachineLimits lim = bench::measure_machine_limits(pool);
  struct Shape {
    int64_t n, rows, cols;
  };
  const Shape shapes[] = {
      {1, 6144, 2048}, {4, 6144, 2048}, {16, 6144, 2048}, {64, 6144, 2048}, {512, 6144, 2048}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  nlohmann::json j;
  j["machine"] = {
      {"read_gbps", lim.read_gbps}, {"f32_gflops", lim.f32_gflops}, {"f32_isa", lim.f32_isa}};
  std::printf("machine: read %.1f GB/s, fp32 peak %.1f GFLOP/s (%s)\n", lim.read_gbps,
              lim.f32_gflops, lim.f32_isa);
  std::printf("%5s %6s %6s | %10s %8s %8s | %10s %10s\n", "n", "rows", "cols", "ours ms", "GFLOP/s",
              "GB/s", "sgemm ms", "widen ms");
  for (const Shape& s : shapes) {
    // kCopies copies of W (400 MB at 6144 x 2048), one per timed call, so that every call
    // streams W from DRAM as the model's layers do, not from the last call's cache.
    constexpr int kCopies = 16;
    const size_t wsize = static_cast<size_t>(s.rows * s.cols);
    std::vector<uint16_t> wall(wsize * kCopies);
    for (auto& v : wall) v = f32_to_bf16(d(rng) * 0.05f);
    const std::span<const uint16_t> w(wall.data(), wsize);
    std::vector<float> x(static_cast<size_t>(s.n * s.cols)), y(static_cast<size_t>(s.n * s.rows));
    for (auto& v : x) v = d(rng);

    std::vector<double> ours, blas, widen;
    std::vector<float> wf(w.size());
    for (int r = 0; r < 16; ++r) {
      const MatrixRef m{DType::kBF16, wall.data() + wsize * (r % kCopies), s.rows, s.cols};
      auto t0 = Clock::now();
      kernels::linear_f32(x.data(), s.n, s.cols, m, y.data(), s.rows, pool);
      const double a = seconds_since(t0);
      t0 = Clock::now();
      pool.parallel_for(static_cast<int64_t>(w.size()), [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) wf[i] = bf16_to_f32(w[i]);
      });
      const double c = seconds_since(t0);
      t0 = Clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.n),
                  static_cast<int>(s.rows), static_cast<int>(s.cols), 1.0f, x.data(),
                  static_cast<int>(s.cols), wf.data(), static_cast<int>(s.cols), 0.0f, y.data(),
                  static_cast<int>(s.rows));
      const double b = seconds_since(t0);
      if (r > 0) ours.push_back(a), blas.push_back(b), widen.push_back(c);
    }
    const double t = bench::median(ours), tb = bench::median(blas), tw = bench::median(widen);
    const double flops = 2.0 * s.n * s.rows * s.cols, bytes = 2.0 * s.rows * s.cols;
    std::printf("%5lld %6lld %6lld | %10.3f %8.1f %8.1f | %10.3f %10.3f\n", (long long)s.n,
                (long long)s.rows, (long long)s.cols, t * 1e3, flops / t / 1e9, bytes / t / 1e9,
                tb * 1e3, tw * 1e3);
    j["rows"].push_back({{"n", s.n},
                         {"rows", s.rows},
                         {"cols", s.cols},
                         {"ours_ms", t * 1e3},
                         {"ours_gflops", flops / t / 1e9},
                         {"ours_weight_gbps", bytes / t / 1e9},
                         {"sgemm_ms", tb * 1e3},
                         {"widen_ms", tw * 1e3}});
  }
  std::ofstream(argc > 1 ? argv[1] : "bench_linear.json") << j.dump(2) << "\n";
  return 0;
}
