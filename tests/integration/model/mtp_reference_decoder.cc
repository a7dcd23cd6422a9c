#include "mtp_reference_decoder.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace xds::mtp_reference {

MtpSpecCut mtp_spec_cut(std::span<const int32_t> tokens, std::span<const int32_t> stop_ids,
                        int64_t remaining) {
  MtpSpecCut cut;
  for (const int32_t t : tokens) {
    if (cut.count == remaining) {
      cut.length = true;
      return cut;
    }
    ++cut.count;
    if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) {
      cut.stopped = true;
      return cut;
    }
  }
  cut.length = cut.count == remaining;
  return cut;
}

// ---------------------------------------------------------------------------------------
// MtpSpecDecoder

MtpSpecDecoder::MtpSpecDecoder(CausalLm& model, KvCache& cache, int64_t seq,
                               MtpSpecDecodeOptions options, MtpSpecAcceptFn accept)
    : model_(model),
      cache_(cache),
      seq_(seq),
      opt_(std::move(options)),
      accept_(std::move(accept)) {
  const auto k = static_cast<size_t>(opt_.spec.draft_tokens);
  stats_.verified_at.assign(k, 0);
  stats_.accepted_at.assign(k, 0);
}

std::span<const int32_t> MtpSpecDecoder::output() const {
  return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(prompt_len_));
}

std::span<const int32_t> MtpSpecDecoder::last_emitted() const {
  return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(emitted_from_));
}

Status MtpSpecDecoder::emit(std::span<const int32_t> run) {
  const int64_t remaining = opt_.max_tokens - static_cast<int64_t>(output().size());
  const MtpSpecCut cut = mtp_spec_cut(run, opt_.stop_ids, remaining);
  emitted_from_ = static_cast<int64_t>(tokens_.size());
  tokens_.insert(tokens_.end(), run.begin(), run.begin() + cut.count);
  finished_ = cut.stopped || cut.length;
  return {};
}

int64_t MtpSpecDecoder::passes_wanted() const {
  // Drafts past max_tokens or the model's positions could never be emitted: the verify of n
  // drafts gives at most n + 1 tokens and writes positions up to length + n.
  const int64_t remaining = opt_.max_tokens - static_cast<int64_t>(output().size());
  const int64_t room = opt_.max_length - 1 - state_.length;
  return std::max<int64_t>(0, std::min({opt_.spec.draft_tokens, remaining - 1, room}));
}

Status MtpSpecDecoder::prefill(std::span<const int32_t> prompt) {
  XDS_CHECK(tokens_.empty(), "MtpSpecDecoder::prefill called twice");
  if (prompt.empty()) return invalid_argument("speculative decoding: empty prompt");
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t d = model_.info().hidden_size;
  const int64_t vocab = model_.info().vocab_size;
  tokens_.assign(prompt.begin(), prompt.end());
  prompt_len_ = n;
  const int64_t chunk = opt_.prefill_chunk > 0 ? opt_.prefill_chunk : n;
  for (int64_t p = 0; p < n; p += chunk) {
    const int64_t count = std::min(chunk, n - p);
    XDS_ASSIGN_OR_RETURN(const TokenChunk tc, cache_.chunk(seq_, p, prompt.subspan(p, count)));
    XDS_RETURN_IF_ERROR(model_.forward({&tc, 1}, cache_.storage(), main_out_));
    mtp_spec_commit(state_, main_out_.hidden.data(), count, d);
  }
  run_.clear();
  const float* last = main_out_.logits.data() + (main_out_.logits.size() - vocab);
  XDS_RETURN_IF_ERROR(accept_(MtpSpecRows{last, {}, n, {}}, run_));
  XDS_CHECK(run_.size() == 1, "the acceptance rule gave {} tokens for no drafts", run_.size());
  XDS_RETURN_IF_ERROR(emit(run_));
  if (finished_) return {};
  return propose();
}

Status MtpSpecDecoder::verify() {
  XDS_CHECK(!finished_ && !tokens_.empty(), "MtpSpecDecoder::verify: nothing to decode");
  const int64_t d = model_.info().hidden_size;
  const int64_t vocab = model_.info().vocab_size;
  const int64_t start = state_.length;
  const int64_t n = static_cast<int64_t>(state_.drafts.size());
  mtp_spec_verify_tokens(state_, tokens_.back(), verify_);
  const std::vector<int32_t> drafts = state_.drafts;
  XDS_ASSIGN_OR_RETURN(const TokenChunk tc,
                       cache_.chunk(seq_, start, verify_, /*all_logits=*/true));
  XDS_RETURN_IF_ERROR(model_.forward({&tc, 1}, cache_.storage(), main_out_));
  XDS_CHECK(static_cast<int64_t>(main_out_.logits.size()) == (n + 1) * vocab,
            "verify gave {} logits for {} rows", main_out_.logits.size(), n + 1);
  run_.clear();
  XDS_RETURN_IF_ERROR(
      accept_(MtpSpecRows{main_out_.logits.data(), drafts, start + 1, output()}, run_));
  const int64_t accepted = static_cast<int64_t>(run_.size()) - 1;
  XDS_CHECK(accepted >= 0 && accepted <= n, "the acceptance rule gave {} tokens for {} drafts",
            run_.size(), n);
  ++stats_.steps;
  stats_.step_tokens += accepted + 1;
  for (int64_t i = 0; i < n; ++i) {
    ++stats_.verified_at[i];
    if (i < accepted) ++stats_.accepted_at[i];
  }
  XDS_RETURN_IF_ERROR(emit(run_));
  if (finished_) return {};
  // x_L and the accepted drafts now have final KV; the rows past them are given back.
  mtp_spec_commit(state_, main_out_.hidden.data(), accepted + 1, d);
  cache_.truncate(seq_, state_.length);
  return {};
}

Status MtpSpecDecoder::propose() {
  const int64_t d = model_.info().hidden_size;
  const int64_t passes = passes_wanted();
  draft_logits_.clear();
  for (int64_t p = 0; p < passes; ++p) {
    const MtpPassRows rows = mtp_spec_pass_rows(state_, opt_.spec, p, tokens_, d);
    XDS_ASSIGN_OR_RETURN(const MtpChunk mc,
                         cache_.mtp_chunk(seq_, rows.start_pos, rows.next_tokens, rows.hidden));
    XDS_RETURN_IF_ERROR(
        model_.forward_mtp(mtp_spec_layer(opt_.spec, p), {&mc, 1}, cache_.storage(), mtp_out_));
    const int64_t last = rows.rows() - 1;
    const int64_t vocab = model_.info().vocab_size;
    const float* row = mtp_out_.logits.data() + last * vocab;
    draft_logits_.insert(draft_logits_.end(), row, row + vocab);
    mtp_spec_take_draft(state_, opt_.spec, p, row, opt_.valid_vocab,
                        mtp_out_.hidden.data() + last * d, d);
  }
  return {};
}

Status MtpSpecDecoder::step() {
  XDS_RETURN_IF_ERROR(verify());
  if (finished_) return {};
  return propose();
}

}  // namespace xds::mtp_reference
