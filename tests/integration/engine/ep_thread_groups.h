// What the expert-parallel tests whose DP groups are threads of a thread fabric share
// (ep_rollback_test.cc, ep_scale_down_test.cc): their requests, their engine and exchange
// options, the arena of the fabric, and the pieces of the DP group's loop (dp_group.cc,
// DpGroup::run) they play without sockets: the step header from the planned step, and the
// tokens a step emitted, by request.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/ep_moe_exchange.h"
#include "engine/step_sync.h"
#include "test_models.h"
#include "xccl/layout.h"

namespace xds::engine::ep_test {

// Greedy, `max_tokens` tokens past EOS.
inline EngineRequest greedy(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Request "r<n>": a prompt of 5 + 3n random ids (seed seed_base + n).
inline EngineRequest request_of(int n, int64_t vocab, uint32_t seed_base, int32_t max_tokens) {
  return greedy("r" + std::to_string(n),
                fixtures::random_ids(5 + 3 * n, vocab, seed_base + uint32_t(n)), max_tokens);
}

// f32, one thread, 16 MiB of KV, 64 tokens a step.
inline EngineCoreOptions core_options(const std::string& model_dir) {
  EngineCoreOptions o;
  o.model_dir = model_dir;
  o.model.compute = ComputeDType::kF32;
  o.model.threads = 1;
  o.kv_memory_bytes = int64_t{16} << 20;
  o.max_num_batched_tokens = 64;
  return o;
}

// Every step of the tests in one round of the exchange; a minute before a wait fails.
inline EpMoeOptions ep_options(int redundant_slots = 0) {
  EpMoeOptions o;
  o.redundant_slots = redundant_slots;
  o.max_tokens = 64;
  o.timeout_ms = 60'000;
  return o;
}

// The thread fabric's arena for `groups` groups exchanging with `options` (f32).
inline xccl::ArenaConfig arena_config(const ModelInfo& info, int groups, const EpMoeOptions& options) {
  xccl::ArenaConfig a;
  a.world_size = groups;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = EpMoeExchange::staging_bytes(info, groups, ComputeDType::kF32, options);
  a.app_bytes = 0;
  return a;
}

// Releases the finished requests, plans the next step when there is work and returns its
// header (epoch, step, attempt, one MoE pass, the step's tokens).
inline Result<StepHeader> plan_step(EngineCore& core, uint64_t epoch, uint64_t step,
                                    uint32_t attempt) {
  core.table().release_finished();
  if (core.has_work()) XDS_RETURN_IF_ERROR(core.plan());
  StepHeader h;
  h.epoch = epoch;
  h.step = step;
  h.attempt = attempt;
  h.moe_passes = 1;
  if (core.has_work())
    for (const StepChunk& ch : core.planned().chunks) h.tokens += uint32_t(ch.count);
  return h;
}

// Moves the step's emitted tokens into `tokens` (request id -> tokens so far).
inline void take_tokens(EngineCore& core, std::map<std::string, std::vector<int32_t>>& tokens) {
  for (const TokenDelta& x : core.deltas()) {
    auto& t = tokens[x.request_id];
    t.insert(t.end(), x.tokens.begin(), x.tokens.end());
  }
  core.deltas().clear();
}

}  // namespace xds::engine::ep_test
