#include "engine/speculative_stage.h"

#include <algorithm>

#include "base/check.h"

namespace xds::engine {

Result<std::unique_ptr<SpeculativeStage>> SpeculativeStage::create(CausalLm& model,
                                                                   int64_t draft_tokens,
                                                                   int64_t mtp_layers,
                                                                   int64_t valid_vocab) {
  XDS_ASSIGN_OR_RETURN(const MtpSpecConfig spec,
                       mtp_spec_config(draft_tokens, mtp_layers, model.info().n_mtp_layers));
  return std::unique_ptr<SpeculativeStage>(new SpeculativeStage(model, spec, valid_vocab));
}

SpeculativeStage::SpeculativeStage(CausalLm& model, MtpSpecConfig config, int64_t valid_vocab)
    : drafter_(model, config, valid_vocab) {
  stats_.drafted.assign(static_cast<size_t>(config.draft_tokens), 0);
  stats_.accepted.assign(static_cast<size_t>(config.draft_tokens), 0);
}

void SpeculativeStage::verify_tokens(Sequence& s) const {
  XDS_CHECK(s.spec.length == s.computed, "seq {}: speculative length {}, computed {}", s.id,
            s.spec.length, s.computed);
  mtp_spec_verify_tokens(s.spec, s.tokens.back(), s.verify);
}

Result<const SpecVerifyResult*> SpeculativeStage::verify(Sampler& sampler, const Sequence& s,
                                                         const float* rows, int64_t row_stride,
                                                         int64_t valid_vocab) {
  const std::vector<int32_t>& drafts = s.spec.drafts;
  const int64_t n = static_cast<int64_t>(drafts.size());
  SpecVerifyInput in;
  in.logits = rows;
  in.row_stride = row_stride;
  in.valid_vocab = valid_vocab;
  in.drafts = drafts;
  in.options = &s.sampling;
  in.prompt = s.request->req.prompt;
  in.output = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.prompt_len()));
  in.position = static_cast<int64_t>(s.tokens.size());
  XDS_RETURN_IF_ERROR(speculative_accept(sampler, in, verdict_));
  if (n > 0) {
    ++stats_.steps;
    stats_.tokens += verdict_.accepted + 1;
    for (int64_t r = 0; r < n; ++r) {
      ++stats_.drafted[static_cast<size_t>(r)];
      if (r < verdict_.accepted) ++stats_.accepted[static_cast<size_t>(r)];
    }
  }
  return &verdict_;
}

void SpeculativeStage::commit_rows(Sequence& s, const float* hidden, int64_t rows,
                                   int64_t hidden_size) const {
  mtp_spec_commit(s.spec, hidden, rows, hidden_size);
  s.spec_committed = true;
}

Status SpeculativeStage::propose(std::span<Sequence* const> running, KvManager& kv,
                                 KvStorage& storage, int64_t max_model_len, bool run_empty) {
  const MtpSpecConfig& cfg = drafter_.config();
  work_.clear();
  work_seqs_.clear();
  for (Sequence* s : running) {
    if (!s->spec_committed) continue;
    s->spec_committed = false;
    MtpDraftWork w;
    w.state = &s->spec;
    const int64_t length = s->spec.length;
    w.tokens = std::span<const int32_t>(s->tokens).first(static_cast<size_t>(length + 1));
    w.extend_only = static_cast<int64_t>(s->tokens.size()) > length + 1;  // prefilling
    if (!w.extend_only) {
      // Drafts past max_tokens or the context could never be emitted (a verify of n drafts
      // gives at most n + 1 tokens and writes positions up to length + n).
      const int64_t remaining = s->sampling.max_tokens - s->output_len();
      const int64_t room = max_model_len - 1 - length;
      w.passes = std::max<int64_t>(0, std::min({cfg.draft_tokens, remaining - 1, room}));
      // The chain rows' blocks; with none to be had, fewer drafts.
      if (!kv.reserve(s->kv, mtp_spec_propose_end(s->spec, w.passes)).ok()) {
        w.passes = std::min(w.passes, kv.capacity(s->kv) - length + 1);
      }
      if (w.passes == 0) continue;
    }
    w.blocks = kv.table(s->kv);
    work_.push_back(w);
    work_seqs_.push_back(s);
  }
  XDS_RETURN_IF_ERROR(drafter_.propose(work_, storage, run_empty));
  // The chain rows are provisional: their blocks go back (the next verify reserves again).
  // Only the passes' sequences reserved past `computed` (a verify already gave its rest back).
  for (Sequence* s : work_seqs_) {
    if (kv.capacity(s->kv) > s->computed) XDS_RETURN_IF_ERROR(kv.truncate(s->kv, s->computed));
  }
  return {};
}

}  // namespace xds::engine
