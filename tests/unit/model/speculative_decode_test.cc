// The pure bookkeeping of MTP speculative decoding (model/speculative_decode.h) against rows,
// positions worked out by hand.
#include "model/speculative_decode.h"

#include <gtest/gtest.h>

#include <vector>

namespace xds {
namespace {

constexpr int64_t kD = 2;  // hidden size of the hand-made rows

// A hidden row [kD] whose values name it: (tag, tag + 0.5).
std::vector<float> row(float tag) {
  return {tag, tag + 0.5f};
}

std::vector<float> rows_of(std::span<const float> flat) {
  return {flat.begin(), flat.end()};
}

TEST(MtpSpecConfig, LayersAreCappedAndBadValuesRefused) {
  EXPECT_EQ(mtp_spec_config(2, 0, 1).value().layers, 1);  // reuse: k = 2 with one layer
  EXPECT_EQ(mtp_spec_config(3, 0, 3).value().layers, 3);
  EXPECT_EQ(mtp_spec_config(3, 2, 3).value().layers, 2);  // --speculative-mtp-layers 2
  EXPECT_EQ(mtp_spec_config(1, 0, 3).value().layers, 1);  // never more layers than drafts
  EXPECT_EQ(mtp_spec_config(3, 1, 3).value().draft_tokens, 3);
  EXPECT_FALSE(mtp_spec_config(1, 0, 0).ok());  // a checkpoint without an MTP layer
  EXPECT_FALSE(mtp_spec_config(0, 0, 1).ok());
  EXPECT_FALSE(mtp_spec_config(17, 0, 1).ok());
  EXPECT_FALSE(mtp_spec_config(2, 2, 1).ok());
  EXPECT_FALSE(mtp_spec_config(2, -1, 1).ok());
  const Result<MtpSpecConfig> none = mtp_spec_config(1, 0, 0);
  EXPECT_NE(none.status().message().find("num_nextn_predict_layers 0"), std::string::npos)
      << none.status().message();
}

TEST(MtpSpecConfig, PassLayers) {
  const MtpSpecConfig reuse{3, 1};
  EXPECT_EQ(mtp_spec_layer(reuse, 0), 0);
  EXPECT_EQ(mtp_spec_layer(reuse, 2), 0);
  const MtpSpecConfig two{4, 2};
  EXPECT_EQ(mtp_spec_layer(two, 0), 0);
  EXPECT_EQ(mtp_spec_layer(two, 1), 1);
  EXPECT_EQ(mtp_spec_layer(two, 3), 1);
}

// Prefill of 3 tokens, then steps: the rows each pass carries.
TEST(MtpSpecState, PassRowsOfOneLayerReused) {
  const MtpSpecConfig c{3, 1};
  MtpSpecState s;
  // Prompt x0 x1 x2 = 10 11 12, first sampled token x3 = 13.
  std::vector<int32_t> tokens = {10, 11, 12, 13};
  std::vector<float> h;
  for (float t : {0.f, 1.f, 2.f}) {
    const auto r = row(t);
    h.insert(h.end(), r.begin(), r.end());
  }
  mtp_spec_commit(s, h.data(), 3, kD);
  EXPECT_EQ(s.length, 3);
  EXPECT_EQ(s.mtp_length, 0);
  EXPECT_EQ(mtp_spec_propose_end(s, 3), 5);  // chain rows up to position 4

  // Pass 0: the draft-extend (h_s, x_{s+1}) for s = 0, 1, 2 from position 0.
  MtpPassRows r = mtp_spec_pass_rows(s, c, 0, tokens, kD);
  EXPECT_EQ(r.start_pos, 0);
  EXPECT_EQ(std::vector<int32_t>(r.next_tokens.begin(), r.next_tokens.end()),
            (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(rows_of({r.hidden, 3 * kD}), h);
  const std::vector<float> logits0 = {0.f, 5.f, 5.f, 1.f};  // argmax: the lower of the tie
  const std::vector<float> g1 = row(100.f);
  mtp_spec_take_draft(s, c, 0, logits0.data(), 4, g1.data(), kD);
  EXPECT_EQ(s.drafts, (std::vector<int32_t>{1}));
  EXPECT_EQ(s.mtp_length, 3);  // the only layer is extended
  EXPECT_TRUE(s.pending_hidden.empty());

  // Pass 1: the chain row (G_1, d_1) at position L-1+1 = 3.
  r = mtp_spec_pass_rows(s, c, 1, tokens, kD);
  EXPECT_EQ(r.start_pos, 3);
  ASSERT_EQ(r.rows(), 1);
  EXPECT_EQ(r.next_tokens[0], 1);
  EXPECT_EQ(rows_of({r.hidden, kD}), g1);
  const std::vector<float> logits1 = {0.f, 0.f, 0.f, 9.f}, g2 = row(200.f);
  mtp_spec_take_draft(s, c, 1, logits1.data(), 4, g2.data(), kD);
  // Pass 2: (G_2, d_2) at position 4; the valid vocabulary keeps id 3 out.
  r = mtp_spec_pass_rows(s, c, 2, tokens, kD);
  EXPECT_EQ(r.start_pos, 4);
  EXPECT_EQ(r.next_tokens[0], 3);
  EXPECT_EQ(rows_of({r.hidden, kD}), g2);
  const std::vector<float> logits2 = {0.f, 2.f, 1.f, 9.f}, g3 = row(300.f);
  mtp_spec_take_draft(s, c, 2, logits2.data(), 3, g3.data(), kD);
  EXPECT_EQ(s.drafts, (std::vector<int32_t>{1, 3, 1}));

  // Verify [x3, 1, 3, 1] at position 3; two drafts pass, then x6 = 42.
  std::vector<int32_t> verify;
  mtp_spec_verify_tokens(s, tokens.back(), verify);
  EXPECT_EQ(verify, (std::vector<int32_t>{13, 1, 3, 1}));
  EXPECT_EQ(mtp_spec_verify_end(s), 7);
  std::vector<float> vh;
  for (float t : {3.f, 4.f, 5.f}) {
    const auto x = row(t);
    vh.insert(vh.end(), x.begin(), x.end());
  }
  mtp_spec_commit(s, vh.data(), 3, kD);  // rows of 13, 1, 3
  tokens.insert(tokens.end(), {1, 3, 42});
  EXPECT_EQ(s.length, 6);
  EXPECT_TRUE(s.drafts.empty());
  // The next draft-extend rewrites positions 3, 4, 5 (4 and 5 held provisional chain rows).
  r = mtp_spec_pass_rows(s, c, 0, tokens, kD);
  EXPECT_EQ(r.start_pos, 3);
  EXPECT_EQ(std::vector<int32_t>(r.next_tokens.begin(), r.next_tokens.end()),
            (std::vector<int32_t>{1, 3, 42}));
  EXPECT_EQ(rows_of({r.hidden, 3 * kD}), vh);
}

TEST(MtpSpecState, FirstPassOfALaterLayerCarriesItsExtendAndTheChainRows) {
  const MtpSpecConfig c{3, 2};  // passes: layer 0, layer 1, layer 1 again
  MtpSpecState s;
  const std::vector<int32_t> tokens = {10, 11, 12};  // length 2: x2 sampled
  std::vector<float> h = row(0.f);
  const auto h1 = row(1.f);
  h.insert(h.end(), h1.begin(), h1.end());
  mtp_spec_commit(s, h.data(), 2, kD);
  MtpPassRows r = mtp_spec_pass_rows(s, c, 0, tokens, kD);
  EXPECT_EQ(r.rows(), 2);
  const std::vector<float> logits = {0.f, 0.f, 7.f}, g1 = row(100.f), g2 = row(200.f);
  mtp_spec_take_draft(s, c, 0, logits.data(), 3, g1.data(), kD);
  EXPECT_EQ(s.mtp_length, 0);  // layer 1 not extended yet
  // Pass 1 (layer 1's first): (h0, 11), (h1, 12) at 0, 1, then (G_1, d_1 = 2) at 2.
  r = mtp_spec_pass_rows(s, c, 1, tokens, kD);
  EXPECT_EQ(r.start_pos, 0);
  EXPECT_EQ(std::vector<int32_t>(r.next_tokens.begin(), r.next_tokens.end()),
            (std::vector<int32_t>{11, 12, 2}));
  std::vector<float> want = h;
  want.insert(want.end(), g1.begin(), g1.end());
  EXPECT_EQ(rows_of({r.hidden, 3 * kD}), want);
  mtp_spec_take_draft(s, c, 1, logits.data(), 3, g2.data(), kD);
  EXPECT_EQ(s.mtp_length, 2);
  // Pass 2 (layer 1 reused): (G_2, d_2) at position 3.
  r = mtp_spec_pass_rows(s, c, 2, tokens, kD);
  EXPECT_EQ(r.start_pos, 3);
  EXPECT_EQ(r.rows(), 1);
  EXPECT_EQ(rows_of({r.hidden, kD}), g2);
}

TEST(MtpSpecState, ExtendAloneForAPrefillChunk) {
  MtpSpecState s;
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  std::vector<float> h;
  for (float t : {0.f, 1.f, 2.f}) {
    const auto r = row(t);
    h.insert(h.end(), r.begin(), r.end());
  }
  mtp_spec_commit(s, h.data(), 3, kD);  // the first chunk: positions 0..2
  const MtpPassRows r =
      mtp_spec_extend_rows(s, std::span<const int32_t>(prompt).first(4), kD);  // x0..x3
  EXPECT_EQ(r.start_pos, 0);
  EXPECT_EQ(std::vector<int32_t>(r.next_tokens.begin(), r.next_tokens.end()),
            (std::vector<int32_t>{6, 7, 8}));
  mtp_spec_extended(s);
  EXPECT_EQ(s.mtp_length, 3);
  EXPECT_TRUE(s.pending_hidden.empty());
}

}  // namespace
}  // namespace xds
