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
#include "model/causal_lm.h"

namespace xds::xccl {
class Fabric;
}

namespace xds::engine {

struct DpGroupOptions {
  std::string model_dir;
  ModelOptions model;                  // compute dtype, KV dtype, threads per device
  int32_t max_num_seqs = 256;          // requests holding KV at once
  int32_t max_num_batched_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  bool chunked_prefill = true;
  bool prefix_cache = true;
  int64_t kv_memory_bytes = 0;         // KV planes of this device (0: a default)
  int64_t block_size = 16;
  int64_t max_model_len = 0;           // 0: the model's max_position_embeddings
  std::string control_address;         // shell -> this group (connect a PULL)
  std::string shell_address;           // this group -> shell (connect a PUSH)
  std::string output_address;          // this group -> its output process (connect a PUSH)
  int32_t cpu = -1;                    // pin the device's threads from this core (-1: no)
  int32_t instance = -1;               // the instance's index where a machine runs several
                                       // (base/process_name.h), -1 where it runs one
  int64_t speculative_tokens = 0;      // MTP drafts per decode step (0: off)
  int64_t speculative_mtp_layers = 0;  // MTP layers the drafts use (0: all the model has)
  int32_t redundant_slots = 0;         // EPLB: S spare expert slots per device and MoE layer
  int64_t eplb_window_ns = 60'000'000'000;  // EPLB collect window (engine/eplb_agent.h)
  // Prefill/decode disaggregation (engine/distflow.h): a prefill instance's groups keep their
  // KV in a region they export to decode groups (link name distflow_link_name(shell pid,
  // group)); a parked transfer nobody completes in kv_transfer_timeout_ns is freed.
  bool export_kv = false;
  // This instance's host for KV transfers: a prefill group also listens for UCX pulls there
  // (empty: shared memory only); a decode group compares it with the prefill side's address
  // to pick the backend. kv_transfer_backend: auto | shm | ucx (engine/distflow.h).
  std::string kv_transfer_host;
  std::string kv_transfer_backend = "auto";
  // The single-level cooperative prefill scheduler (engine/cooperative_prefill.h): every
  // request reaches every group and they assign them together each step (prefill instances
  // with several groups).
  bool cooperative_prefill = false;
  int64_t kv_transfer_timeout_ns = 60'000'000'000;
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
