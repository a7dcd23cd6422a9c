// The DP group's requests and sequences between steps: what the scheduler sees, what a step
// feeds the model, and what it commits afterwards. One Sequence per choice of a request
// (n > 1 forks the prefilled sequence). The model, the KV storage and the sockets stay in
// dp_group.cc; this is the bookkeeping in between.
//
// A sequence's tokens are prompt + output; `computed` positions have KV. It prefills
// towards `target` (the prompt, or prompt + output after a preemption), then decodes one
// position per step: the token at `computed` (the last sampled one) goes in, one comes out.
//
// Thread-safety: not thread-safe; the device's main thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "protocol/payloads.h"
#include "model/speculative_decode.h"

namespace xds::engine {

enum class SeqState : uint8_t {
  kWaiting,    // placed, holds no KV
  kRunning,    // holds KV (prefilling or decoding)
  kPreempted,  // lost its KV; recomputed when admitted again
  kAwaitingKv, // decode phase of a disaggregated request: its KV waits on a prefill group
  kPullingKv,  // its blocks reserved, the pull posted (KvPuller): running once it completes
  kParked,     // prefill phase done: holds its KV until the decode side has pulled it
  kFinished,
};

struct Request;

struct Sequence {
  int64_t id = 0;        // unique in the group
  int64_t arrival = 0;   // FCFS order (forks share their parent's, +index)
  Request* request = nullptr;
  int32_t index = 0;     // choice index
  SamplingOptions sampling;  // the request's, with the choice's seed (choice_seed)
  SeqState state = SeqState::kWaiting;
  std::vector<int32_t> tokens;  // prompt + output
  int64_t computed = 0;         // positions with KV
  int64_t target = 0;           // prefill target
  int64_t output_sent = 0;      // output tokens already sent to the output process
  int64_t kv = -1;              // KvManager sequence id while holding KV
  int32_t cached_tokens = 0;    // prompt tokens attached from the prefix cache
  bool forked = false;          // n > 1 children exist (choice 0 only)
  std::string finish_reason;
  // MTP speculative decoding (k > 0): drafts and the rows waiting for the draft-extend
  // (spec.length == computed between steps), this step's verify chunk [x_L, drafts], and
  // whether rows were committed this step (it then joins this step's MTP passes).
  MtpSpecState spec;
  std::vector<int32_t> verify;
  bool spec_committed = false;
  // Prefill/decode disaggregation: the index in the step's deltas of the first-token delta
  // that carries the handoff (-1: none), and the transfer id while parked.
  int64_t handoff_delta = -1;
  uint64_t transfer = 0;
  bool cancel_after_pull = false;  // cancelled while its blocks were being written

  int64_t prompt_len() const;
  int64_t output_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len(); }
};

struct Request {
  EngineRequest req;
  std::vector<Sequence*> choices;  // [n], choice 0 first; the others after the fork
  bool cancelled = false;
  int32_t finished = 0;            // choices finished
};

inline int64_t Sequence::prompt_len() const {
  return static_cast<int64_t>(request->req.prompt.size());
}

// The choice's sampling seed: choice 0 keeps the request's, so n = 1 and the first of n agree.
uint64_t choice_seed(uint64_t seed, int32_t index);

// Why decoding stops after `token` was appended (output_len already counts it): "stop" (an
// eos id of the model unless ignore_eos, or a stop_token_id), "length" (max_tokens or the
// context's end at max_model_len), or "" to go on.
std::string finish_reason_after(const Sequence& s, int32_t token,
                                const std::vector<int32_t>& eos_ids, int64_t max_model_len);

}  // namespace xds::engine
