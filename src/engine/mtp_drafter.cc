#include "engine/mtp_drafter.h"

#include "base/check.h"

namespace xds::engine {

MtpDrafter::MtpDrafter(CausalLm& model, MtpSpecConfig config, int64_t valid_vocab)
    : model_(model), config_(config), valid_vocab_(valid_vocab) {}

MtpPassRows MtpDrafter::rows_of(MtpDraftWork& w, int64_t pass) const {
  const int64_t d = model_.info().hidden_size;
  if (w.extend_only) {
    if (pass >= config_.layers) return {};
    return mtp_spec_extend_rows(*w.state, w.tokens, d);
  }
  if (pass >= w.passes) return {};
  return mtp_spec_pass_rows(*w.state, config_, pass, w.tokens, d);
}

Status MtpDrafter::propose(std::span<MtpDraftWork> work, KvStorage& kv, bool run_empty) {
  const int64_t d = model_.info().hidden_size;
  const int64_t vocab = model_.info().vocab_size;
  for (int64_t pass = 0; pass < config_.draft_tokens; ++pass) {
    chunks_.clear();
    owners_.clear();
    last_row_.clear();
    int64_t rows = 0;
    for (size_t i = 0; i < work.size(); ++i) {
      const MtpPassRows r = rows_of(work[i], pass);
      if (r.rows() == 0) continue;
      chunks_.push_back(MtpChunk{.start_pos = r.start_pos,
                                 .next_tokens = r.next_tokens,
                                 .hidden = r.hidden,
                                 .blocks = work[i].blocks});
      owners_.push_back(i);
      rows += r.rows();
      last_row_.push_back(rows - 1);
    }
    if (chunks_.empty() && !run_empty) continue;
    XDS_RETURN_IF_ERROR(
        model_.forward_mtp(mtp_spec_layer(config_, pass), chunks_, kv, out_));
    XDS_CHECK(static_cast<int64_t>(out_.logits.size()) == rows * vocab &&
                  static_cast<int64_t>(out_.hidden.size()) == rows * d,
              "MTP pass {}: {} logits and {} hidden values for {} rows", pass, out_.logits.size(),
              out_.hidden.size(), rows);
    for (size_t c = 0; c < chunks_.size(); ++c) {
      MtpDraftWork& w = work[owners_[c]];
      if (w.extend_only) {
        if (pass == config_.layers - 1) mtp_spec_extended(*w.state);
        continue;
      }
      const int64_t last = last_row_[c];
      mtp_spec_take_draft(*w.state, config_, pass, out_.logits.data() + last * vocab,
                          valid_vocab_, out_.hidden.data() + last * d, d);
    }
  }
  return {};
}

}  // namespace xds::engine
