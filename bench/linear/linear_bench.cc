// bench_linear: the linear kernels at bench-2.6b's shapes and decode/prefill token counts,
// beside OpenBLAS sgemm on the same product, with the machine's limits measured in the same
// run. This is the measurement behind "own panel kernel, not sgemm" (linear.h).
//
// Per shape [rows, cols] and token count n, three ways to compute y[n, rows] = x · Wᵀ, all
// on --threads threads (default two):
//   panels  the loaded model's layout: BF16 panels (kPanels16), kernels::linear_f32
//   rows    BF16 row-major as published (XDS_WEIGHT_LAYOUT=rows): the row kernel, sgemm
//           from kSgemmMinTokens on (W widened inside the call, timed)
//   sgemm   OpenBLAS sgemm on fp32 weights widened beforehand (not timed; it reads 4 bytes
//           per weight where the others read 2)
//   dot     the fast mode's product: x rounded to bf16 (not timed), the same BF16 panels,
//           kernels::linear_bf16 (vdpbf16ps where the build has AVX512_BF16, else the
//           panels on x widened back to fp32); its roofline takes the faster of the fp32
//           and bf16 dot-product peaks
// Each timed call reads its own copy of W (cycling through enough copies to outgrow the
// caches), as a model's layers do. Printed after all rows: median ms of `--reps` calls,
// GFLOP/s, the panels' % of their roofline (max(BF16 bytes ÷ read bandwidth, FLOPs ÷ fp32
// peak), the limits measured before and after the rows, the faster of each), and
// the largest |panels - sgemm| relative to the largest |sgemm| (a check that both computed
// the same product; for dot, bf16 rounding of x puts it near 1e-3). Writes JSON and the
// printed table to bench-out/bench_linear.* (--json FILE elsewhere; --save also to
// bench/results/: run_output.h).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "json_out.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "counts.h"
#include "machine_limits.h"
#include "run_output.h"
#include "tensor/dtype.h"

namespace {

using namespace xds;

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// bench-2.6b (mkmodel --preset bench-2.6b): hidden 2048, 64 experts of width 512, 2 shared
// (width 1024), dense layer 6144, vocabulary 32000.
constexpr Shape kShapes[] = {{"expert gate/up", 512, 2048},  {"expert down", 2048, 512},
                             {"shared gate/up", 1024, 2048}, {"o_proj", 2048, 2048},
                             {"dense up", 6144, 2048},       {"lm_head", 32000, 2048}};

// Copies of W so that a call never finds the previous call's W in cache: at least 512 MB
// of BF16 in all (beyond the L3 of large server CPUs, up to ~300 MB), at least 2.
int copies_for(const Shape& s) {
  const double bytes = 2.0 * static_cast<double>(s.rows * s.cols);
  return std::max(2, static_cast<int>(std::ceil(512e6 / bytes)));
}

struct Timing {
  double panels_s, rows_s, sgemm_s, dot_s, max_rel_diff, dot_rel_diff;
};

Timing measure(const Shape& s, int64_t n, int reps, ThreadPool& pool, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1, 1);
  const int copies = copies_for(s);
  const MatrixRef shape{DType::kBF16, nullptr, s.rows, s.cols, MatrixLayout::kPanels16};
  const int64_t size = s.rows * s.cols, copy_elements = shape.bytes() / 2;
  std::vector<uint16_t> rows_bf16(static_cast<size_t>(size) * copies);
  for (auto& v : rows_bf16) v = f32_to_bf16(d(rng) * 0.05f);
  std::vector<uint16_t> panel_bf16(static_cast<size_t>(copy_elements) * copies);
  std::vector<float> rows_f32(static_cast<size_t>(size) * copies);
  for (int i = 0; i < copies; ++i) {
    kernels::pack_panels16(rows_bf16.data() + size * i, s.rows, s.cols, 0, shape.panels(),
                           panel_bf16.data() + copy_elements * i);
  }
  for (size_t i = 0; i < rows_f32.size(); ++i) rows_f32[i] = bf16_to_f32(rows_bf16[i]);
  std::vector<float> x(static_cast<size_t>(n * s.cols));
  for (auto& v : x) v = d(rng);
  std::vector<uint16_t> x_bf16(x.size());
  kernels::round_to_bf16(x.data(), static_cast<int64_t>(x.size()), x_bf16.data());
  std::vector<float> y_panels(static_cast<size_t>(n * s.rows)), y_rows(y_panels.size()),
      y_sgemm(y_panels.size()), y_dot(y_panels.size());

  // Our kernels alternated call by call; OpenBLAS apart, after them: its threads spin for a
  // while after a call and would take a core from whichever kernel ran next.
  std::vector<double> tp, tr, tb, td;
  for (int r = 0; r <= reps; ++r) {  // call 0 warms up, untimed
    const int c = r % copies;
    MatrixRef panel{DType::kBF16, panel_bf16.data() + copy_elements * c, s.rows, s.cols};
    panel.layout = MatrixLayout::kPanels16;
    const MatrixRef row{DType::kBF16, rows_bf16.data() + size * c, s.rows, s.cols};
    auto t0 = Clock::now();
    kernels::linear_f32(x.data(), n, s.cols, panel, y_panels.data(), s.rows, pool);
    const double a = seconds_since(t0);
    t0 = Clock::now();
    kernels::linear_f32(x.data(), n, s.cols, row, y_rows.data(), s.rows, pool);
    const double b = seconds_since(t0);
    // Half the copies away from this call's: neither the panels' call just made nor the
    // next one finds W in cache (copy c + 1 would warm the next panels' call).
    MatrixRef other = panel;
    other.data = panel_bf16.data() + copy_elements * ((c + copies / 2) % copies);
    t0 = Clock::now();
    kernels::linear_bf16(x_bf16.data(), n, s.cols, r == reps ? panel : other, y_dot.data(), s.rows,
                         pool);
    const double e = seconds_since(t0);
    if (r > 0) tp.push_back(a), tr.push_back(b), td.push_back(e);
  }
  // Two OpenBLAS threads for its own call, one again afterwards (the kernels' sgemm runs one
  // per pool thread; kernels::use_single_threaded_blas sets that only once per process).
  openblas_set_num_threads(2);
  for (int r = 0; r <= reps; ++r) {
    const int c = r % copies;
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                static_cast<int>(s.rows), static_cast<int>(s.cols), 1.0f, x.data(),
                static_cast<int>(s.cols), rows_f32.data() + size * c, static_cast<int>(s.cols),
                0.0f, y_sgemm.data(), static_cast<int>(s.rows));
    if (r > 0) tb.push_back(seconds_since(t0));
  }
  openblas_set_num_threads(1);
  // The last call of each used the same copy (c = reps % copies): same product.
  float max_ref = 0, max_diff = 0, max_dot_diff = 0;
  for (size_t i = 0; i < y_sgemm.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(y_sgemm[i]));
    max_diff = std::max(max_diff, std::fabs(y_panels[i] - y_sgemm[i]));
    max_dot_diff = std::max(max_dot_diff, std::fabs(y_dot[i] - y_sgemm[i]));
  }
  const auto relative = [&](float diff) { return max_ref > 0 ? diff / max_ref : diff; };
  return {bench::median(tp), bench::median(tr),  bench::median(tb),
          bench::median(td), relative(max_diff), relative(max_dot_diff)};
}

}  // namespace

int main(int argc, char** argv) {
  kernels::select_blas_core(argv);  // first: it may re-execute the program
  CLI::App app{"bench_linear: the linear kernels against OpenBLAS sgemm at bench-2.6b shapes"};
  std::string counts_arg = "1,4,16,64,512";
  bench::OutputOptions output;
  int reps = 7, threads = 2;
  bench::add_output_flags(app, output);
  app.add_option("--threads", threads,
                 "threads of every product and of the limits (1: one core's streaming rate, "
                 "the same in both of the VM's read modes)")
      ->check(CLI::Range(1, 64));
  app.add_option("--tokens", counts_arg, "token counts n, comma-separated");
  app.add_option("--reps", reps, "timed calls per row (median)")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  bench::RunOutput run_output;  // captures the printed table from here on
  std::vector<int64_t> counts;
  try {
    counts = bench::parse_counts(counts_arg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: --tokens %s: %s\n", counts_arg.c_str(), e.what());
    return 1;
  }

  ThreadPool pool(threads);
  struct Row {
    const Shape* shape;
    int64_t n;
    Timing t;
  };
  std::vector<Row> rows;
  // The limits before and after the rows, the faster of each (bench::faster_of): a roofline
  // built on them cannot be lowered by a minute when the machine was slow.
  const bench::MachineLimits before = bench::measure_machine_limits(pool);
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    for (const int64_t n : counts) {
      rows.push_back({&s, n, measure(s, n, reps, pool, rng)});
      std::fprintf(stderr, "\r%zu/%zu rows", rows.size(), std::size(kShapes) * counts.size());
    }
  }
  std::fprintf(stderr, "\n");
  const bench::MachineLimits lim = bench::faster_of(before, bench::measure_machine_limits(pool));
  std::printf(
      "machine: read %.1f GB/s, fp32 peak %.1f GFLOP/s (%s, %d threads; the faster of before "
      "and after the rows); OpenBLAS %s, panel kernel %s\n",
      lim.read_gbps, lim.f32_gflops, lim.f32_isa, pool.num_threads(),
      kernels::blas_core_name().c_str(), kernels::panel_isa_name(kernels::panel_isa()));
  std::printf("dot: %s, bf16 dot-product peak %.1f GFLOP/s\n",
              kernels::panels_dot_for({DType::kBF16, nullptr, 0, 0, MatrixLayout::kPanels16})
                  ? "vdpbf16ps panels"
                  : "panels on x widened to fp32",
              lim.bf16_gflops);
  std::printf("%-15s %5s | %9s %7s %6s | %9s %7s | %9s %7s | %8s | %8s %7s %6s %8s\n", "shape", "n",
              "panels ms", "GFLOP/s", "% roof", "rows ms", "GFLOP/s", "sgemm ms", "GFLOP/s",
              "rel diff", "dot ms", "GFLOP/s", "% roof", "rel diff");
  nlohmann::json j;
  j["threads"] = pool.num_threads();
  j["machine"] = {{"read_gbps", lim.read_gbps},
                  {"f32_gflops", lim.f32_gflops},
                  {"f32_isa", lim.f32_isa},
                  {"bf16_gflops", lim.bf16_gflops},
                  {"blas_core", kernels::blas_core_name()},
                  {"panel_isa", kernels::panel_isa_name(kernels::panel_isa())}};
  j["rows"] = nlohmann::json::array();
  for (const auto& [shape, n, t] : rows) {
    const Shape& s = *shape;
    const double flops = 2.0 * n * s.rows * s.cols, bytes = 2.0 * s.rows * s.cols;
    const double roof = std::max(bytes / (lim.read_gbps * 1e9), flops / (lim.f32_gflops * 1e9));
    const double dot_peak = std::max(lim.f32_gflops, lim.bf16_gflops);
    const double dot_roof = std::max(bytes / (lim.read_gbps * 1e9), flops / (dot_peak * 1e9));
    std::printf(
        "%-15s %5lld | %9.3f %7.1f %5.1f%% | %9.3f %7.1f | %9.3f %7.1f | %8.1e | %8.3f %7.1f "
        "%5.1f%% %8.1e\n",
        s.name, static_cast<long long>(n), t.panels_s * 1e3, flops / t.panels_s / 1e9,
        100.0 * roof / t.panels_s, t.rows_s * 1e3, flops / t.rows_s / 1e9, t.sgemm_s * 1e3,
        flops / t.sgemm_s / 1e9, t.max_rel_diff, t.dot_s * 1e3, flops / t.dot_s / 1e9,
        100.0 * dot_roof / t.dot_s, t.dot_rel_diff);
    j["rows"].push_back({{"shape", s.name},
                         {"rows", s.rows},
                         {"cols", s.cols},
                         {"n", n},
                         {"panels_ms", t.panels_s * 1e3},
                         {"rows_ms", t.rows_s * 1e3},
                         {"sgemm_ms", t.sgemm_s * 1e3},
                         {"panels_gflops", flops / t.panels_s / 1e9},
                         {"rows_gflops", flops / t.rows_s / 1e9},
                         {"sgemm_gflops", flops / t.sgemm_s / 1e9},
                         {"roofline_ms", roof * 1e3},
                         {"panels_pct_roofline", 100.0 * roof / t.panels_s},
                         {"max_rel_diff_panels_vs_sgemm", t.max_rel_diff},
                         {"dot_ms", t.dot_s * 1e3},
                         {"dot_gflops", flops / t.dot_s / 1e9},
                         {"dot_roofline_ms", dot_roof * 1e3},
                         {"dot_pct_roofline", 100.0 * dot_roof / t.dot_s},
                         {"max_rel_diff_dot_vs_sgemm", t.dot_rel_diff}});
  }
  return run_output.finish(output, "bench_linear", j) ? 0 : 1;
}
