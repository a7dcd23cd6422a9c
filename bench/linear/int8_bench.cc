// bench_int8: the W8A8 kernels (kernels/cpu/int8_linear.h) at bench-2.6b's shapes and token
// counts, beside the BF16 panel kernels on the same product, with the machine's limits
// measured in the same run.
//
// Per shape [rows, cols] and token count m, y[m, rows] = x · Wᵀ on --threads threads:
//   int8    int8_linear_f32: fp32 x quantized per token inside the call, then the int8
//           kernel on the selected path (--int8-isa), fp32 y
//   int8q   int8_linear on x already quantized (the down projection takes the fused
//           gate/up's quantized h; the experts share one quantization of x per layer)
//   panels  the same weights as BF16 panels, kernels::linear_f32 (the reference mode)
//   dot     BF16 panels with bf16 x, kernels::linear_bf16 (the fast mode; vdpbf16ps)
// The row "expert gate+up" is the fused kernel: int8_gate_up (quantized x in, silu(g)·u
// out) against linear_f32_group / linear_bf16_group of gate and up (no SiLU: the bf16
// columns do less work than the int8 ones there).
//
// Each timed call reads its own copy of the weights (cycling through enough copies to
// outgrow the caches), the kernels alternated call by call. Printed after all rows: median
// ms of --reps calls; the weights' GB/s (int8: 1 byte a weight plus 8 bytes a row of scale
// and correction; bf16: 2 bytes a weight) and its share of the machine's read bandwidth
// (bench/common/machine_limits.h, measured before and after the rows, the faster); int8's
// % of its roofline, max(int8 bytes ÷ read bandwidth, 2 m·rows·cols ÷ the int8 peak of
// the selected path, measured here: inline-assembly loops, see int8_peak_gops); the
// speed-ups of the int8 column over panels and dot (time ratios; the fused row has no int8q
// column and prints 0 there); and the largest
// |int8 - panels| relative to the largest |panels| (quantization error, ~1e-2: a check
// that both computed the same product). Writes JSON and the table to bench-out/bench_int8.*
// (--json FILE elsewhere; --save also to bench/results/: run_output.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/bf16.h"
#include "base/clock.h"
#include "counts.h"
#include "int8_peak.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_panels.h"
#include "machine_limits.h"
#include "run_output.h"

namespace {

using namespace xds;

// 64-byte aligned storage for the int8 panels (the kernels' loads are aligned).
struct FreeBytes {
  void operator()(int8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<int8_t, FreeBytes>;
AlignedBytes aligned_bytes(int64_t n) {
  return AlignedBytes(
      static_cast<int8_t*>(std::aligned_alloc(64, static_cast<size_t>((n + 63) / 64 * 64))));
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  bool gate_up;  // two weights of [rows, cols]: the fused gate/up
};

// bench-2.6b (mkmodel --preset bench-2.6b): hidden 2048, 64 routed experts of width 512, 2
// shared (width 1024), dense layer 6144, q_lora 768, kv_lora 512 + rope 64, 16 heads of
// 128 + 64 (q) and 128 + 128 (kv_b).
constexpr Shape kShapes[] = {
    {"expert gate+up", 512, 2048, true}, {"expert gate/up", 512, 2048, false},
    {"expert down", 2048, 512, false},   {"shared gate/up", 1024, 2048, false},
    {"shared down", 2048, 1024, false},  {"q_a", 768, 2048, false},
    {"kv_a", 576, 2048, false},          {"q_b", 3072, 768, false},
    {"kv_b", 4096, 512, false},          {"o_proj", 2048, 2048, false},
    {"dense up", 6144, 2048, false},     {"dense down", 2048, 6144, false}};

// One weight [rows, cols] in both formats, `copies` times: int8 panels and BF16 panels of
// the same values (the int8 ones quantized per row from the BF16 ones), each packed once
// and copied.
struct WeightCopies {
  AlignedBytes int8;                // [copies][int8 panel bytes]
  std::vector<float> scale;         // [stored rows] (shared by the copies)
  std::vector<int32_t> correction;  // [stored rows]
  std::vector<uint16_t> bf16;       // [copies][bf16 panel elements]
  int64_t rows = 0, cols = 0, int8_bytes = 0, bf16_elements = 0;

  kernels::Int8PanelsRef int8_ref(int c) const {
    return {int8.get() + int8_bytes * c, scale.data(), correction.data(), rows, cols};
  }
  MatrixRef bf16_ref(int c) const {
    return {DType::kBF16, bf16.data() + bf16_elements * c, rows, cols, MatrixLayout::kPanels16};
  }
};

WeightCopies make_weights(int64_t rows, int64_t cols, int copies, std::mt19937& rng) {
  WeightCopies w;
  w.rows = rows, w.cols = cols;
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<uint16_t> rows_bf16(static_cast<size_t>(rows * cols));
  for (auto& v : rows_bf16) v = f32_to_bf16(d(rng) * 0.05f);
  const MatrixRef shape{DType::kBF16, nullptr, rows, cols, MatrixLayout::kPanels16};
  w.bf16_elements = shape.bytes() / 2;
  w.bf16.resize(static_cast<size_t>(w.bf16_elements * copies));
  kernels::pack_panels16(rows_bf16.data(), rows, cols, 0, shape.panels(), w.bf16.data());
  const kernels::Int8Rows q = kernels::quantize_int8(rows_bf16.data(), rows, cols);
  const kernels::Int8PanelsRef shape8{nullptr, nullptr, nullptr, rows, cols};
  w.int8_bytes = shape8.data_bytes();
  w.int8 = aligned_bytes(std::max<int64_t>(1, w.int8_bytes * copies));
  w.scale.resize(static_cast<size_t>(shape8.stored_rows()));
  w.correction.resize(w.scale.size());
  kernels::pack_int8_panels(q.ref(), 0, shape8.pairs(),
                            {w.int8.get(), w.scale.data(), w.correction.data()});
  for (int c = 1; c < copies; ++c) {
    std::memcpy(w.bf16.data() + w.bf16_elements * c, w.bf16.data(),
                static_cast<size_t>(w.bf16_elements) * 2);
    std::memcpy(w.int8.get() + w.int8_bytes * c, w.int8.get(), static_cast<size_t>(w.int8_bytes));
  }
  return w;
}

int64_t int8_bytes(const kernels::Int8PanelsRef& w) {
  return w.data_bytes() + w.stored_rows() * 8;
}

struct Timing {
  double int8_s = 0, int8q_s = 0, panels_s = 0, dot_s = 0, rel_diff = 0;
};

Timing measure(const Shape& s, int64_t m, int reps, int64_t copy_bytes, ThreadPool& pool,
               std::mt19937& rng) {
  const int nw = s.gate_up ? 2 : 1;
  const int64_t one = s.rows * s.cols * nw;  // int8 bytes of one copy (about)
  const int copies = std::max(2, static_cast<int>((copy_bytes + one - 1) / one));
  std::vector<WeightCopies> w;
  for (int i = 0; i < nw; ++i) w.push_back(make_weights(s.rows, s.cols, copies, rng));
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> x(static_cast<size_t>(m * s.cols));
  for (auto& v : x) v = d(rng);
  std::vector<uint16_t> x_bf16(x.size());
  kernels::round_to_bf16(x.data(), static_cast<int64_t>(x.size()), x_bf16.data());
  const kernels::Int8Rows xq = kernels::quantize_int8(x.data(), m, s.cols);
  const size_t ny = static_cast<size_t>(m * s.rows);
  std::vector<float> y_int8(ny), y_int8q(ny), y_panels(ny), y_dot(ny), y_up(ny), y_up2(ny);

  std::vector<double> ta, tq, tp, td;
  for (int r = 0; r <= reps; ++r) {  // call 0 warms up, untimed
    const int c = r % copies, c2 = (c + copies / 2) % copies;
    const kernels::Int8Output o8{y_int8.data(), nullptr, s.rows};
    const kernels::Int8Output o8q{y_int8q.data(), nullptr, s.rows};
    auto t0 = Clock::now();
    if (s.gate_up) {
      const kernels::Int8PanelsRef g = w[0].int8_ref(c), u = w[1].int8_ref(c);
      kernels::int8_gate_up(xq.ref(), {&g, &u}, o8, nullptr, pool);
    } else {
      kernels::int8_linear_f32(x.data(), m, s.cols, w[0].int8_ref(c), o8, pool);
    }
    const double a = seconds_since(t0);
    t0 = Clock::now();
    if (!s.gate_up) kernels::int8_linear(xq.ref(), w[0].int8_ref(c2), o8q, pool);
    const double b = seconds_since(t0);
    t0 = Clock::now();
    if (s.gate_up) {
      const MatrixRef g = w[0].bf16_ref(c), u = w[1].bf16_ref(c);
      const kernels::LinearOutput outs[] = {{&g, y_panels.data(), s.rows},
                                            {&u, y_up.data(), s.rows}};
      kernels::linear_f32_group(x.data(), m, s.cols, outs, pool);
    } else {
      kernels::linear_f32(x.data(), m, s.cols, w[0].bf16_ref(c), y_panels.data(), s.rows, pool);
    }
    const double e = seconds_since(t0);
    t0 = Clock::now();
    if (s.gate_up) {
      const MatrixRef g = w[0].bf16_ref(c2), u = w[1].bf16_ref(c2);
      const kernels::LinearOutput outs[] = {{&g, y_dot.data(), s.rows}, {&u, y_up2.data(), s.rows}};
      kernels::linear_bf16_group(x_bf16.data(), m, s.cols, outs, pool);
    } else {
      kernels::linear_bf16(x_bf16.data(), m, s.cols, w[0].bf16_ref(c2), y_dot.data(), s.rows, pool);
    }
    const double f = seconds_since(t0);
    if (r > 0) ta.push_back(a), tq.push_back(b), tp.push_back(e), td.push_back(f);
  }
  Timing t;
  t.int8_s = bench::median(ta);
  t.int8q_s = s.gate_up ? 0 : bench::median(tq);
  t.panels_s = bench::median(tp);
  t.dot_s = bench::median(td);
  // int8 against the panels' product (for gate+up, silu(g)·u from the panels' g and u).
  if (s.gate_up) {
    for (size_t i = 0; i < ny; ++i) {
      const float g = y_panels[i];
      y_panels[i] = g / (1.0f + std::exp(-g)) * y_up[i];
    }
  }
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ny; ++i) {
    max_ref = std::max(max_ref, std::fabs(y_panels[i]));
    max_diff = std::max(max_diff, std::fabs(y_int8[i] - y_panels[i]));
  }
  t.rel_diff = max_ref > 0 ? max_diff / max_ref : max_diff;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  kernels::select_blas_core(argv);  // first: it may re-execute the program
  CLI::App app{"bench_int8: the W8A8 kernels beside the BF16 panels at bench-2.6b shapes"};
  std::string counts_arg = "1,4,16,64,512", isa_arg, shapes_arg;
  bench::OutputOptions output;
  int reps = 7, threads = 2, copy_mb = 256;
  bench::add_output_flags(app, output);
  app.add_option("--threads", threads, "threads of every product and of the limits")
      ->check(CLI::Range(1, 64));
  app.add_option("--tokens", counts_arg, "token counts m, comma-separated");
  app.add_option("--reps", reps, "timed calls per row (median)")->check(CLI::Range(1, 100));
  app.add_option("--copy-mb", copy_mb,
                 "int8 MB of weight copies per shape (BF16: twice), to outgrow the caches")
      ->check(CLI::Range(1, 4096));
  app.add_option("--int8-isa", isa_arg, "force the int8 path: avx512_vnni, avx2 or scalar");
  app.add_option("--shapes", shapes_arg,
                 "only these shapes, comma-separated names as printed (default: all)");
  CLI11_PARSE(app, argc, argv);
  bench::RunOutput run_output;  // captures the printed table from here on
  std::vector<int64_t> counts;
  try {
    counts = bench::parse_counts(counts_arg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: --tokens %s: %s\n", counts_arg.c_str(), e.what());
    return 1;
  }
  if (!isa_arg.empty()) {
    bool found = false;
    for (const auto isa :
         {kernels::Int8Isa::kAvx512Vnni, kernels::Int8Isa::kAvx2, kernels::Int8Isa::kScalar}) {
      if (isa_arg != kernels::int8_isa_name(isa)) continue;
      if (!kernels::int8_isa_available(isa)) {
        std::fprintf(stderr, "error: --int8-isa %s: not available here\n", isa_arg.c_str());
        return 1;
      }
      kernels::set_int8_isa(isa);
      found = true;
    }
    if (!found) {
      std::fprintf(stderr, "error: --int8-isa %s: expected avx512_vnni, avx2 or scalar\n",
                   isa_arg.c_str());
      return 1;
    }
  }

  ThreadPool pool(threads);
  struct Row {
    const Shape* shape;
    int64_t m;
    Timing t;
  };
  std::vector<Row> rows;
  const bench::MachineLimits before = bench::measure_machine_limits(pool);
  const double peak_before = bench::int8_peak_gops(pool, kernels::int8_isa());
  std::vector<const Shape*> shapes;
  for (const Shape& s : kShapes)
    if (shapes_arg.empty() ||
        ("," + shapes_arg + ",").find("," + std::string(s.name) + ",") != std::string::npos)
      shapes.push_back(&s);
  if (shapes.empty()) {
    std::fprintf(stderr, "error: --shapes %s: no such shape\n", shapes_arg.c_str());
    return 1;
  }
  std::mt19937 rng(1);
  for (const Shape* s : shapes) {
    for (const int64_t m : counts) {
      rows.push_back({s, m, measure(*s, m, reps, int64_t{copy_mb} << 20, pool, rng)});
      std::fprintf(stderr, "\r%zu/%zu rows", rows.size(), shapes.size() * counts.size());
    }
  }
  std::fprintf(stderr, "\n");
  const bench::MachineLimits lim = bench::faster_of(before, bench::measure_machine_limits(pool));
  const double peak = std::max(peak_before, bench::int8_peak_gops(pool, kernels::int8_isa()));
  const char* isa = kernels::int8_isa_name(kernels::int8_isa());
  std::printf(
      "machine: read %.1f GB/s, int8 peak %.1f GOP/s (%s), fp32 peak %.1f, bf16 dot peak %.1f "
      "GFLOP/s (%d threads; the faster of before and after the rows); panel kernel %s\n",
      lim.read_gbps, peak, isa, lim.f32_gflops, lim.bf16_gflops, pool.num_threads(),
      kernels::panel_isa_name(kernels::panel_isa()));
  std::printf("%-15s %4s | %8s %6s %5s %7s %6s | %8s %6s | %8s %6s | %8s %6s | %6s %6s | %7s\n",
              "shape", "m", "int8 ms", "GB/s", "%bw", "GOP/s", "%roof", "int8q ms", "GB/s",
              "panel ms", "GB/s", "dot ms", "GB/s", "x pan", "x dot", "rel dif");
  nlohmann::json j;
  j["threads"] = pool.num_threads();
  j["int8_isa"] = isa;
  j["machine"] = {{"read_gbps", lim.read_gbps},
                  {"int8_peak_gops", peak},
                  {"f32_gflops", lim.f32_gflops},
                  {"bf16_gflops", lim.bf16_gflops},
                  {"panel_isa", kernels::panel_isa_name(kernels::panel_isa())}};
  j["rows"] = nlohmann::json::array();
  for (const auto& [shape, m, t] : rows) {
    const Shape& s = *shape;
    const int nw = s.gate_up ? 2 : 1;
    const kernels::Int8PanelsRef shape8{nullptr, nullptr, nullptr, s.rows, s.cols};
    const MatrixRef shape16{DType::kBF16, nullptr, s.rows, s.cols, MatrixLayout::kPanels16};
    const double b8 = static_cast<double>(nw * int8_bytes(shape8));
    const double b16 = static_cast<double>(nw * shape16.bytes());
    const double ops = 2.0 * nw * static_cast<double>(m * s.rows * s.cols);
    const double roof = std::max(b8 / (lim.read_gbps * 1e9), ops / (peak * 1e9));
    const auto gbps = [](double bytes, double sec) { return sec > 0 ? bytes / sec / 1e9 : 0.0; };
    std::printf(
        "%-15s %4lld | %8.3f %6.1f %4.0f%% %7.1f %5.0f%% | %8.3f %6.1f | %8.3f %6.1f | %8.3f "
        "%6.1f | %6.2f %6.2f | %7.1e\n",
        s.name, static_cast<long long>(m), t.int8_s * 1e3, gbps(b8, t.int8_s),
        100.0 * gbps(b8, t.int8_s) / lim.read_gbps, ops / t.int8_s / 1e9, 100.0 * roof / t.int8_s,
        t.int8q_s * 1e3, gbps(b8, t.int8q_s), t.panels_s * 1e3, gbps(b16, t.panels_s),
        t.dot_s * 1e3, gbps(b16, t.dot_s), t.panels_s / t.int8_s, t.dot_s / t.int8_s, t.rel_diff);
    j["rows"].push_back({{"shape", s.name},
                         {"rows", s.rows},
                         {"cols", s.cols},
                         {"weights", nw},
                         {"m", m},
                         {"int8_ms", t.int8_s * 1e3},
                         {"int8_gbps", gbps(b8, t.int8_s)},
                         {"int8_pct_read_bw", 100.0 * gbps(b8, t.int8_s) / lim.read_gbps},
                         {"int8_gops", ops / t.int8_s / 1e9},
                         {"int8_roofline_ms", roof * 1e3},
                         {"int8_pct_roofline", 100.0 * roof / t.int8_s},
                         {"int8_quantized_ms", t.int8q_s * 1e3},
                         {"int8_quantized_gbps", gbps(b8, t.int8q_s)},
                         {"panels_ms", t.panels_s * 1e3},
                         {"panels_gbps", gbps(b16, t.panels_s)},
                         {"dot_ms", t.dot_s * 1e3},
                         {"dot_gbps", gbps(b16, t.dot_s)},
                         {"speedup_vs_panels", t.panels_s / t.int8_s},
                         {"speedup_vs_dot", t.dot_s / t.int8_s},
                         {"max_rel_diff_int8_vs_panels", t.rel_diff}});
  }
  return run_output.finish(output, "bench_int8", j) ? 0 : 1;
}
