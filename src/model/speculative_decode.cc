#include "model/speculative_decode.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace xds {

Result<MtpSpecConfig> mtp_spec_config(int64_t k, int64_t cap, int64_t model_layers) {
  if (model_layers <= 0) {
    return invalid_argument(
        "speculative decoding drafts with the model's MTP layers; this checkpoint has none "
        "(num_nextn_predict_layers 0)");
  }
  constexpr int64_t kMaxDrafts = 16;
  if (k < 1 || k > kMaxDrafts) {
    return invalid_argument("speculative tokens: {} drafts per step, must be in [1, {}]", k,
                            kMaxDrafts);
  }
  if (cap < 0 || cap > model_layers) {
    return invalid_argument(
        "speculative MTP layers: {}, must be in [0, {}] (0: all; the checkpoint has {})", cap,
        model_layers, model_layers);
  }
  MtpSpecConfig c;
  c.draft_tokens = k;
  c.layers = std::min(k, cap == 0 ? model_layers : cap);
  return c;
}

int64_t mtp_spec_layer(const MtpSpecConfig& c, int64_t pass) {
  return std::min(pass, c.layers - 1);
}

void mtp_spec_commit(MtpSpecState& s, const float* hidden, int64_t rows, int64_t d) {
  XDS_CHECK(rows >= 0 && (rows == 0 || hidden != nullptr), "mtp_spec_commit: {} rows", rows);
  s.pending_hidden.insert(s.pending_hidden.end(), hidden, hidden + rows * d);
  s.length += rows;
  s.drafts.clear();
  s.draft_hidden.clear();
}

void mtp_spec_verify_tokens(const MtpSpecState& s, int32_t last, std::vector<int32_t>& tokens) {
  tokens.assign(1, last);
  tokens.insert(tokens.end(), s.drafts.begin(), s.drafts.end());
}

namespace {

void check_tokens(const MtpSpecState& s, std::span<const int32_t> tokens) {
  XDS_CHECK(static_cast<int64_t>(tokens.size()) == s.length + 1,
            "MTP pass: {} committed tokens for length {} (want length + 1)", tokens.size(),
            s.length);
  XDS_CHECK(s.mtp_length < s.length, "MTP pass: no row waits for the draft-extend ({} of {})",
            s.mtp_length, s.length);
}

}  // namespace

MtpPassRows mtp_spec_extend_rows(MtpSpecState& s, std::span<const int32_t> tokens, int64_t d) {
  check_tokens(s, tokens);
  XDS_CHECK(static_cast<int64_t>(s.pending_hidden.size()) == (s.length - s.mtp_length) * d,
            "MTP draft-extend: {} hidden values for {} rows", s.pending_hidden.size(),
            s.length - s.mtp_length);
  MtpPassRows r;
  r.start_pos = s.mtp_length;
  r.next_tokens = tokens.subspan(static_cast<size_t>(s.mtp_length + 1),
                                 static_cast<size_t>(s.length - s.mtp_length));
  r.hidden = s.pending_hidden.data();
  return r;
}

void mtp_spec_extended(MtpSpecState& s) {
  s.mtp_length = s.length;
  s.pending_hidden.clear();
}

MtpPassRows mtp_spec_pass_rows(MtpSpecState& s, const MtpSpecConfig& c, int64_t pass,
                               std::span<const int32_t> tokens, int64_t d) {
  XDS_CHECK(pass >= 0 && pass < c.draft_tokens, "MTP pass {} of {}", pass, c.draft_tokens);
  XDS_CHECK(static_cast<int64_t>(s.drafts.size()) == pass, "MTP pass {}: {} drafts taken (want {})",
            pass, s.drafts.size(), pass);
  MtpPassRows r;
  if (pass >= c.layers) {  // a layer used again: the one chain row (G_p, d_p)
    r.start_pos = s.length - 1 + pass;
    r.next_tokens = std::span<const int32_t>(s.drafts).subspan(static_cast<size_t>(pass - 1), 1);
    r.hidden = s.draft_hidden.data() + (pass - 1) * d;
    return r;
  }
  // The layer's first pass: its draft-extend, then the chain rows (G_1, d_1) .. (G_p, d_p).
  const MtpPassRows extend = mtp_spec_extend_rows(s, tokens, d);
  if (pass == 0) return extend;
  s.row_tokens.assign(extend.next_tokens.begin(), extend.next_tokens.end());
  s.row_tokens.insert(s.row_tokens.end(), s.drafts.begin(), s.drafts.end());
  s.row_hidden.assign(s.pending_hidden.begin(), s.pending_hidden.end());
  s.row_hidden.insert(s.row_hidden.end(), s.draft_hidden.begin(), s.draft_hidden.end());
  r.start_pos = extend.start_pos;
  r.next_tokens = s.row_tokens;
  r.hidden = s.row_hidden.data();
  return r;
}

void mtp_spec_take_draft(MtpSpecState& s, const MtpSpecConfig& c, int64_t pass, const float* logits,
                         int64_t valid_vocab, const float* hidden, int64_t d) {
  XDS_CHECK(static_cast<int64_t>(s.drafts.size()) == pass, "MTP draft {} taken after {}", pass + 1,
            s.drafts.size());
  XDS_CHECK(valid_vocab > 0, "MTP draft: valid vocabulary {}", valid_vocab);
  int64_t best = 0;
  for (int64_t i = 1; i < valid_vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  s.drafts.push_back(static_cast<int32_t>(best));
  s.draft_hidden.insert(s.draft_hidden.end(), hidden, hidden + d);
  if (pass == c.layers - 1) mtp_spec_extended(s);
}

}  // namespace xds
