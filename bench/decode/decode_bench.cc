// bench_decode: prefill and batched decode throughput of the DeepSeek-V3 runtime beside
// the roofline of each measurement, with the machine's limits measured in the same run.
//
//   bench_decode --model DIR [--prompt 512] [--context 512] [--batches 1,4,16,64]
//                [--steps 5] [--compute-dtype f32|bf16] [--json FILE] [--save] [--rounds R]
//                [--verify K]
//
// Writes JSON and the printed table to bench-out/bench_decode.* (bench_decode-bf16.* in the
// bf16 mode; bench_decode-w8a8*.* for a W8A8 checkpoint; --json FILE elsewhere; --save also
// to bench/results/: run_output.h).
//
// Roofline of a step = max(bytes the step must read / read bandwidth, FLOPs / compute peak),
// the peak being the fp32 FMA loop's, or with --compute-dtype bf16 the faster of that and the
// vdpbf16ps loop's (compute_peak_gflops),
// with bandwidth and peak measured again right before and right after each row, the
// faster of the two used (the run-start figures are printed too; a shared machine's limits
// drift over minutes, and a slow moment during one measurement must not lower a row's limit).
// Bytes: every non-expert weight once, plus the routed experts the step actually touched
// (counted from the routing), plus the latent KV cache of every sequence. FLOPs: 2 per
// multiply-add of the linear layers actually run (routed experts per token), plus attention;
// W8A8 checkpoints' int8 products count as fp-equivalent FLOPs (float peak ÷ int8 peak,
// measured at the start, per multiply-add: params_of), so the compute roofline holds them to
// the int8 peak.
//
// --verify K (MTP speculative decoding, model/speculative_decode.h): per batch, beside the
// one-token decode step, the step that verifies K+1 tokens per sequence (logits of every
// row) and the K MTP passes that draft them (one row per sequence each: the draft-extend's
// extra rows of pass 0 are left out), each beside its roofline (distinct experts over all of
// the step's tokens), then the tokens/s projected at acceptance a = 0.7, 0.8, 0.9 from
// (1 - a^(K+1)) / (1 - a) tokens per step: over the verify step alone, and over verify plus
// drafts (what a request sees), against the plain decode's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "int8_peak.h"
#include "json_out.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/mla_attention.h"
#include "machine_limits.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "run_output.h"

namespace xds::bench {
namespace {

// Prints "error: <status>" and gives main's exit code for it.
int fail(const xds::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

int64_t mlp_bytes(const MlpWeights& m) {
  return m.gate_proj.read_bytes() + m.up_proj.read_bytes() + m.down_proj.read_bytes();
}
// W8A8 weights (MatrixLayout::kInt8Panels) run at the int8 peak, not the float one: their
// multiply-adds count as float_peak / int8_peak float ones ("fp-equivalent" FLOPs), so that
// FLOPs / float peak is the time the step's products need at the two peaks.
double params_of(const MatrixRef& m, double int8_weight) {
  const double w = m.layout == MatrixLayout::kInt8Panels ? int8_weight : 1.0;
  return w * static_cast<double>(m.rows * m.cols);
}
double mlp_params(const MlpWeights& m, double int8_weight) {
  return params_of(m.gate_proj, int8_weight) + params_of(m.up_proj, int8_weight) +
         params_of(m.down_proj, int8_weight);
}

struct StaticCost {
  int64_t dense_bytes = 0;    // weights read once per step whatever the batch
  double dense_params = 0;    // multiply-adds per token through them (kv_b_proj and lm_head
                              // not included: their use depends on the step, see below)
  double lm_head_params = 0;  // per token that gets logits
  int64_t expert_bytes = 0;   // one routed expert
  double expert_params = 0;   // (int8 ones weighted: params_of)
};

// Adds one decoder layer (attention, dense MLP or router + shared experts + one routed
// expert's size) to `s`.
void add_layer_cost(const LayerWeights& l, double int8_weight, StaticCost& s) {
  auto add = [&](const MatrixRef& m) {
    s.dense_bytes += m.read_bytes();
    s.dense_params += params_of(m, int8_weight);
  };
  {
    const MlaWeights& a = l.attn;
    for (const auto* m : {&a.q_a_proj, &a.q_b_proj, &a.q_proj})
      if (*m) add(**m);
    add(a.kv_a_proj);
    add(a.o_proj);
    s.dense_bytes += a.kv_b_proj.read_bytes();  // read every step; its FLOPs are attention's
    if (l.dense) {
      add(l.dense->gate_proj), add(l.dense->up_proj), add(l.dense->down_proj);
    } else {
      add(l.moe->router);
      if (l.moe->shared)
        add(l.moe->shared->gate_proj), add(l.moe->shared->up_proj), add(l.moe->shared->down_proj);
      s.expert_bytes = mlp_bytes(l.moe->experts[0]);
      s.expert_params = mlp_params(l.moe->experts[0], int8_weight);
    }
  }
}

StaticCost static_cost(const DeepseekV3Model& model, double int8_weight) {
  StaticCost s;
  const auto& w = model.weights();
  for (const LayerWeights& l : w.layers) add_layer_cost(l, int8_weight, s);
  s.dense_bytes += w.lm_head.read_bytes();
  s.lm_head_params = params_of(w.lm_head, int8_weight);
  return s;
}

// One pass of MTP layer 0: eh_proj, its decoder layer, shared_head.head (the embedding rows
// read are negligible).
StaticCost mtp_static_cost(const DeepseekV3Model& model, double int8_weight) {
  StaticCost s;
  const MtpWeights& m = model.weights().mtp.at(0);
  s.dense_bytes += m.eh_proj.read_bytes();
  s.dense_params += params_of(m.eh_proj, int8_weight);
  add_layer_cost(m.layer, int8_weight, s);
  s.dense_bytes += m.head.read_bytes();
  s.lm_head_params = params_of(m.head, int8_weight);
  return s;
}

// Attention FLOPs per layer of a chunk of m tokens after p0 cached ones, in the form the
// engine runs (the cheaper one, as model/mla.cc chooses), kv_b_proj included:
//   absorbed: W_UK and W_UV per token, then scores and p·latent over the latent (C + Dr, C);
//   expanded: kv_b_proj over the whole context, then scores and p·v per head (Dn + Dr, Dv).
double attention_flops(const DeepseekV3Config& c, int64_t p0, int64_t m) {
  const kernels::MlaChunkFlops f = kernels::mla_chunk_flops(
      {c.num_attention_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
       c.v_head_dim},
      p0, m);
  return std::min(f.absorbed, f.expanded);
}

// Fills positions [0, ctx) of `seq` with random latent/rope values in every main layer (and
// the MTP layers if asked): the cost of a decode step depends on the context length, not on
// what the context says.
void fill_context(const DeepseekV3Config& c, KvCache& cache, int64_t seq, int64_t ctx,
                  std::mt19937& rng, bool mtp_layers) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  (void)cache.reserve(seq, ctx + 64);
  std::vector<float> lat(static_cast<size_t>(c.kv_lora_rank)),
      rope(static_cast<size_t>(c.qk_rope_head_dim));
  const int64_t layers = c.num_hidden_layers + (mtp_layers ? c.num_nextn_predict_layers : 0);
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t p = 0; p < ctx; ++p) {
      for (float& v : lat) v = d(rng);
      for (float& v : rope) v = d(rng) * 0.1f;
      cache.write(l, seq, p, lat.data(), rope.data());
    }
  }
}

// A virtual machine's read rate can flip between two modes within seconds (docs/benchmarks.md,
// "The machine of the runtime benchmarks"). A row whose rate before and after differ by more
// than this ratio may have run in either mode, while its roofline takes the faster: such rows
// are marked, and the medians also shown without them.
constexpr double kReadMovedRatio = 1.2;

bool read_moved(double before, double after) {
  return std::max(before, after) > kReadMovedRatio * std::min(before, after);
}

// Each step's roofline: max(bytes / read bandwidth, FLOPs / compute peak), in seconds.
std::vector<double> rooflines_of(const std::vector<double>& bytes, const std::vector<double>& flops,
                                 const MachineLimits& lim, double peak_gflops) {
  std::vector<double> out;
  for (size_t i = 0; i < bytes.size(); ++i)
    out.push_back(std::max(bytes[i] / (lim.read_gbps * 1e9), flops[i] / (peak_gflops * 1e9)));
  return out;
}

struct Row {
  std::string what;
  int64_t batch;
  double tokens_per_s, step_ms, roofline_ms, bytes_gb, gflop;
  std::string bound;
  MachineLimits limits;  // the faster of those measured right before and after the row
  double peak_gflops;    // the roofline's compute peak: compute_peak_gflops(limits, dtype)
  double read_before_gbps = 0, read_after_gbps = 0;
  int round = 0;
  std::map<std::string, double> phase_ms{};  // --phases: mean ms per step of each phase
};

}  // namespace
}  // namespace xds::bench

int main(int argc, char** argv) {
  xds::kernels::select_blas_core(argv);  // first: it may re-execute the program
  using namespace xds;
  using namespace xds::bench;
  CLI::App app{"bench_decode: prefill and decode throughput against the roofline"};
  std::string model_dir, dtype = "f32", batches_arg = "1,4,16,64";
  OutputOptions output;
  int64_t prompt = 512, context = 512, steps = 5;
  int rounds = 1;
  int64_t verify = 0;
  bool phases = false;
  bool overlap_shared = false;
  std::string kv_dtype = "auto";
  std::string panel_isa = kernels::panel_isa_name(kernels::panel_isa());
  app.add_option("--model", model_dir)->required();
  app.add_option("--prompt", prompt);
  app.add_option("--context", context);
  app.add_option("--batches", batches_arg);
  app.add_option("--steps", steps);
  app.add_option("--compute-dtype", dtype);
  add_output_flags(app, output);
  app.add_option("--rounds", rounds,
                 "repeat all rows this many times; the table gives medians and ranges")
      ->check(CLI::Range(1, 20));
  app.add_option("--verify", verify,
                 "MTP speculative decoding: also time the step verifying K+1 tokens per sequence "
                 "and the K MTP passes drafting them, and project tokens/s at acceptance 0.7-0.9 "
                 "(0: off; needs a model with an MTP layer)")
      ->check(CLI::Range(int64_t{0}, int64_t{16}));
  app.add_flag("--phases", phases,
               "time the phases of prefill and decode steps (attention parts, router, experts, "
               "...) and print ms per step beside the table");
  app.add_flag("--overlap-shared", overlap_shared,
               "run the shared experts in slices between the routed ones where the model's rule "
               "allows it (8+ tokens, at most 4 per expert), not after them (A/B runs)");
  app.add_option("--kv-cache-dtype", kv_dtype,
                 "KV cache elements: auto (bf16 in the bf16 mode where the CPU has AVX512_BF16), "
                 "f32, bf16 or int8 (the latent in INT8 with a scale per row; A/B runs)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "int8"}));
  app.add_option("--panel-isa", panel_isa,
                 "instruction set of the BF16 panel kernel (A/B runs; default: the widest built)")
      ->check(CLI::IsMember({"avx2", "avx512"}));
  CLI11_PARSE(app, argc, argv);
  RunOutput run_output;  // captures the printed table from here on
  const kernels::PanelIsa isa =
      panel_isa == "avx512" ? kernels::PanelIsa::kAvx512 : kernels::PanelIsa::kAvx2;
  if (!kernels::panel_isa_available(isa)) {
    std::fprintf(stderr, "error: --panel-isa %s: this build has no such kernel\n",
                 panel_isa.c_str());
    return 1;
  }
  kernels::set_panel_isa(isa);

  ModelOptions mo;
  mo.compute = dtype == "bf16" ? ComputeDType::kBF16 : ComputeDType::kF32;
  mo.overlap_shared = overlap_shared;
  mo.kv_cache = kv_dtype == "bf16"   ? KvCacheDType::kBF16
                : kv_dtype == "f32"  ? KvCacheDType::kF32
                : kv_dtype == "int8" ? KvCacheDType::kInt8
                                     : KvCacheDType::kAuto;
  auto loaded = DeepseekV3Model::load(model_dir, mo);
  if (!loaded.ok()) return fail(loaded.status());
  DeepseekV3Model& model = **loaded;
  const DeepseekV3Config& c = model.config();
  const MachineLimits lim = measure_machine_limits(model.pool());
  std::fprintf(stderr,
               "machine: read %.1f GB/s (plain loop %.1f, with software prefetch %.1f), fp32 "
               "peak %.1f GFLOP/s (%s FMA loop, %d threads), bf16 dot-product peak %.1f "
               "GFLOP/s (vdpbf16ps loop; 0: not built)\n",
               lim.read_gbps, lim.read_plain_gbps, lim.read_prefetch_gbps, lim.f32_gflops,
               lim.f32_isa, model.pool().num_threads(), lim.bf16_gflops);
  // The int8 peak of the selected path (W8A8 checkpoints' products), measured once here.
  const double int8_gops = int8_peak_gops(model.pool(), kernels::int8_isa());
  const double int8_weight = compute_peak_gflops(lim, dtype) / int8_gops;
  std::fprintf(stderr,
               "int8 peak %.1f GOP/s (%s loop): an int8 multiply-add counts as %.3f "
               "fp-equivalent ones in the W8A8 rows' FLOPs\n",
               int8_gops, kernels::int8_isa_name(kernels::int8_isa()), int8_weight);
  const StaticCost sc = static_cost(model, int8_weight);
  const int64_t moe_layers = [&] {
    int64_t n = 0;
    for (const auto& l : model.weights().layers) n += l.moe ? 1 : 0;
    return n;
  }();

  if (verify > 0 && c.num_nextn_predict_layers == 0) {
    return fail(invalid_argument("--verify {}: {} has no MTP layer to draft with", verify,
                                 model_dir));
  }
  const StaticCost mtp_sc = verify > 0 ? mtp_static_cost(model, int8_weight) : StaticCost{};

  // Touched experts per MoE layer (the MTP layers after the main ones), collected by the
  // routing observer during a step.
  std::vector<std::set<int32_t>> touched(
      static_cast<size_t>(c.num_hidden_layers + c.num_nextn_predict_layers));
  int64_t routed_token_experts = 0;
  model.set_routing_observer([&](int64_t layer, int64_t, std::span<const int32_t> ids) {
    touched[layer].insert(ids.begin(), ids.end());
    routed_token_experts += static_cast<int64_t>(ids.size());
  });
  auto reset_touched = [&] {
    for (auto& t : touched) t.clear();
    routed_token_experts = 0;
  };
  auto touched_count = [&] {  // main layers
    int64_t n = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) n += static_cast<int64_t>(touched[l].size());
    return n;
  };
  // Bytes of one cached position of one layer that attention reads: every plane's used
  // elements (latent + rope, and an INT8 latent's scale).
  double kv_row_bytes = 0;
  for (const KvPlane& p : model.kv_layout().planes)
    kv_row_bytes += static_cast<double>(p.elements * dtype_size(p.dtype));

  std::vector<Row> rows;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));

  // --verify: a row of `what` for `batch` sequences of `cache` from position `start`, a warm-up
  // and `steps` timed steps, each at K+1 positions after the last. "verify": one main pass of
  // K+1 tokens per sequence with every row's logits; "draft": K passes of MTP layer 0 with one
  // row per sequence each (their bytes and FLOPs summed, experts counted per pass).
  auto verify_row = [&](const std::string& what, int64_t batch, KvCache& cache,
                        const std::vector<int64_t>& seqs, int64_t start, int round) -> Status {
    const bool draft = what == "draft";
    const int64_t per_seq = draft ? 1 : verify + 1, d = c.hidden_size;
    const MachineLimits before = measure_machine_limits(model.pool());
    std::vector<int32_t> ids(static_cast<size_t>(batch * per_seq));
    std::vector<float> hidden(static_cast<size_t>(batch * d));  // [batch, D] MTP input rows
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& x : hidden) x = nd(rng);
    std::vector<double> times, bytes_v, flops_v;
    StepOutput out;
    PhaseTimes step_phases;
    if (phases) model.set_phase_times(&step_phases);
    for (int64_t s = 0; s < steps + 1; ++s) {
      const int64_t pos = start + s * (verify + 1);
      double t = 0, bytes = 0, flops = 0;
      for (auto& x : ids) x = tok(rng);
      if (!draft) {
        std::vector<TokenChunk> chunks;
        for (int64_t b = 0; b < batch; ++b) {
          XDS_ASSIGN_OR_RETURN(
              const TokenChunk ch,
              cache.chunk(seqs[b], pos, std::span<const int32_t>(ids).subspan(b * per_seq, per_seq),
                          /*all_logits=*/true));
          chunks.push_back(ch);
        }
        reset_touched();
        const auto t0 = Clock::now();
        XDS_RETURN_IF_ERROR(model.forward(chunks, cache.storage(), out));
        t = seconds_since(t0);
        bytes = static_cast<double>(sc.dense_bytes + touched_count() * sc.expert_bytes) +
                batch * (pos + per_seq) * kv_row_bytes * c.num_hidden_layers;
        flops = 2.0 * (batch * per_seq * static_cast<double>(sc.dense_params + sc.lm_head_params) +
                       routed_token_experts * static_cast<double>(sc.expert_params)) +
                batch * attention_flops(c, pos, per_seq) * c.num_hidden_layers;
      } else {
        for (int64_t p = 0; p < verify; ++p) {
          std::vector<MtpChunk> chunks;
          for (int64_t b = 0; b < batch; ++b) {
            XDS_ASSIGN_OR_RETURN(
                const MtpChunk ch,
                cache.mtp_chunk(seqs[b], pos + p, std::span<const int32_t>(&ids[b], 1),
                                hidden.data() + b * d));
            chunks.push_back(ch);
          }
          reset_touched();
          const auto t0 = Clock::now();
          XDS_RETURN_IF_ERROR(model.forward_mtp(0, chunks, cache.storage(), out));
          t += seconds_since(t0);
          const int64_t mtp_touched =
              static_cast<int64_t>(touched[static_cast<size_t>(c.num_hidden_layers)].size());
          bytes += static_cast<double>(mtp_sc.dense_bytes + mtp_touched * mtp_sc.expert_bytes) +
                   batch * (pos + p + 1) * kv_row_bytes;
          flops += 2.0 * (batch * static_cast<double>(mtp_sc.dense_params + mtp_sc.lm_head_params) +
                          routed_token_experts * static_cast<double>(mtp_sc.expert_params)) +
                   batch * attention_flops(c, pos + p, 1);
        }
      }
      if (s == 0) {  // warm-up
        step_phases.clear();
        continue;
      }
      times.push_back(t);
      bytes_v.push_back(bytes);
      flops_v.push_back(flops);
    }
    model.set_phase_times(nullptr);
    const MachineLimits after = measure_machine_limits(model.pool());
    const MachineLimits lim = faster_of(before, after);
    const double peak = compute_peak_gflops(lim, dtype);
    const std::vector<double> rooflines = rooflines_of(bytes_v, flops_v, lim, peak);
    const double t = median(times), roof = median(rooflines), bytes = median(bytes_v),
                 flops = median(flops_v);
    const double tokens = static_cast<double>(batch * (draft ? verify : per_seq));
    rows.push_back({what, batch, tokens / t, t * 1e3, roof * 1e3, bytes / 1e9, flops / 1e9,
                    bytes / (lim.read_gbps * 1e9) > flops / (peak * 1e9) ? "memory" : "compute",
                    lim, peak});
    rows.back().round = round;
    rows.back().read_before_gbps = before.read_gbps;
    rows.back().read_after_gbps = after.read_gbps;
    for (const auto& [name, sec] : step_phases.seconds)
      rows.back().phase_ms[name] = sec * 1e3 / steps;
    return {};
  };

  for (int round = 0; round < rounds; ++round) {
    {  // Prefill: one sequence, `prompt` tokens in one chunk.
      const MachineLimits before = measure_machine_limits(model.pool());
      std::vector<double> times;
      double flops = 0, bytes = 0;
      PhaseTimes prefill_phases;
      if (phases) model.set_phase_times(&prefill_phases);
      for (int r = 0; r < 3; ++r) {
        Result<KvCache> made = model.make_cache(prompt + 16);
        if (!made.ok()) return fail(made.status());
        KvCache& cache = *made;
        const int64_t seq = cache.add_sequence();
        std::vector<int32_t> ids(static_cast<size_t>(prompt));
        for (auto& t : ids) t = tok(rng);
        reset_touched();
        StepOutput out;
        Result<TokenChunk> ch = cache.chunk(seq, 0, ids);
        if (!ch.ok()) return fail(ch.status());
        const auto t0 = Clock::now();
        const Status s = model.forward({&*ch, 1}, cache.storage(), out);
        times.push_back(seconds_since(t0));
        if (r == 0) prefill_phases.clear();  // the first prefill also faults in the buffers
        if (!s.ok()) return fail(s);
        // Logits for the last position only (generate's prefill); one chunk from 0.
        flops = 2.0 * (prompt * static_cast<double>(sc.dense_params) +
                       static_cast<double>(sc.lm_head_params) +
                       routed_token_experts * static_cast<double>(sc.expert_params)) +
                attention_flops(c, 0, prompt) * c.num_hidden_layers;
        bytes = static_cast<double>(sc.dense_bytes + touched_count() * sc.expert_bytes);
      }
      model.set_phase_times(nullptr);
      const double t = median(times);
      const MachineLimits after = measure_machine_limits(model.pool());
      const MachineLimits lim = faster_of(before, after);
      const double peak = compute_peak_gflops(lim, dtype);
      const double roof = std::max(bytes / (lim.read_gbps * 1e9), flops / (peak * 1e9));
      rows.push_back({"prefill", 1, prompt / t, t * 1e3, roof * 1e3, bytes / 1e9, flops / 1e9,
                      bytes / (lim.read_gbps * 1e9) > flops / (peak * 1e9) ? "memory" : "compute",
                      lim, peak});
      rows.back().round = round;
      rows.back().read_before_gbps = before.read_gbps;
      rows.back().read_after_gbps = after.read_gbps;
      for (const auto& [name, sec] : prefill_phases.seconds)
        rows.back().phase_ms[name] = sec * 1e3 / 2;  // mean over the last two prefills
    }

    std::stringstream ss(batches_arg);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const int64_t batch = std::stoll(item);
      // A shared machine's limits drift over minutes: each row's roofline
      // uses the faster of limits measured right before and right after its steps.
      const MachineLimits before = measure_machine_limits(model.pool());
      // --verify: its steps follow the decode steps' positions, K+1 apart.
      const int64_t verify_positions = verify > 0 ? (steps + 1) * (verify + 1) : 0;
      Result<KvCache> made =
          model.make_cache(batch * (context + 64 + steps + 8 + verify_positions));
      if (!made.ok()) return fail(made.status());
      KvCache& cache = *made;
      std::vector<int64_t> seqs;
      for (int64_t b = 0; b < batch; ++b) {
        seqs.push_back(cache.add_sequence());
        fill_context(c, cache, seqs.back(), context, rng, verify > 0);
      }
      std::vector<int32_t> ids(static_cast<size_t>(batch));
      std::vector<double> times, rooflines, bytes_v, flops_v;
      PhaseTimes step_phases;
      std::map<std::string, double> phase_sum;
      if (phases) model.set_phase_times(&step_phases);
      for (int64_t s = 0; s < steps + 1; ++s) {
        std::vector<TokenChunk> chunks;
        for (int64_t b = 0; b < batch; ++b) {
          ids[b] = tok(rng);
          Result<TokenChunk> ch =
              cache.chunk(seqs[b], context + s, std::span<const int32_t>(&ids[b], 1));
          if (!ch.ok()) return fail(ch.status());
          chunks.push_back(*ch);
        }
        reset_touched();
        StepOutput out;
        const auto t0 = Clock::now();
        const Status st = model.forward(chunks, cache.storage(), out);
        const double t = seconds_since(t0);
        if (!st.ok()) return fail(st);
        if (s == 0) {  // warm-up
          step_phases.clear();
          continue;
        }
        const int64_t ctx = context + s + 1;
        const double kv_bytes =
            static_cast<double>(batch) * ctx * kv_row_bytes * c.num_hidden_layers;
        const double bytes =
            static_cast<double>(sc.dense_bytes + touched_count() * sc.expert_bytes) + kv_bytes;
        const double flops =
            2.0 * (batch * static_cast<double>(sc.dense_params + sc.lm_head_params) +
                   routed_token_experts * static_cast<double>(sc.expert_params)) +
            batch * attention_flops(c, ctx - 1, 1) * c.num_hidden_layers;
        times.push_back(t);
        bytes_v.push_back(bytes);
        flops_v.push_back(flops);
      }
      model.set_phase_times(nullptr);
      const MachineLimits after = measure_machine_limits(model.pool());
      const MachineLimits lim = faster_of(before, after);
      const double peak = compute_peak_gflops(lim, dtype);
      rooflines = rooflines_of(bytes_v, flops_v, lim, peak);
      for (const auto& [name, sec] : step_phases.seconds) phase_sum[name] = sec * 1e3 / steps;
      const double t = median(times), roof = median(rooflines), bytes = median(bytes_v),
                   flops = median(flops_v);
      rows.push_back({"decode", batch, batch / t, t * 1e3, roof * 1e3, bytes / 1e9, flops / 1e9,
                      bytes / (lim.read_gbps * 1e9) > flops / (peak * 1e9) ? "memory" : "compute",
                      lim, peak});
      rows.back().round = round;
      rows.back().read_before_gbps = before.read_gbps;
      rows.back().read_after_gbps = after.read_gbps;
      rows.back().phase_ms = phase_sum;
      if (verify > 0) {
        for (const char* what : {"verify", "draft"}) {
          const Status st = verify_row(what, batch, cache, seqs, context + steps + 1, round);
          if (!st.ok()) return fail(st);
        }
      }
    }
  }
  (void)moe_layers;

  std::printf(
      "\nmodel %s, compute %s, KV cache %s, panel kernel %s, OpenBLAS %s, context %lld; machine: "
      "read %.1f GB/s, fp32 peak %.1f GFLOP/s (%s), bf16 dot-product peak %.1f GFLOP/s; roofline "
      "peak: %s\n",
      model_dir.c_str(), dtype.c_str(), std::string(dtype_name(model.kv_cache_dtype())).c_str(),
      panel_isa.c_str(), kernels::blas_core_name().c_str(), static_cast<long long>(context),
      lim.read_gbps, lim.f32_gflops, lim.f32_isa, lim.bf16_gflops,
      dtype == "bf16" ? "the faster of the two" : "fp32");
  if (c.int_quant && c.int_quant->scheme == IntScheme::kW8A8) {
    std::printf(
        "W8A8 checkpoint: int8 peak %.1f GOP/s (%s loop); GFLOP below are fp-equivalent (an int8 "
        "multiply-add counts %.3f, the float peak over the int8 one)\n",
        int8_gops, kernels::int8_isa_name(kernels::int8_isa()), int8_weight);
  }
  std::printf("%-8s %6s %12s %10s %12s %9s %9s %9s %8s %8s %8s  %s\n", "phase", "batch", "tokens/s",
              "step ms", "roofline ms", "% roof", "GB read", "GFLOP", "bound", "row GB/s",
              "row GF/s", "read before/after");
  nlohmann::json j;
  j["machine"] = {{"read_gbps", lim.read_gbps},
                  {"read_plain_gbps", lim.read_plain_gbps},
                  {"read_prefetch_gbps", lim.read_prefetch_gbps},
                  {"f32_gflops", lim.f32_gflops},
                  {"f32_isa", lim.f32_isa},
                  {"bf16_gflops", lim.bf16_gflops},
                  {"int8_gops", int8_gops},
                  {"int8_isa", kernels::int8_isa_name(kernels::int8_isa())},
                  {"threads", model.pool().num_threads()}};
  j["int8_fp_equivalent"] = int8_weight;
  j["model"] = model_dir;
  j["compute_dtype"] = dtype;
  j["kv_cache_dtype"] = std::string(dtype_name(model.kv_cache_dtype()));
  j["panel_isa"] = panel_isa;
  j["blas_core"] = kernels::blas_core_name();
  j["context"] = context;
  for (const Row& r : rows) {
    const bool moved = read_moved(r.read_before_gbps, r.read_after_gbps);
    std::printf(
        "%-8s %6lld %12.1f %10.2f %12.2f %8.1f%% %9.3f %9.2f %8s %8.1f %8.1f  %.0f/%.0f%s\n",
        r.what.c_str(), static_cast<long long>(r.batch), r.tokens_per_s, r.step_ms, r.roofline_ms,
        100.0 * r.roofline_ms / r.step_ms, r.bytes_gb, r.gflop, r.bound.c_str(), r.limits.read_gbps,
        r.peak_gflops, r.read_before_gbps, r.read_after_gbps, moved ? " moved" : "");
    j["rows"].push_back({{"phase", r.what},
                         {"batch", r.batch},
                         {"tokens_per_s", r.tokens_per_s},
                         {"step_ms", r.step_ms},
                         {"roofline_ms", r.roofline_ms},
                         {"fraction_of_roofline", r.roofline_ms / r.step_ms},
                         {"gb_read", r.bytes_gb},
                         {"gflop", r.gflop},
                         {"bound", r.bound},
                         {"round", r.round},
                         {"row_read_gbps", r.limits.read_gbps},
                         {"read_before_gbps", r.read_before_gbps},
                         {"read_after_gbps", r.read_after_gbps},
                         {"read_moved", moved},
                         {"row_read_plain_gbps", r.limits.read_plain_gbps},
                         {"row_read_prefetch_gbps", r.limits.read_prefetch_gbps},
                         {"row_f32_gflops", r.limits.f32_gflops},
                         {"row_bf16_gflops", r.limits.bf16_gflops},
                         {"row_peak_gflops", r.peak_gflops},
                         {"achieved_gflops", r.gflop / (r.step_ms / 1e3)}});
  }
  if (phases) {
    // One column per row: mean ms per step (per prefill) in each phase, then their sum beside
    // the measured step (the rest is embedding, the final norm and unlabelled glue).
    std::vector<const Row*> cols;
    std::map<std::string, int> names;
    for (const Row& r : rows) {
      if (r.phase_ms.empty()) continue;
      cols.push_back(&r);
      for (const auto& kv : r.phase_ms) names.emplace(kv.first, 0);
    }
    std::printf("\nphases, ms per step (mean over the timed steps)\n%-20s", "phase");
    for (const Row* r : cols) {
      const std::string label =
          r->what == "prefill"  ? "prefill"
          : r->what == "decode" ? fmt::format("b{}", r->batch)
                                : fmt::format("{}{}", r->what.substr(0, 3), r->batch);
      std::printf(" %8s", label.c_str());
    }
    std::printf("\n");
    for (const auto& [name, unused] : names) {
      std::printf("%-20s", name.c_str());
      for (const Row* r : cols) {
        const auto it = r->phase_ms.find(name);
        std::printf(" %8.2f", it == r->phase_ms.end() ? 0.0 : it->second);
      }
      std::printf("\n");
    }
    std::printf("%-20s", "sum of phases");
    for (const Row* r : cols) {
      double sum = 0;
      for (const auto& kv : r->phase_ms) sum += kv.second;
      std::printf(" %8.2f", sum);
    }
    std::printf("\n%-20s", "step (median)");
    for (const Row* r : cols) std::printf(" %8.2f", r->step_ms);
    std::printf("\n");
    for (const Row& r : rows) {
      if (r.phase_ms.empty()) continue;
      nlohmann::json ph;
      for (const auto& [name, ms] : r.phase_ms) ph[name] = ms;
      j["phases_ms_per_step"].push_back(
          {{"phase", r.what}, {"batch", r.batch}, {"round", r.round}, {"phases", ph}});
    }
  }
  if (rounds > 1) {
    // Medians over the rounds, in the order the rows were first measured.
    std::printf("\nmedians over %d rounds\n%-8s %6s %12s %9s %17s   %s\n", rounds, "phase", "batch",
                "tokens/s", "% roof", "% roof range",
                "rows whose read rate held: % roof median (range)");
    std::vector<std::pair<std::string, int64_t>> keys;
    for (const Row& r : rows) {
      if (std::find(keys.begin(), keys.end(), std::pair{r.what, r.batch}) == keys.end())
        keys.emplace_back(r.what, r.batch);
    }
    for (const auto& [what, batch] : keys) {
      std::vector<double> tps, frac, held;
      for (const Row& r : rows) {
        if (r.what != what || r.batch != batch) continue;
        tps.push_back(r.tokens_per_s);
        frac.push_back(100.0 * r.roofline_ms / r.step_ms);
        if (!read_moved(r.read_before_gbps, r.read_after_gbps)) held.push_back(frac.back());
      }
      const auto [lo, hi] = std::minmax_element(frac.begin(), frac.end());
      std::string held_text = "none";
      if (!held.empty()) {
        const auto [hlo, hhi] = std::minmax_element(held.begin(), held.end());
        held_text = fmt::format("{:.1f}% ({:.1f} - {:.1f}%, {} of {})", median(held), *hlo, *hhi,
                                held.size(), frac.size());
      }
      std::printf("%-8s %6lld %12.1f %8.1f%% %7.1f - %5.1f%%   %s\n", what.c_str(),
                  static_cast<long long>(batch), median(tps), median(frac), *lo, *hi,
                  held_text.c_str());
      j["medians"].push_back({{"phase", what},
                              {"batch", batch},
                              {"tokens_per_s", median(tps)},
                              {"fraction_of_roofline", median(frac) / 100.0},
                              {"fraction_min", *lo / 100.0},
                              {"fraction_max", *hi / 100.0}});
    }
  }
  if (verify > 0) {
    // Per batch, the medians over the rounds of the decode, verify and draft rows.
    auto med = [&](const std::string& what, int64_t batch, bool roofline) {
      std::vector<double> v;
      for (const Row& r : rows)
        if (r.what == what && r.batch == batch) v.push_back(roofline ? r.roofline_ms : r.step_ms);
      return v.empty() ? 0.0 : median(v);
    };
    std::vector<int64_t> batches;
    for (const Row& r : rows)
      if (r.what == "verify" && std::find(batches.begin(), batches.end(), r.batch) == batches.end())
        batches.push_back(r.batch);
    const double alphas[] = {0.7, 0.8, 0.9};
    std::printf(
        "\nspeculative decoding, K = %lld drafts: a step verifies K+1 tokens per sequence and "
        "gives (1 - a^(K+1)) / (1 - a) tokens at acceptance a (%.3f, %.3f, %.3f); the drafts "
        "are K MTP passes of one row per sequence. ms: measured (roofline)\n",
        static_cast<long long>(verify), (1 - std::pow(0.7, verify + 1)) / 0.3,
        (1 - std::pow(0.8, verify + 1)) / 0.2, (1 - std::pow(0.9, verify + 1)) / 0.1);
    std::printf("%6s %18s %18s %8s %18s %12s  %s\n", "batch", "decode ms", "verify ms",
                "x decode", "draft ms", "plain tok/s",
                "tokens/s at a = 0.7 / 0.8 / 0.9: verify alone; verify + drafts; roofline of "
                "verify + drafts");
    for (const int64_t b : batches) {
      const double dec = med("decode", b, false), dec_roof = med("decode", b, true);
      const double ver = med("verify", b, false), ver_roof = med("verify", b, true);
      const double dr = med("draft", b, false), dr_roof = med("draft", b, true);
      nlohmann::json proj;
      std::string alone, with_drafts, roof_text;
      for (const double a : alphas) {
        const double e = (1 - std::pow(a, verify + 1)) / (1 - a);
        const double t_alone = b * e / (ver / 1e3), t_all = b * e / ((ver + dr) / 1e3);
        const double t_roof = b * e / ((ver_roof + dr_roof) / 1e3);
        alone += fmt::format("{}{:.1f}", alone.empty() ? "" : " / ", t_alone);
        with_drafts += fmt::format("{}{:.1f}", with_drafts.empty() ? "" : " / ", t_all);
        roof_text += fmt::format("{}{:.1f}", roof_text.empty() ? "" : " / ", t_roof);
        proj.push_back({{"acceptance", a},
                        {"tokens_per_step", e},
                        {"tokens_per_s_verify_only", t_alone},
                        {"tokens_per_s_with_drafts", t_all},
                        {"roofline_tokens_per_s_with_drafts", t_roof}});
      }
      std::printf("%6lld %9.2f (%6.2f) %9.2f (%6.2f) %8.2f %9.2f (%6.2f) %12.1f  %s; %s; %s\n",
                  static_cast<long long>(b), dec, dec_roof, ver, ver_roof, ver / dec, dr, dr_roof,
                  b / (dec / 1e3), alone.c_str(), with_drafts.c_str(), roof_text.c_str());
      j["verify"].push_back({{"batch", b},
                             {"draft_tokens", verify},
                             {"decode_ms", dec},
                             {"decode_roofline_ms", dec_roof},
                             {"verify_ms", ver},
                             {"verify_roofline_ms", ver_roof},
                             {"draft_ms", dr},
                             {"draft_roofline_ms", dr_roof},
                             {"plain_tokens_per_s", b / (dec / 1e3)},
                             {"projections", proj}});
    }
  }
  // W8A8 checkpoints' runs are kept apart from the float model's.
  const std::string name =
      (c.int_quant ? "bench_decode-" + std::string(int_scheme_name(c.int_quant->scheme))
                   : std::string("bench_decode")) +
      (dtype == "bf16" ? "-bf16" : "");
  return run_output.finish(output, name, j) ? 0 : 1;
}
