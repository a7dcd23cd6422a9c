// The propose half of an MTP speculative step for a DP group's batch (P080-P083; the
// per-request bookkeeping is model/speculative_decode.h, the acceptance rule
// engine/speculative.h): k MTP passes over every request that committed rows this step, each
// pass one forward_mtp call for the whole batch, so that with expert parallelism every device
// runs the same k passes whatever its requests need (a device with no rows joins with none).
//
// A request takes part in one of two ways:
//   propose      its committed tokens end with the last sampled one (a decode just verified,
//                or a prefill just finished): pass p < `passes` carries its rows of pass p
//                (mtp_spec_pass_rows: the draft-extend in a layer's first pass, then the
//                chain row) and takes draft p + 1 from the chunk's last row.
//   extend only  a prefill chunk that is not the prompt's last: passes p < layers carry the
//                draft-extend rows [mtp_length, length) for layer p, so that every block the
//                prefix cache may hand out holds final MTP rows once the step ends.
//
// Thread-safety: not thread-safe (it steps the model); the DP group's main thread owns it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/causal_lm.h"
#include "model/speculative_decode.h"

namespace xds::engine {

struct MtpDraftWork {
  MtpSpecState* state = nullptr;
  std::span<const int32_t> tokens;  // committed tokens x_0 .. x_length (length + 1 of them)
  std::span<const int32_t> blocks;  // block table covering every position a pass writes
  int64_t passes = 0;               // propose: drafts wanted, 0 .. k
  bool extend_only = false;
};

class MtpDrafter {
 public:
  // `model` must outlive the drafter; valid_vocab: drafts are argmaxes over [0, valid_vocab).
  MtpDrafter(CausalLm& model, MtpSpecConfig config, int64_t valid_vocab);

  const MtpSpecConfig& config() const { return config_; }

  // Runs passes 0 .. k-1 over `work`. A pass with no rows still runs when `run_empty` (expert
  // parallelism: the MoE exchange of every device must see it); otherwise it is skipped.
  Status propose(std::span<MtpDraftWork> work, KvStorage& kv, bool run_empty);

 private:
  // The rows `w` contributes to pass `pass`; empty when none.
  MtpPassRows rows_of(MtpDraftWork& w, int64_t pass) const;

  CausalLm& model_;
  MtpSpecConfig config_;
  int64_t valid_vocab_;
  std::vector<MtpChunk> chunks_;  // one pass's chunks
  std::vector<size_t> owners_;    // [chunks] index into work
  std::vector<int64_t> last_row_; // [chunks] the chunk's last row in out_ (batch order)
  StepOutput out_;
};

}  // namespace xds::engine
