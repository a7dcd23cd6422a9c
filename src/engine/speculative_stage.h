// MTP speculative decoding of the DP group (P080-P083) as one unit: the verify chunk a
// decode feeds ([x_L, drafts]), the acceptance rule over its rows (engine/speculative.h),
// the bookkeeping of the committed rows (model/speculative_decode.h) and the k MTP passes
// that propose the next drafts for the whole batch (engine/mtp_drafter.h). The request table
// (engine/request_table.h) calls it around a step; it holds no request state of its own but
// the counters.
//
// Thread-safety: not thread-safe (it steps the model); the owner's thread uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/kv_manager.h"
#include "engine/mtp_drafter.h"
#include "engine/request_table.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "model/causal_lm.h"

namespace xds::engine {

// Counters since creation: verify steps that had drafts, the tokens they gave, and per draft
// position the drafts verified and accepted ([draft_tokens] each).
struct SpecStats {
  int64_t steps = 0, tokens = 0;
  std::vector<int64_t> drafted, accepted;
};

class SpeculativeStage {
 public:
  // `draft_tokens` k > 0 drafts per decode step from `mtp_layers` MTP layers (0: all the
  // model has). InvalidArgument (naming the flags) as mtp_spec_config. `model` must outlive
  // the stage; drafts are argmaxes over [0, valid_vocab).
  static Result<std::unique_ptr<SpeculativeStage>> create(CausalLm& model, int64_t draft_tokens,
                                                          int64_t mtp_layers,
                                                          int64_t valid_vocab);

  int64_t draft_tokens() const { return drafter_.config().draft_tokens; }
  const MtpSpecConfig& config() const { return drafter_.config(); }

  // s.verify = [x_L, drafts]: the decode chunk's tokens (s.spec.length == s.computed).
  void verify_tokens(Sequence& s) const;
  // The acceptance rule over the verify rows ([1 + drafts, row_stride]) of `s`; counts it.
  // The result is valid until the next call.
  Result<const SpecVerifyResult*> verify(Sampler& sampler, const Sequence& s, const float* rows,
                                         int64_t row_stride, int64_t valid_vocab);
  // `rows` positions of `s` committed this step, `hidden` their final-normed hidden
  // ([rows, hidden_size]); s joins the step's MTP passes.
  void commit_rows(Sequence& s, const float* hidden, int64_t rows, int64_t hidden_size) const;
  // The step's MTP passes over the running sequences that committed rows: drafts for the
  // next step and the draft-extend rows. The chain rows' blocks are reserved from `kv` and
  // given back after. `run_empty`: every pass runs even with no rows (expert parallelism).
  Status propose(std::span<Sequence* const> running, KvManager& kv, KvStorage& storage,
                 int64_t max_model_len, bool run_empty);

  const SpecStats& stats() const { return stats_; }

 private:
  SpeculativeStage(CausalLm& model, MtpSpecConfig config, int64_t valid_vocab);

  MtpDrafter drafter_;
  SpecVerifyResult verdict_;
  std::vector<MtpDraftWork> work_;
  std::vector<Sequence*> work_seqs_;  // [work_]
  SpecStats stats_;
};

}  // namespace xds::engine
