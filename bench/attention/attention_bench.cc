// bench_attention: the absorbed MLA decode kernel (mla_absorbed_attention) at bench-2.6b's
// shape, fp32 products against bf16 ones (AbsorbedQuery::bf16) on the fp32 cache and on a
// bf16 cache of the same rows (the fast mode's default), alternated call by call in one
// process, with the machine's limits measured before and after.
//
// Shape: 16 heads, latent 512 (rows padded as the cache pads them), rope 64, context 513
// in blocks of `--block` rows (16: make_cache's default), each sequence's blocks scattered over the
// cache in a random order, as a serving cache's free list leaves them. Two settings:
//   cold  `--seqs` sequences × 12 layers of distinct caches, each read once per run (as a
//         decode step reads them), split over the threads by sequence
//   hot   one sequence's context (1.2 MB) read again and again by one thread
// Printed: median ms per run, GFLOP/s (scores and p·latent: 2 · ctx · heads · (2C + Dr)
// per token), GB/s of the cached rows read (the bf16 cache: half the bytes), and the limits: the
// fp32 and bf16 peaks, the read bandwidth of the whole machine, and the rate of a plain loop
// summing the same caches on one thread (what one core streams from this memory). Writes JSON
// and the printed table to bench-out/bench_attention.* (--json FILE elsewhere; --save also to
// bench/results/: run_output.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "json_out.h"
#include "kernels/cpu/mla_attention.h"
#include "machine_limits.h"
#include "run_output.h"

namespace {

using namespace xds;

constexpr int64_t kLatent = 512, kRope = 64, kHeads = 16, kContext = 513;

struct Caches {
  int64_t seqs, layers, block, ld, blocks_per_seq;
  std::vector<std::vector<float>> latent, rope;         // [layer]
  int64_t ld16 = 0;                                     // bf16 row stride
  std::vector<std::vector<uint16_t>> latent16, rope16;  // [layer], empty without AVX512_BF16
  std::vector<int32_t> table;  // [seqs, blocks_per_seq]: a random permutation of the blocks
  std::vector<float> q_abs, q_pe, out;

  Caches(int64_t seqs_, int64_t layers_, int64_t block_, std::mt19937& rng)
      : seqs(seqs_), layers(layers_), block(block_), ld(kernels::padded_latent_stride(kLatent)) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    blocks_per_seq = (kContext + block - 1) / block;
    const int64_t rows = seqs * blocks_per_seq * block;
    latent.resize(static_cast<size_t>(layers));
    rope.resize(static_cast<size_t>(layers));
    for (int64_t l = 0; l < layers; ++l) {
      latent[l].resize(static_cast<size_t>(rows * ld));
      rope[l].resize(static_cast<size_t>(rows * kRope));
      for (float& x : latent[l]) x = 0.1f * d(rng);
      for (float& x : rope[l]) x = d(rng);
    }
    if (kernels::absorbed_bf16_available()) {
      ld16 = kernels::padded_latent_stride(kLatent, 2);
      latent16.resize(static_cast<size_t>(layers));
      rope16.resize(static_cast<size_t>(layers));
      for (int64_t l = 0; l < layers; ++l) {
        latent16[l].resize(static_cast<size_t>(rows * ld16));
        rope16[l].resize(static_cast<size_t>(rows * kRope));
        for (int64_t r = 0; r < rows; ++r) {
          kernels::kv_row_to_bf16(latent[l].data() + r * ld, kLatent,
                                  latent16[l].data() + r * ld16);
          kernels::kv_row_to_bf16(rope[l].data() + r * kRope, kRope, rope16[l].data() + r * kRope);
        }
      }
    }
    table.resize(static_cast<size_t>(seqs * blocks_per_seq));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), rng);
    q_abs.resize(static_cast<size_t>(seqs * kHeads * kLatent));
    q_pe.resize(static_cast<size_t>(seqs * kHeads * kRope));
    out.resize(q_abs.size());
    for (float& x : q_abs) x = d(rng);
    for (float& x : q_pe) x = d(rng);
  }
  double bytes() const {
    double b = 0;
    for (int64_t l = 0; l < layers; ++l) b += 4.0 * (latent[l].size() + rope[l].size());
    return b;
  }
  // Every sequence of every layer once, sequences split over the pool's threads; kv16: the
  // bf16 cache (bf16 products).
  void run(bool bf16, bool kv16, ThreadPool& pool) {
    for (int64_t l = 0; l < layers; ++l) {
      pool.parallel_for(seqs, [&](int64_t s0, int64_t s1, int) {
        for (int64_t s = s0; s < s1; ++s) {
          kernels::LatentKvView kv{latent[l].data(),
                                   rope[l].data(),
                                   table.data() + s * blocks_per_seq,
                                   block,
                                   kLatent,
                                   kRope,
                                   ld};
          if (kv16) {
            kv.latent = kv.rope = nullptr;
            kv.latent_ld = ld16;
            kv.latent16 = latent16[l].data();
            kv.rope16 = rope16[l].data();
          }
          kernels::AbsorbedQuery q{q_abs.data() + s * kHeads * kLatent, kLatent,
                                   q_pe.data() + s * kHeads * kRope,    kRope,
                                   out.data() + s * kHeads * kLatent,   kLatent};
          q.bf16 = bf16;
          kernels::mla_absorbed_attention(q, 0, kHeads, kv, kContext, 0.1f);
        }
      });
    }
  }
  // A plain one-thread sum of every cache: the rate one core streams this memory at.
  float plain_sum() const {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t l = 0; l < layers; ++l) {
      for (const auto* v : {&latent[l], &rope[l]}) {
        const float* p = v->data();
        for (size_t i = 0; i + 16 <= v->size(); i += 16)
          acc = _mm512_add_ps(acc, _mm512_loadu_ps(p + i));
      }
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    float sum = 0;
    for (const float v : lanes) sum += v;
    return sum;
  }
};

struct Row {
  std::string setting;
  int threads;
  // kv16_s: 0 without the bf16 cache; gb: the rows the kernels read (fp32); plain_gb: the
  // whole caches the plain loop sums (block padding and row padding included)
  double f32_s, bf16_s, kv16_s, plain_s, gflop, gb, plain_gb;
};

Row measure(const std::string& setting, Caches& c, ThreadPool& pool, int reps) {
  std::vector<double> t[3], plain;  // fp32, bf16 products, bf16 products on the bf16 cache
  float sink = 0;
  const int kinds = c.latent16.empty() ? 2 : 3;
  for (int r = 0; r <= reps; ++r) {  // r = 0 warms up, untimed
    for (int k = 0; k < kinds; ++k) {
      const auto t0 = Clock::now();
      c.run(k > 0, k == 2, pool);
      if (r > 0) t[k].push_back(seconds_since(t0));
    }
    const auto t0 = Clock::now();
    sink += c.plain_sum();
    if (r > 0) plain.push_back(seconds_since(t0));
  }
  if (sink == 1234.5f) std::printf(" ");  // keeps the sums
  // The absorbed products (scores and p·latent) of every sequence's context in every layer.
  const kernels::MlaShape shape{kHeads, kLatent, 0, kRope, 0};
  const double flops =
      double(c.seqs) * double(c.layers) * kernels::mla_absorbed_pair_flops(shape, double(kContext));
  const double read = 4.0 * c.seqs * c.layers * kContext * (kLatent + kRope);
  return {setting,
          pool.num_threads(),
          bench::median(t[0]),
          bench::median(t[1]),
          kinds == 3 ? bench::median(t[2]) : 0.0,
          bench::median(plain),
          flops / 1e9,
          read / 1e9,
          c.bytes() / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_attention: the absorbed MLA kernel, fp32 against bf16 products"};
  bench::OutputOptions output;
  int64_t seqs = 64;
  int reps = 5;
  int64_t block = 16;
  bench::add_output_flags(app, output);
  app.add_option("--block", block, "rows per cache block (make_cache's default: 16)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seqs", seqs, "sequences of the cold setting")->check(CLI::Range(1, 256));
  app.add_option("--reps", reps, "timed runs per row (median)")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  bench::RunOutput run_output;  // captures the printed table from here on
  if (!kernels::absorbed_bf16_available())
    std::printf("note: this build has no AVX512_BF16 products; 'bf16' runs the fp32 kernel\n");

  ThreadPool two(2), one(1);
  const bench::MachineLimits before = bench::measure_machine_limits(two);
  std::mt19937 rng(1);
  std::vector<Row> rows;
  {
    Caches cold(seqs, 12, block, rng);
    rows.push_back(measure("cold", cold, two, reps));
    rows.push_back(measure("cold", cold, one, reps));
  }
  {
    Caches hot(1, 1, block, rng);
    rows.push_back(measure("hot", hot, one, std::max(reps, 50)));
  }
  const bench::MachineLimits lim = bench::faster_of(before, bench::measure_machine_limits(two));
  std::printf(
      "machine: read %.1f GB/s (2 threads), fp32 peak %.1f GFLOP/s, bf16 dot-product peak %.1f "
      "GFLOP/s (2 threads; the faster of before and after); blocks of %lld rows\n",
      lim.read_gbps, lim.f32_gflops, lim.bf16_gflops, static_cast<long long>(block));
  std::printf("%-6s %3s | %8s %7s %6s | %8s %7s %6s | %11s %7s %6s | %14s\n", "cache", "thr",
              "f32 ms", "GFLOP/s", "GB/s", "bf16 ms", "GFLOP/s", "GB/s", "bf16 KV ms", "GFLOP/s",
              "GB/s", "plain 1-thr GB/s");
  nlohmann::json j;
  j["machine"] = {{"read_gbps", lim.read_gbps},
                  {"f32_gflops", lim.f32_gflops},
                  {"bf16_gflops", lim.bf16_gflops}};
  j["block_rows"] = block;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    const double kv16 = r.kv16_s > 0 ? r.kv16_s : NAN;
    std::printf("%-6s %3d | %8.2f %7.1f %6.1f | %8.2f %7.1f %6.1f | %11.2f %7.1f %6.1f | %14.1f\n",
                r.setting.c_str(), r.threads, r.f32_s * 1e3, r.gflop / r.f32_s, r.gb / r.f32_s,
                r.bf16_s * 1e3, r.gflop / r.bf16_s, r.gb / r.bf16_s, kv16 * 1e3, r.gflop / kv16,
                r.gb / 2 / kv16, r.plain_gb / r.plain_s);
    j["rows"].push_back({{"cache", r.setting},
                         {"threads", r.threads},
                         {"gflop", r.gflop},
                         {"gb", r.gb},
                         {"plain_gb", r.plain_gb},
                         {"f32_ms", r.f32_s * 1e3},
                         {"bf16_ms", r.bf16_s * 1e3},
                         {"bf16_kv_bf16_ms", r.kv16_s * 1e3},
                         {"plain_sum_ms", r.plain_s * 1e3}});
  }
  return run_output.finish(output, "bench_attention", j) ? 0 : 1;
}
