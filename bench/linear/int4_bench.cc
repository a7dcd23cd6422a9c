// bench_int4: the 4-bit weight kernels (kernels/cpu/int4_linear.h) beside the W8A8 ones
// (int8_linear.h) at DeepSeek-V3-sized shapes, with the machine's read bandwidth measured in
// the same run. Decode reads every weight byte once per call, so GB/s of weight bytes
// against the read bandwidth is the figure of merit at small m.
//
// Per shape [rows, cols] and token count m, y[m, rows] = x · Wᵀ on --threads threads, fp32 y:
//   w4a8   int4_linear on x already quantized per token (int8), int4 weights in groups of
//          --group columns (symmetric, or --asym with zero points), on --int4-isa's path
//   w4a16  int4_linear_f32 on fp32 x, the same weights
//   w8a8   int8_linear on the same quantized x, int8 weights (per-row scales)
// Each timed call reads its own copy of the weights (cycling through enough copies to
// outgrow the caches), the kernels alternated call by call. Printed after all rows: median
// ms of --reps calls; GB/s of the weight bytes each reads (int4: k/2 bytes a row plus 4
// bytes of scale and 1 of zero point a group; int8: k bytes plus 8 a row) and its share of
// the machine's read bandwidth (bench/common/machine_limits.h, the faster of before and
// after the rows); w4a8's speed-up over w8a8 (time ratio); and the largest |w4a8 - w4a16|
// relative to the largest |w4a16| (x's int8 quantization, ~1e-2: a check that both
// computed the same product). Writes JSON and the table to bench-out/bench_int4.* (--json
// FILE elsewhere; --save also to bench/results/: run_output.h).
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

#include "base/clock.h"
#include "counts.h"
#include "kernels/cpu/int4_linear.h"
#include "kernels/cpu/int8_linear.h"
#include "machine_limits.h"
#include "run_output.h"

namespace {

using namespace xds;

// 64-byte aligned storage for the packed weights (the kernels' loads are aligned).
struct FreeBytes {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using Aligned = std::unique_ptr<T, FreeBytes>;
template <class T>
Aligned<T> aligned(int64_t bytes) {
  return Aligned<T>(
      static_cast<T*>(std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64))));
}

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// DeepSeek-V3: hidden 7168, routed experts of width 2048, dense layers of width 18432.
constexpr Shape kShapes[] = {
    {"expert gate/up", 2048, 7168}, {"expert down", 7168, 2048}, {"dense down", 7168, 18432}};

// A fast generator for the weights' values (mt19937 takes seconds at 130M values).
struct XorShift {
  uint64_t s;
  uint32_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return static_cast<uint32_t>(s >> 32);
  }
};

// One weight [rows, cols] in both formats, `copies` times each (packed once, then copied).
struct WeightCopies {
  Aligned<uint8_t> int4;       // [copies][int4 data bytes]
  std::vector<float> scale4;   // [pairs][groups][32] (shared by the copies)
  std::vector<uint8_t> zero4;  // the same, or empty: symmetric
  Aligned<int8_t> int8;        // [copies][int8 data bytes]
  std::vector<float> scale8;   // [stored rows]
  std::vector<int32_t> corr8;  // [stored rows]
  int64_t rows = 0, cols = 0, group = 0, int4_bytes = 0, int8_bytes = 0;
  int copies4 = 0, copies8 = 0;

  kernels::Int4PanelsRef int4_ref(int c) const {
    return {int4.get() + int4_bytes * (c % copies4),
            scale4.data(),
            zero4.empty() ? nullptr : zero4.data(),
            rows,
            cols,
            group};
  }
  kernels::Int8PanelsRef int8_ref(int c) const {
    return {int8.get() + int8_bytes * (c % copies8), scale8.data(), corr8.data(), rows, cols};
  }
};

WeightCopies make_weights(const Shape& s, int64_t group, bool asym, int64_t copy_bytes,
                          uint64_t seed) {
  WeightCopies w;
  w.rows = s.rows, w.cols = s.cols, w.group = group;
  XorShift rng{seed};
  const int64_t groups = s.cols / group;
  std::vector<uint8_t> q(static_cast<size_t>(s.rows * s.cols));
  for (auto& v : q) v = static_cast<uint8_t>(rng.next() & 15);
  std::vector<float> scale(static_cast<size_t>(s.rows * groups));
  for (auto& v : scale) v = 1e-3f * static_cast<float>(1 + (rng.next() & 255));
  std::vector<uint8_t> zero;
  if (asym) {
    zero.resize(scale.size());
    for (auto& v : zero) v = static_cast<uint8_t>(rng.next() & 15);
  }
  const kernels::Int4Source src{q.data(), scale.data(), asym ? zero.data() : nullptr,
                                s.rows,   s.cols,       group};
  const kernels::Int4PanelsRef shape4{nullptr, nullptr, nullptr, s.rows, s.cols, group};
  w.int4_bytes = shape4.data_bytes();
  w.copies4 = std::max<int>(2, static_cast<int>(copy_bytes / w.int4_bytes + 1));
  w.int4 = aligned<uint8_t>(w.int4_bytes * w.copies4);
  w.scale4.resize(static_cast<size_t>(shape4.scale_count()));
  if (asym) w.zero4.resize(w.scale4.size());
  kernels::pack_int4_panels(src, 0, shape4.pairs(),
                            {w.int4.get(), w.scale4.data(), asym ? w.zero4.data() : nullptr});
  // int8 weights of the same q (centered: q - 8), per-row scales.
  kernels::Int8Rows q8;
  q8.resize(s.rows, s.cols);
  for (size_t i = 0; i < q.size(); ++i) q8.q[i] = static_cast<int8_t>((q[i] - 8) * 15);
  for (int64_t r = 0; r < s.rows; ++r) q8.scale[r] = scale[r * groups] / 15;
  const kernels::Int8PanelsRef shape8{nullptr, nullptr, nullptr, s.rows, s.cols};
  w.int8_bytes = shape8.data_bytes();
  w.copies8 = std::max<int>(2, static_cast<int>(copy_bytes / w.int8_bytes + 1));
  w.int8 = aligned<int8_t>(w.int8_bytes * w.copies8);
  w.scale8.resize(static_cast<size_t>(shape8.stored_rows()));
  w.corr8.resize(w.scale8.size());
  kernels::pack_int8_panels(q8.ref(), 0, shape8.pairs(),
                            {w.int8.get(), w.scale8.data(), w.corr8.data()});
  for (int c = 1; c < w.copies4; ++c)
    std::memcpy(w.int4.get() + w.int4_bytes * c, w.int4.get(), static_cast<size_t>(w.int4_bytes));
  for (int c = 1; c < w.copies8; ++c)
    std::memcpy(w.int8.get() + w.int8_bytes * c, w.int8.get(), static_cast<size_t>(w.int8_bytes));
  return w;
}

struct Timing {
  double w4a8_s = 0, w4a16_s = 0, w8a8_s = 0, rel_diff = 0;
  int64_t int4_bytes = 0, int8_bytes = 0;  // weight bytes one call reads
};

Timing measure(const WeightCopies& w, int64_t m, int reps, ThreadPool& pool, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> x(static_cast<size_t>(m * w.cols));
  for (auto& v : x) v = d(rng);
  const kernels::Int8Rows xq = kernels::quantize_int8(x.data(), m, w.cols);
  const size_t ny = static_cast<size_t>(m * w.rows);
  std::vector<float> y48(ny), y416(ny), y88(ny);
  std::vector<double> t48, t416, t88;
  for (int r = 0; r <= reps; ++r) {  // call 0 warms up, untimed
    auto t0 = Clock::now();
    kernels::int4_linear(xq.ref(), w.int4_ref(r), {y48.data(), nullptr, w.rows}, pool);
    const double a = seconds_since(t0);
    t0 = Clock::now();
    kernels::int4_linear_f32(x.data(), m, w.cols, w.int4_ref(r + w.copies4 / 2),
                             {y416.data(), nullptr, w.rows}, pool);
    const double b = seconds_since(t0);
    t0 = Clock::now();
    kernels::int8_linear(xq.ref(), w.int8_ref(r), {y88.data(), nullptr, w.rows}, pool);
    const double c = seconds_since(t0);
    if (r > 0) t48.push_back(a), t416.push_back(b), t88.push_back(c);
  }
  Timing t;
  t.w4a8_s = bench::median(t48);
  t.w4a16_s = bench::median(t416);
  t.w8a8_s = bench::median(t88);
  t.int4_bytes = w.int4_ref(0).bytes_read();
  const kernels::Int8PanelsRef r8 = w.int8_ref(0);
  t.int8_bytes = r8.data_bytes() + r8.stored_rows() * 8;
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ny; ++i) {
    max_ref = std::max(max_ref, std::fabs(y416[i]));
    max_diff = std::max(max_diff, std::fabs(y48[i] - y416[i]));
  }
  t.rel_diff = max_ref > 0 ? max_diff / max_ref : max_diff;
  return t;
}

bool select_int4_isa(const std::string& name) {
  for (const auto isa :
       {kernels::Int4Isa::kAvx512Vnni, kernels::Int4Isa::kAvx2, kernels::Int4Isa::kScalar}) {
    if (name != kernels::int4_isa_name(isa)) continue;
    if (!kernels::int4_isa_available(isa)) {
      std::fprintf(stderr, "error: --int4-isa %s: not available here\n", name.c_str());
      return false;
    }
    kernels::set_int4_isa(isa);
    return true;
  }
  std::fprintf(stderr, "error: --int4-isa %s: expected avx512_vnni, avx2 or scalar\n",
               name.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_int4: the int4 kernels (W4A8, W4A16) beside W8A8 at DeepSeek-V3 shapes"};
  std::string counts_arg = "1,4,16", isa_arg, shapes_arg;
  bench::OutputOptions output;
  int reps = 9, threads = 2, copy_mb = 256, group = 128;
  bool asym = false;
  bench::add_output_flags(app, output);
  app.add_option("--threads", threads, "threads of every product and of the limits")
      ->check(CLI::Range(1, 64));
  app.add_option("--tokens", counts_arg, "token counts m, comma-separated");
  app.add_option("--reps", reps, "timed calls per row (median)")->check(CLI::Range(1, 100));
  app.add_option("--copy-mb", copy_mb, "MB of weight copies per format, to outgrow the caches")
      ->check(CLI::Range(1, 4096));
  app.add_option("--group", group, "int4 group width G: 32, 64 or 128");
  app.add_flag("--asym", asym, "int4 weights with zero points (default symmetric)");
  app.add_option("--int4-isa", isa_arg, "force the int4 path: avx512_vnni, avx2 or scalar");
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
  if (!kernels::int4_group_cols_supported(group)) {
    std::fprintf(stderr, "error: --group %d: expected 32, 64 or 128\n", group);
    return 1;
  }
  if (!isa_arg.empty() && !select_int4_isa(isa_arg)) return 1;
  std::vector<const Shape*> shapes;
  for (const Shape& s : kShapes)
    if (shapes_arg.empty() ||
        ("," + shapes_arg + ",").find("," + std::string(s.name) + ",") != std::string::npos)
      shapes.push_back(&s);
  if (shapes.empty()) {
    std::fprintf(stderr, "error: --shapes %s: no such shape\n", shapes_arg.c_str());
    return 1;
  }

  ThreadPool pool(threads);
  struct Row {
    const Shape* shape;
    int64_t m;
    Timing t;
  };
  std::vector<Row> rows;
  const bench::MachineLimits before = bench::measure_machine_limits(pool);
  std::mt19937 rng(1);
  for (const Shape* s : shapes) {
    const WeightCopies w = make_weights(*s, group, asym, int64_t{copy_mb} << 20, rng());
    for (const int64_t m : counts) {
      rows.push_back({s, m, measure(w, m, reps, pool, rng)});
      std::fprintf(stderr, "\r%zu/%zu rows", rows.size(), shapes.size() * counts.size());
    }
  }
  std::fprintf(stderr, "\n");
  const bench::MachineLimits lim = bench::faster_of(before, bench::measure_machine_limits(pool));
  const char* isa4 = kernels::int4_isa_name(kernels::int4_isa());
  const char* isa8 = kernels::int8_isa_name(kernels::int8_isa());
  std::printf(
      "machine: read %.1f GB/s (%d threads; the faster of before and after the rows); int4 %s, "
      "G = %d, %s; int8 %s\n",
      lim.read_gbps, pool.num_threads(), isa4, group, asym ? "asymmetric" : "symmetric", isa8);
  std::printf("%-15s %4s | %8s %6s %5s | %8s %6s %5s | %8s %6s %5s | %6s | %7s\n", "shape", "m",
              "w4a8 ms", "GB/s", "%bw", "w4a16 ms", "GB/s", "%bw", "w8a8 ms", "GB/s", "%bw",
              "x w8a8", "rel dif");
  nlohmann::json j;
  j["threads"] = pool.num_threads();
  j["int4_isa"] = isa4;
  j["int8_isa"] = isa8;
  j["group_cols"] = group;
  j["asymmetric"] = asym;
  j["machine"] = {{"read_gbps", lim.read_gbps},
                  {"read_plain_gbps", lim.read_plain_gbps},
                  {"read_prefetch_gbps", lim.read_prefetch_gbps}};
  j["rows"] = nlohmann::json::array();
  for (const auto& [shape, m, t] : rows) {
    const auto gbps = [](int64_t bytes, double sec) {
      return sec > 0 ? static_cast<double>(bytes) / sec / 1e9 : 0.0;
    };
    const double g48 = gbps(t.int4_bytes, t.w4a8_s), g416 = gbps(t.int4_bytes, t.w4a16_s);
    const double g88 = gbps(t.int8_bytes, t.w8a8_s);
    std::printf(
        "%-15s %4lld | %8.3f %6.1f %4.0f%% | %8.3f %6.1f %4.0f%% | %8.3f %6.1f %4.0f%% | %6.2f | "
        "%7.1e\n",
        shape->name, static_cast<long long>(m), t.w4a8_s * 1e3, g48, 100 * g48 / lim.read_gbps,
        t.w4a16_s * 1e3, g416, 100 * g416 / lim.read_gbps, t.w8a8_s * 1e3, g88,
        100 * g88 / lim.read_gbps, t.w8a8_s / t.w4a8_s, t.rel_diff);
    j["rows"].push_back({{"shape", shape->name},
                         {"rows", shape->rows},
                         {"cols", shape->cols},
                         {"m", m},
                         {"int4_weight_bytes", t.int4_bytes},
                         {"int8_weight_bytes", t.int8_bytes},
                         {"w4a8_ms", t.w4a8_s * 1e3},
                         {"w4a8_gbps", g48},
                         {"w4a8_pct_read_bw", 100 * g48 / lim.read_gbps},
                         {"w4a16_ms", t.w4a16_s * 1e3},
                         {"w4a16_gbps", g416},
                         {"w4a16_pct_read_bw", 100 * g416 / lim.read_gbps},
                         {"w8a8_ms", t.w8a8_s * 1e3},
                         {"w8a8_gbps", g88},
                         {"w8a8_pct_read_bw", 100 * g88 / lim.read_gbps},
                         {"speedup_w4a8_vs_w8a8", t.w8a8_s / t.w4a8_s},
                         {"max_rel_diff_w4a8_vs_w4a16", t.rel_diff}});
  }
  return run_output.finish(output, "bench_int4", j) ? 0 : 1;
}
