// A DP group (P050): one device process that owns its requests, scheduler, KV blocks,
// prefix cache, executor and sampler, and streams token ids to its output process. Its parts:
// the engine core (engine/engine_core.h: model, KV, request table, scheduler, sampler,
// speculative stage), the handoff stage (engine/handoff_stage.h: DistFlow and the cooperative
// prefill pool), and the loop in dp_group.cc (sockets, step sync, sleep, load reports, the
// EPLB agent). With expert parallelism (n_groups > 1) every MoE layer dispatches and combines
// over XCCL with the other groups, so all groups step together: before each step they
// exchange a header (engine/step_sync.h); a group without work joins with zero tokens, and
// when no group has work they all sleep on their control socket until the shell's next kWake.
//
// Thread-safety: run_dp_group() owns everything it creates; it runs on the device process's
// main thread.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "engine/ae_moe_exchange.h"
#include "engine/engine_core.h"
#include "engine/handoff_stage.h"
#include "model/causal_lm.h"

namespace xds::xccl {
class Fabric;
}

namespace xds::engine {

struct DpGroupOptions {
  // The model, the KV cache, the scheduler's limits and speculative decoding. Its
  // park_prefill_only follows handoff.export_kv, and its kv_storage is the handoff stage's.
  EngineCoreOptions core;
  // Prefill/decode disaggregation (engine/distflow.h): a prefill instance's groups keep their
  // KV in a region they export to decode groups (link name distflow_link_name(shell pid,
  // group), filled with the rank by the group); the single-level cooperative prefill
  // scheduler (engine/cooperative_prefill.h) for prefill instances with several groups.
  HandoffOptions handoff;
  std::string control_address;              // shell -> this group (connect a PULL)
  std::string shell_address;                // this group -> shell (connect a PUSH)
  std::string output_address;               // this group -> its output process (connect a PUSH)
  int32_t cpu = -1;                         // pin the device's threads from this core (-1: no)
  int32_t instance = -1;                    // the instance's index where a machine runs several
                                            // (base/process_name.h), -1 where it runs one
  int32_t redundant_slots = 0;              // EPLB: S spare expert slots per device and MoE layer
  int64_t eplb_window_ns = 60'000'000'000;  // EPLB collect window (engine/eplb_agent.h)
  // A step that fails with the fabric (a peer group died or hung) waits for the shell to
  // scale the instance down (protocol::ReformMsg) instead of ending the group.
  bool scale_down = false;
  // Started again after it was lost (xccl::DeviceGroup::respawn): it waits for the shell's
  // reform to join the others' fabric before it steps.
  bool rejoining = false;
  // MoE/attention disaggregation (engine/ae_moe_exchange.h): this group is an attention
  // group of an A/E instance (fabric ranks 0 .. A-1 attention, A .. A+X-1 expert devices);
  // its MoE layers go over A2E/E2A, its step headers only between attention groups, and
  // rank 0 sends the expert devices their step notices. No EPLB, no scale-down.
  bool ae_mode = false;
  AeOptions ae;
};

// XCCL staging bytes each device's arena needs for the expert-parallel exchange of `dp`
// devices running this model (1 MiB for dp = 1: no exchange). Reads the model's config.json
// only (load_model_info). InvalidArgument, naming --dp and the model, when dp > 1 and the model has
// no MoE layers (nothing for expert parallelism to spread).
Result<uint64_t> ep_staging_bytes(const std::string& model_dir, const ModelOptions& model,
                                  int32_t max_num_batched_tokens, int dp,
                                  int32_t redundant_slots = 0);

// The device process's main: serves until kShutdown (after draining) and returns the exit
// code (0 ok). `fabric` is this device's view of the instance (world = n_groups).
int run_dp_group(xccl::Fabric& fabric, const DpGroupOptions& options);

}  // namespace xds::engine
