// The payloads of the control messages (protocol/messages.h) between the gateway, an
// instance's shell, its DP groups and their output processes (docs/design/flowserve.md,
// "Messages"): requests, token and text deltas, loads, EPLB commands and reports. Tensors
// never travel here (XCCL only); token ids do, a step's worth at a time. Every struct encodes
// as a JSON/MessagePack object whose field names are its member names; a missing field keeps
// its default, and enums travel as their integer values.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xds::protocol {

// Sampling and stopping, per request (the OpenAI fields after validation by the gateway).
struct SamplingOptions {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0: off
  uint64_t seed = 0;         // the gateway draws one when the client gave none
  float presence_penalty = 0.0f;    // [-2, 2], OpenAI semantics
  float frequency_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f;  // > 0, vLLM/HF semantics (divides positive logits)
  int32_t max_tokens = 16;          // >= 1 (the gateway fills the context's remainder)
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: none; k >= 0: the chosen token's logprob plus the top k
  int32_t n = 1;          // completions forked from one prefilled sequence
  std::vector<int32_t> stop_token_ids;  // besides the model's eos ids (unless ignore_eos)
};

// What the output process does with the ids (P056).
struct OutputOptions {
  bool detokenize = true;            // false: token ids only (models without a tokenizer)
  bool skip_special_tokens = true;
  std::vector<std::string> stop;     // stop strings; the matched text is not returned
  std::string reasoning_parser;      // "" (none) or "deepseek_r1" (<think>...</think>)
  bool prompt_in_reasoning = false;  // the templated prompt ends inside <think> (DeepSeek-R1's
                                     // template opens it): the output starts as reasoning
  std::string tool_call_parser;      // "" (none), "deepseek_v3", "qwen3" or "kimi_k2"
  bool tools_requested = false;      // the request carried tools (parse only then)
  bool stream = false;
  bool echo_prompt_ids = false;      // report prompt token ids in usage (bench clients)
};

// Prefill/decode disaggregation (DistFlow, P098-P103): where a prefilled request's KV waits
// and what a decode DP group needs to continue it. Metadata only: the KV stays in the prefill
// DP group's exported region until the decode side pulls it. Empty `link`: no handoff.
struct KvHandoff {
  std::string link;             // the prefill DP group's link name (xccl/link.h)
  std::string ucx_address;      // its UCX listener, "host:port" (empty: shared memory only)
  uint64_t transfer = 0;        // that group's transfer id (the key of its completion)
  std::vector<int32_t> blocks;  // block ids of the prompt's KV in its region, in order
  int64_t rows = 0;             // KV rows written: positions [0, rows)
  std::vector<int32_t> output;  // the tokens generated so far (the first token)
  std::string kv_format;        // model, layers, block size, planes (engine/distflow.h)
  int32_t prefill_group = -1;
  // MTP: the drafts the prefill side's passes proposed for the positions after the first
  // token (their MTP rows up to `rows` moved with the blocks), verified by the first decode step.
  std::vector<int32_t> drafts;
  // XXH3-64 of each block's bytes as the prefill side parked them ([blocks.size()]; empty
  // from a sender without checksums): the decode side checks every block it pulled (P120).
  std::vector<uint64_t> block_sums;
};

// Where a request runs its phases.
enum class RequestPhase : int32_t {
  kWhole = 0,        // prefill and decode here (colocated)
  kPrefillOnly = 1,  // prefill, stream the first token, then hand the KV off (P098)
  kDecode = 2,       // continue a handoff (EngineRequest::handoff): pull the KV, decode
};

// A tokenized request, placed once by the shell on one DP group.
struct EngineRequest {
  std::string id;                // unique per gateway ("cmpl-...")
  std::vector<int32_t> prompt;   // token ids, already templated
  SamplingOptions sampling;
  OutputOptions output;
  std::string reply_to;          // ZeroMQ address of the gateway's output socket
  int64_t arrival_us = 0;        // gateway clock (steady), for TTFT
  RequestPhase phase = RequestPhase::kWhole;
  KvHandoff handoff;             // kDecode
  // > 0: shared by every DP group of a cooperative prefill instance, numbered in the order
  // the shell sent it (engine/cooperative_prefill.h); the groups agree who prefills it.
  uint64_t pool_number = 0;
  // Token recomputation (docs/design/reliability.md): the request lost its KV (its group or
  // instance failed) and is sent again. resume[i]: the output ids choice i already streamed
  // to the client (empty, or n entries); resume_finished[i] != 0: choice i has ended. The DP
  // group re-prefills prompt + resume[i] and samples from the next position on (the sampler
  // is counter-based, so the tokens are those of a run without the fault); the output process
  // replays resume[i] without sending it.
  std::vector<std::vector<int32_t>> resume;
  std::vector<int32_t> resume_finished;
  // The gateway's attempt number of this request (0 first, +1 per resend): its output deltas
  // carry it, so a delta of an earlier attempt that arrives late is dropped, never streamed.
  int32_t attempt = 0;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // best first, k entries
};

struct ToolCall {
  std::string id;         // "call_..."
  std::string name;
  std::string arguments;  // JSON text as the model wrote it
};

// One DP group step's worth of new tokens for one choice of one request (device -> output
// process). finish_reason is set on the last.
struct TokenDelta {
  std::string request_id;
  int32_t index = 0;  // choice index (n > 1)
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // one per token when requested
  std::string finish_reason;           // "", "stop" (eos / stop token), "length", "abort"
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  KvHandoff handoff;          // a prefill-only request's last delta: the output state moves on
};

// Output process -> gateway: text ready to stream for one choice.
struct OutputDelta {
  std::string request_id;
  int32_t index = 0;
  std::string text;              // content
  std::string reasoning;         // reasoning_content
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;      // aligned with token_ids
  std::vector<std::string> token_texts;    // the text of each token in token_ids (logprobs)
  std::vector<ToolCall> tool_calls;        // complete calls, once parsed
  std::string finish_reason;               // "", "stop", "length", "tool_calls", "abort"
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;           // so far, this choice
  int32_t cached_tokens = 0;
  std::string error;                       // non-empty: the request failed (message)
  KvHandoff handoff;  // set: the prefill side is done; the gateway places the decode phase
  int32_t attempt = 0;  // EngineRequest::attempt of the request it answers
};

// Per-DP-group load, sent by each DP group to its shell after steps (at most every few ms)
// and used by the placement rule (P059).
struct GroupLoad {
  int32_t group = 0;
  int32_t running = 0;           // requests holding KV
  int32_t waiting = 0;           // placed, not yet running
  int32_t max_num_seqs = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_reserved = 0;  // promised to placed requests' expected output
  int64_t block_size = 16;
  int64_t prefix_hits = 0, prefix_queries = 0;  // blocks, cumulative
  int64_t steps = 0;
  double last_batch_size = 0;
  int64_t preemptions = 0;  // cumulative
  int64_t kv_blocks_retired = 0;  // cumulative: KV blocks taken out of use (bad memory)
  // MTP speculative decoding, cumulative: verify steps that had drafts, the tokens those steps
  // gave (accepted drafts + 1 each), and per draft position i the drafts verified and accepted.
  int64_t spec_steps = 0;
  int64_t spec_tokens = 0;
  std::vector<int64_t> spec_drafted;   // [k]
  std::vector<int64_t> spec_accepted;  // [k]
  // DistFlow: transfers parked here now; cumulative: completed by a decode group, expired
  // (freed after the deadline), and the KV bytes this group pulled as a decode side.
  int64_t kv_parked = 0, kv_transfers_done = 0, kv_transfers_expired = 0, kv_pulled_bytes = 0;
  // DistFlow link probing (P116), cumulative, decode side: probes a prefill group answered
  // while a pull ran slow (the link saturated), pulls whose link failed, handoffs recomputed.
  int64_t kv_probes_saturated = 0, kv_links_failed = 0, kv_handoffs_recomputed = 0;
  // Pulls whose blocks did not match the prefill side's checksums (the blocks that held bad
  // bytes are retired, the handoff recomputed), cumulative, decode side.
  int64_t kv_checksum_mismatches = 0;
  int64_t moe_ns = 0;       // expert-parallel MoE phase (dispatch to combine done), cumulative
  // Steps every group rolled back and ran again after a transient exchange error, cumulative
  // (engine/step_sync.h, StepAttempts).
  int64_t rollbacks = 0;
  // Tokens this group routed to each logical expert, cumulative (CausalLm::
  // routed_token_counts): [moe_layers.size(), n_experts] row-major. Sent about once a second;
  // empty in the loads between (the shell keeps the last one it got).
  std::vector<int64_t> expert_tokens;
  std::vector<int64_t> moe_layers;  // the cache-layer id of each row of expert_tokens
  int64_t n_experts = 0;
  // EPLB collect windows (--eplb-window): the counts of the window that just closed, sent
  // once per window (window_seq > 0; 0: no window in this load). Rows follow moe_layers.
  int64_t window_seq = 0;                    // this group's window number, from 1
  std::vector<int64_t> window_expert_tokens;  // [moe_layers, n_experts] routed by this group
  std::vector<int64_t> window_slot_tokens;    // [moe_layers, slots_per_device] computed by
                                              // this device's slots (token-expert pairs)
  int64_t slots_per_device = 0;               // E / N + S
  uint64_t window_map_version = 0;  // the map in force when the window closed
  bool window_uniform = false;      // that map was in force for the whole window
};

// EPLB reconfiguration (P077), shell -> every DP group. The shell plans a map (version
// `version`); the map with the redundant slots disabled is version - 1; base_version =
// version - 2 is the map in force when planned.
//   kPrepare: the new maps; each device prefetches its new replicas' weights into staging
//             memory and reports kPrepared or kFailed.
//   kCommit:  every device prepared: advertise version - 1 in the step header (the disabled
//             map needs no weights), switch when every device has, load the slots, advertise
//             `version`, switch when every device has (the same step boundary everywhere).
//   kAbort:   some device failed: drop the staging, the map in force stays.
enum class EplbOp : int32_t { kPrepare = 1, kCommit = 2, kAbort = 3 };
struct EplbCommand {
  EplbOp op = EplbOp::kPrepare;
  uint64_t version = 0;
  // [moe_layers][n_experts] -> physical slot ids (primary first); kPrepare only.
  std::vector<int64_t> moe_layers;
  std::vector<std::vector<std::vector<int32_t>>> replicas;
};

// DP group -> shell: where its side of a reconfiguration stands.
enum class EplbState : int32_t { kPrepared = 1, kSwitched = 2, kFailed = 3, kAborted = 4 };
struct EplbReport {
  int32_t group = -1;
  uint64_t version = 0;
  EplbState state = EplbState::kPrepared;
  std::string error;            // kFailed: what failed
  uint64_t disable_step = 0;    // kSwitched: the step the disabled map took effect
  uint64_t switch_step = 0;     // kSwitched: the step the new map took effect
  int64_t loaded_bytes = 0;     // kSwitched: bytes copied into this device's slots
};

// Fault injection (POST /admin/faults, serve/fault_injection.h): what strikes a DP group.
enum class FaultKind : int32_t {
  kKill = 1,            // the device process kills itself (SIGKILL)
  kHang = 2,            // its step loop stops for good (no answer, no step)
  kExchangeError = 3,   // the next step's MoE exchange fails once (rolled back, re-run)
  kLinkDelay = 4,       // its DistFlow link serves slowly for duration_ms (probes answered)
  kLinkDrop = 5,        // its DistFlow link stops answering for duration_ms
  kRetireKvBlocks = 6,  // `blocks` of its KV blocks in use are retired (bad memory)
  kKvCorrupt = 7,       // its next KV pull lands with `blocks` blocks corrupted (bad memory)
};
struct FaultSpec {
  uint64_t id = 0;           // the shell's number for it
  FaultKind kind = FaultKind::kKill;
  int32_t instance = 0;      // the instance's index in the gateway's list
  int32_t group = 0;         // the DP group it strikes
  int64_t after_steps = 0;   // steps of that group after it arrives
  int64_t duration_ms = 0;   // link faults
  int64_t blocks = 1;        // kRetireKvBlocks, kKvCorrupt
};

// Stores `incoming` in `kept` (the same group's previous load), keeping kept's expert counts
// when `incoming` carries none (they are sent about once a second, the rest of a load far
// more often).
void merge_load(GroupLoad& kept, GroupLoad incoming);

// JSON field names = member names; missing fields keep their defaults.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SamplingOptions, temperature, top_p, top_k, seed,
                                                presence_penalty, frequency_penalty,
                                                repetition_penalty, max_tokens, ignore_eos,
                                                logprobs, n, stop_token_ids)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OutputOptions, detokenize, skip_special_tokens, stop,
                                                reasoning_parser, prompt_in_reasoning,
                                                tool_call_parser,
                                                tools_requested, stream, echo_prompt_ids)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(KvHandoff, link, ucx_address, transfer, blocks,
                                                rows, output, kv_format, prefill_group, drafts,
                                                block_sums)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EngineRequest, id, prompt, sampling, output,
                                                reply_to, arrival_us, phase, handoff,
                                                pool_number, resume, resume_finished, attempt)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TokenLogprob, token, logprob, top)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ToolCall, id, name, arguments)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TokenDelta, request_id, index, tokens, logprobs,
                                                finish_reason, prompt_tokens, cached_tokens,
                                                handoff)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OutputDelta, request_id, index, text, reasoning,
                                                token_ids, logprobs, token_texts, tool_calls,
                                                finish_reason, prompt_tokens, completion_tokens,
                                                cached_tokens, error, handoff, attempt)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GroupLoad, group, running, waiting, max_num_seqs,
                                                kv_blocks_total, kv_blocks_used,
                                                kv_blocks_reserved, block_size, prefix_hits,
                                                prefix_queries, steps, last_batch_size,
                                                preemptions, spec_steps, spec_tokens, spec_drafted,
                                                spec_accepted, moe_ns, expert_tokens, moe_layers,
                                                n_experts,
                                                window_seq, window_expert_tokens,
                                                window_slot_tokens, slots_per_device,
                                                window_map_version, window_uniform, kv_parked,
                                                kv_transfers_done, kv_transfers_expired,
                                                kv_pulled_bytes, kv_probes_saturated,
                                                kv_links_failed, kv_handoffs_recomputed,
                                                kv_checksum_mismatches,
                                                kv_blocks_retired, rollbacks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FaultSpec, id, kind, instance, group, after_steps,
                                                duration_ms, blocks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EplbCommand, op, version, moe_layers, replicas)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EplbReport, group, version, state, error,
                                                disable_step, switch_step, loaded_bytes)

}  // namespace xds::protocol

// The DP group and its parts name the payloads as their own (engine::EngineRequest, ...).
namespace xds::engine {
using protocol::EngineRequest;
using protocol::EplbCommand;
using protocol::EplbOp;
using protocol::EplbReport;
using protocol::EplbState;
using protocol::GroupLoad;
using protocol::KvHandoff;
using protocol::merge_load;
using protocol::OutputDelta;
using protocol::OutputOptions;
using protocol::RequestPhase;
using protocol::SamplingOptions;
using protocol::TokenDelta;
using protocol::TokenLogprob;
using protocol::ToolCall;
}  // namespace xds::engine
