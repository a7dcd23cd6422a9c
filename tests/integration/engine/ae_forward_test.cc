// MoE/attention disaggregation end to end below the serving layer: A attention device
// processes run the forward pass of a small random model with AeMoeExchange (their step
// headers among themselves, rank 0 posting the expert devices' step notices), X expert device
// processes run run_expert_device (engine/expert_device.h) as they do in an instance. Every
// attention device compares its teacher-forced logits (f32) with a single-process run of the
// same prompts (LocalMoeExchange, every expert local) computed by the launcher before the
// devices start: within 1e-4 relative to the row's max |logit|, and the same argmax wherever
// the reference's top-1 margin exceeds that. Devices take prompts of different lengths, so in
// some steps a device has no tokens (it joins every microbatch and round with none), and the
// exchange's rounds are small (max_tokens 8) so a step's microbatch spans several rounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "engine/ae_moe_exchange.h"
#include "engine/expert_device.h"
#include "engine/step_sync.h"
#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "xccl/launcher.h"
#include "xccl/transport.h"

namespace xds::engine {
namespace {

constexpr double kF32Tolerance = 1e-4;  // A/E changes only the summation order

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<float> ref;  // [len, vocab] the single-process run's logits
};

std::string make_model() {
  const std::string dir = (std::filesystem::temp_directory_path() / "xds_ae_forward_tiny").string();
  MkModelOptions o;
  o.out_dir = dir;
  o.seed = 31;
  o.progress = false;
  o.threads = 1;
  const Status s = write_random_checkpoint(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

ModelOptions model_options() {
  ModelOptions mo;
  mo.compute = ComputeDType::kF32;
  mo.threads = 1;
  return mo;
}

// |got - ref| <= tol * max |ref| over the row, and the argmax where the margin is safe.
std::string compare_row(const float* got, const float* ref, int64_t vocab, double& worst_rel) {
  double mx = 0, worst = 0;
  int64_t top = 0, got_top = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    mx = std::max(mx, std::fabs(double(ref[i])));
    worst = std::max(worst, std::fabs(double(got[i]) - double(ref[i])));
    if (ref[i] > ref[top]) top = i;
    if (got[i] > got[got_top]) got_top = i;
  }
  worst_rel = std::max(worst_rel, mx > 0 ? worst / mx : worst);
  double second = -1e300;
  for (int64_t i = 0; i < vocab; ++i)
    if (i != top) second = std::max(second, double(ref[i]));
  if (worst > kF32Tolerance * mx)
    return fmt::format("max |diff| {} > {} x max |logit| {}", worst, kF32Tolerance, mx);
  if (double(ref[top]) - second > kF32Tolerance * mx && got_top != top)
    return fmt::format("argmax {} != reference {}", got_top, top);
  return "";
}

// One attention device: prompts i % A == rank, one whole prompt per step, then a stop.
int run_attention(xccl::Fabric& f, const std::string& dir, const std::vector<Prompt>& prompts,
                  const AeOptions& ae) {
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "attention %d: %s\n", f.rank(), what.c_str());
    return 1;
  };
  auto model = DeepseekV3Model::load(dir, model_options());
  if (!model.ok()) return fail(model.status().to_string());
  DeepseekV3Model& m = **model;
  auto transport = xccl::make_transport("shm", f);
  if (!transport.ok()) return fail(transport.status().to_string());
  xccl::Mailbox mb(f, **transport);
  auto ex = AeMoeExchange::create(m, mb, ae);
  if (!ex.ok()) return fail(ex.status().to_string());
  m.set_moe_exchange(ex->get());
  std::vector<int> ranks;
  for (int r = 0; r < ae.shape.attention; ++r) ranks.push_back(r);
  StepSync sync(mb, ranks, 60'000);
  const int me = f.rank(), a = ae.shape.attention;
  const int64_t vocab = m.info().vocab_size;
  std::vector<int> mine;
  for (int i = 0; i < int(prompts.size()); ++i)
    if (i % a == me) mine.push_back(i);
  auto cache = m.make_cache(512);
  if (!cache.ok()) return fail(cache.status().to_string());
  size_t next = 0;
  int errors = 0, rows = 0;
  double worst = 0;
  for (uint64_t step = 0;; ++step) {
    std::vector<TokenChunk> chunks;
    int prompt = -1;
    if (next < mine.size()) {
      prompt = mine[next++];
      auto ch = cache->chunk(cache->add_sequence(), 0, prompts[size_t(prompt)].ids, true);
      if (!ch.ok()) return fail(ch.status().to_string());
      chunks.push_back(*ch);
    }
    StepHeader h;
    h.epoch = f.epoch();
    h.step = step;
    h.tokens = chunks.empty() ? 0 : uint32_t(chunks[0].tokens.size());
    h.moe_passes = h.tokens > 0 ? 1 : 0;
    h.stop = chunks.empty();
    auto d = sync.exchange(h);
    if (!d.ok()) return fail(d.status().to_string());
    AeStepNotice notice;
    notice.step = d->step;
    notice.kind = d->action == StepAction::kRun ? AeStepNotice::kRun : AeStepNotice::kStop;
    if (me == 0) {
      const Status st = (*ex)->notify_experts(notice);
      if (!st.ok()) return fail(st.to_string());
    }
    if (d->action != StepAction::kRun) break;
    (*ex)->set_step(f.epoch(), uint32_t(d->step), d->max_tokens);
    StepOutput out;
    const Status st = m.forward(chunks, cache->storage(), out);
    if (!st.ok()) return fail(fmt::format("step {}: {}", step, st.to_string()));
    if (prompt < 0) continue;
    for (size_t t = 0; t < chunks[0].tokens.size(); ++t, ++rows) {
      const std::string why = compare_row(out.logits.data() + int64_t(t) * vocab,
                                          prompts[size_t(prompt)].ref.data() + int64_t(t) * vocab,
                                          vocab, worst);
      if (!why.empty() && ++errors <= 5)
        std::fprintf(stderr, "attention %d prompt %d position %zu: %s\n", me, prompt, t,
                     why.c_str());
    }
  }
  std::fprintf(stderr, "attention %d: %d rows, %d errors, worst |diff| / max|logit| %.2e\n", me,
               rows, errors, worst);
  return errors == 0 && rows > 0 ? 0 : 1;
}

void run_case(const AeShape& shape, bool trampoline = true) {
  const std::string dir = make_model();
  auto reference = DeepseekV3Model::load(dir, model_options());
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  const ModelInfo info = (*reference)->info();
  const int lengths[] = {11, 4, 17, 6, 9, 13, 2};
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int32_t> id(0, int32_t(info.vocab_size - 1));
  std::vector<Prompt> prompts;
  for (int n : lengths) {
    Prompt p;
    for (int i = 0; i < n; ++i) p.ids.push_back(id(rng));
    auto cache = (*reference)->make_cache(n + 16);
    ASSERT_TRUE(cache.ok());
    auto ch = cache->chunk(cache->add_sequence(), 0, p.ids, true);
    ASSERT_TRUE(ch.ok()) << ch.status().to_string();
    StepOutput out;
    ASSERT_TRUE((*reference)->forward({&*ch, 1}, cache->storage(), out).ok());
    p.ref = out.logits;
    prompts.push_back(std::move(p));
  }
  reference->reset();  // its pool's threads stop before the devices fork
  AeOptions ae;
  ae.shape = shape;
  ae.max_tokens = 8;  // a 17-token prompt in one microbatch takes three rounds
  ae.timeout_ms = 60'000;
  ae.trampoline = trampoline;
  xccl::LaunchOptions lo;
  lo.devices = ae_world_size(shape);
  lo.arena.lanes = 1;
  lo.arena.ring_slots = 1;
  lo.arena.slot_bytes = 64;
  lo.arena.staging_bytes = ae_staging_bytes(info, ComputeDType::kF32, ae);
  lo.arena.app_bytes = 0;
  ExpertDeviceOptions eo;
  eo.model_dir = dir;
  eo.model = model_options();
  eo.ae = ae;
  auto exits = xccl::launch_devices(lo, [&](xccl::Fabric& f) {
    if (ae_is_expert_rank(shape, f.rank())) return run_expert_device(f, eo);
    return run_attention(f, dir, prompts, ae);
  });
  ASSERT_TRUE(exits.ok()) << exits.status().to_string();
  for (size_t r = 0; r < exits->size(); ++r)
    EXPECT_TRUE((*exits)[r].ok()) << "device " << r << " exit " << (*exits)[r].exit_code
                                  << " signal " << (*exits)[r].signal;
}

// Two trampolines forwarding to three expert devices (3 does not divide the experts).
TEST(AeForward, TwoAttentionThreeExpertsMatchTheSingleProcessLogits) {
  run_case({.attention = 2, .experts = 3, .domains = 1, .microbatches = 1});
}
// Two domains taking turns, two microbatches each, every expert device a trampoline of its
// domain's only group or none.
TEST(AeForward, TwoDomainsTwoMicrobatchesMatchTheSingleProcessLogits) {
  run_case({.attention = 3, .experts = 2, .domains = 2, .microbatches = 2});
}

// Without trampoline: each attention device dispatches to every expert device itself.
TEST(AeForward, WithoutTrampolineMatchesTheSingleProcessLogits) {
  run_case({.attention = 2, .experts = 3, .domains = 2, .microbatches = 2}, false);
}

}  // namespace
}  // namespace xds::engine
