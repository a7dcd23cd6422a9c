// MTP speculative decoding (P080-P083): the per-request bookkeeping of drafts, provisional MTP
// rows and rollback, as data plus functions a batching engine (engine/speculative_stage.h)
// calls for each request around its batched forward / forward_mtp calls.
//
// A request with committed tokens x_0 .. x_L (x_L sampled last) has final main-model KV for
// positions [0, L) (MtpSpecState::length = L). One step:
//   verify    the main model runs [x_L, d_1 .. d_n] at positions L .. L+n (n <= k drafts),
//             logits of every row; row r predicts position L+r+1.
//   accept    an acceptance rule (engine/speculative.h) takes a drafts and the main model's
//             next token; the rows of x_L, d_1 .. d_a are final: mtp_spec_commit(a + 1 rows),
//             length = L + a + 1. The KV past `length` is given back (KvCache::truncate,
//             KvManager::truncate); rejected rows in a kept block are rewritten before they
//             are read: the next verify starts at `length`, and a chunk's token at position
//             t reads rows [0, t], of which it wrote [start, t] itself.
//   propose   k MTP passes, pass p running layer mtp_spec_layer(p); every request contributes
//             one chunk to each pass (mtp_spec_pass_rows) and takes its draft p+1 from the
//             chunk's last row (mtp_spec_take_draft): the argmax of the MTP logits over the
//             valid vocabulary, and that row's residual output (StepOutput::hidden of
//             forward_mtp), the input hidden of the next draft's row.
//
// MTP rows. Every used MTP layer caches one row per position. Rows below `mtp_length` are
// final: row s is the teacher-forced (h_s, x_{s+1}) with h_s the main model's final-normed
// hidden. The chain's rows sit after them: the row of draft m+1 at position length-1+m is
// (G_m, d_m), G_m the residual output of draft m's row, in whichever layer made draft m (the
// positions advance one per draft, as vLLM chains them). Chain rows are provisional: the next
// step's draft-extend writes the accepted positions' rows again from the main model's hidden
// (1 to k+1 rows per request), and a chain row past them is written again by the next chain
// before any row reads it. So every layer holds rows [0, p] with no hole whenever a row at p
// is computed, and the drafts equal those computed from scratch over the committed tokens.
//
// Passes. Pass p's layer is min(p, layers - 1). The first pass of a layer (p < layers)
// carries that layer's draft-extend: rows [mtp_length, length) from the waiting main hidden,
// then p chain rows (G_1, d_1) .. (G_p, d_p); a layer used again (reuse, p >= layers) carries
// only the one chain row. After pass layers - 1 every layer's rows below `length` are final.
// With one MTP layer (DeepSeek-V3's checkpoints): pass 0 is the draft-extend plus draft 1,
// passes 1 .. k-1 one chain row each.
//
// What a trained second MTP layer sees, so that training matches serving: its cached rows at
// positions s < t are (h_s, x_{s+1}) from the main model's hidden, exactly as the first
// layer's; the query row of draft 2 sits at position t (= length) and is (G_1, d_1), where G_1
// is the first layer's residual output at its row at t - 1 ((h_{t-1}, x_t), which predicted
// d_1 for x_{t+1}); it predicts x_{t+2}. Teacher-forced: query (G_1(t-1), x_{t+1}) at position t
// attends to the second layer's rows (h_s, x_{s+1}) for s < t and to itself, and is trained on
// x_{t+2} -- not DeepSeek's training chain (rows (G_1(s), x_{s+2}) at position s), whose
// context rows a decode step would have to keep per layer.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace xds {

// How a request speculates.
struct MtpSpecConfig {
  int64_t draft_tokens = 1;  // k >= 1 drafts per step
  int64_t layers = 1;        // MTP layers used (1 .. min(k, the model's)); see the passes above
};

// k = --speculative-tokens (>= 1), cap = --speculative-mtp-layers (0: every layer the model
// has), model_layers = the checkpoint's MTP layers. InvalidArgument when the model has none,
// or k or cap is out of range.
Result<MtpSpecConfig> mtp_spec_config(int64_t k, int64_t cap, int64_t model_layers);

// The MTP layer (0-based) of pass p in [0, k): min(p, layers - 1).
int64_t mtp_spec_layer(const MtpSpecConfig& c, int64_t pass);

struct MtpSpecState {
  int64_t length = 0;                 // positions [0, length) have final main-model KV
  int64_t mtp_length = 0;             // MTP rows [0, mtp_length) are final in every used layer
  std::vector<float> pending_hidden;  // [length - mtp_length, D] main final-normed hidden of
                                      // positions [mtp_length, length), for the draft-extend
  std::vector<int32_t> drafts;        // [n <= k] proposals for positions length+1 .. length+n
  std::vector<float> draft_hidden;    // [n, D] residual output of each draft's MTP row
  std::vector<int32_t> row_tokens;    // scratch of mtp_spec_pass_rows: [rows]
  std::vector<float> row_hidden;      // scratch of mtp_spec_pass_rows: [rows, D]
};

// A main pass over positions [s.length, s.length + rows) whose tokens are now committed (a
// prefill chunk; or the verify rows of x_L and the accepted drafts): their final-normed hidden
// ([rows, D], rows of forward's out.hidden) waits for the draft-extend, `length` advances by
// `rows`, and the drafts are cleared.
void mtp_spec_commit(MtpSpecState& s, const float* hidden, int64_t rows, int64_t d);

// The verify chunk's tokens: `last` (x_L, at position s.length) then the drafts.
void mtp_spec_verify_tokens(const MtpSpecState& s, int32_t last, std::vector<int32_t>& tokens);

// One request's rows of one MTP pass. Valid until the state's next call.
struct MtpPassRows {
  int64_t start_pos = 0;
  std::span<const int32_t> next_tokens;  // [rows]
  const float* hidden = nullptr;         // [rows, D]
  int64_t rows() const { return static_cast<int64_t>(next_tokens.size()); }
};

// Pass `pass` of the propose step (see above). `tokens` are the sequence's committed tokens
// x_0 .. x_length (length + 1 of them). Needs drafts 1 .. pass already taken, and at least one
// row waiting for the draft-extend.
MtpPassRows mtp_spec_pass_rows(MtpSpecState& s, const MtpSpecConfig& c, int64_t pass,
                               std::span<const int32_t> tokens, int64_t d);
// The draft-extend alone (a prefill chunk that is not the prompt's last: no drafts yet): the
// rows [mtp_length, length) for each used layer in turn, then mtp_spec_extended().
MtpPassRows mtp_spec_extend_rows(MtpSpecState& s, std::span<const int32_t> tokens, int64_t d);
void mtp_spec_extended(MtpSpecState& s);
// Takes draft pass+1 from the last row of this request's chunk in pass `pass`: argmax (ties
// to the lower id) of logits[0, valid_vocab), and that row's residual output hidden [D].
// After pass layers - 1 the draft-extend is complete (mtp_spec_extended).
void mtp_spec_take_draft(MtpSpecState& s, const MtpSpecConfig& c, int64_t pass, const float* logits,
                         int64_t valid_vocab, const float* hidden, int64_t d);

// Positions the propose step writes: [0, s.length + passes - 1); those of the verify step:
// [0, s.length + drafts + 1). What to reserve before each.
inline int64_t mtp_spec_propose_end(const MtpSpecState& s, int64_t passes) {
  return s.length + passes - 1;
}
inline int64_t mtp_spec_verify_end(const MtpSpecState& s) {
  return s.length + static_cast<int64_t>(s.drafts.size()) + 1;
}

}  // namespace xds
