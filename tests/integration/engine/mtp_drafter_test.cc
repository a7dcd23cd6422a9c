// The DP group's batched MTP passes (engine/mtp_drafter.h) against the same requests drafted
// one at a time: three requests of different lengths in one batch -- two ready to draft (one
// with a random checkpoint of two MTP layers, so a reused and a trained layer both run), one
// part-way through its prompt (draft-extend rows only) -- must give each request the drafts
// and chained hidden states it gets alone, and leave the part-way one's MTP rows final so that
// its later drafts equal those of a request that never shared a pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/mtp_drafter.h"
#include "mkmodel/mkmodel.h"
#include "test_models.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/kv_cache.h"
#include "model/speculative_decode.h"

namespace xds::engine {
namespace {

std::string checkpoint(int mtp_layers) {
  return fixtures::random_checkpoint("drafter_" + std::to_string(mtp_layers), 77, mtp_layers);
}

// One request: its tokens (prompt, plus a first token when its prefill is done) and the
// state after the main model ran positions [0, computed).
struct Req {
  std::vector<int32_t> tokens;
  int64_t computed = 0;
  MtpSpecState state;
  int64_t seq = -1;
};

// Runs the main model over [0, r.computed) of r.tokens in `cache` (one chunk), commits the
// hidden rows, and reserves what the passes write.
void prefill(CausalLm& model, KvCache& cache, Req& r, int64_t passes) {
  r.seq = cache.add_sequence();
  auto chunk = cache.chunk(r.seq, 0, std::span<const int32_t>(r.tokens).first(
                                          static_cast<size_t>(r.computed)));
  ASSERT_TRUE(chunk.ok()) << chunk.status().to_string();
  StepOutput out;
  ASSERT_TRUE(model.forward({&*chunk, 1}, cache.storage(), out).ok());
  mtp_spec_commit(r.state, out.hidden.data(), r.computed, model.info().hidden_size);
  ASSERT_TRUE(cache.reserve(r.seq, mtp_spec_propose_end(r.state, passes) + 1).ok());
}

MtpDraftWork work_of(Req& r, const KvCache& cache, int64_t passes) {
  MtpDraftWork w;
  w.state = &r.state;
  w.tokens = std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.state.length + 1));
  w.blocks = cache.blocks(r.seq);
  w.extend_only = static_cast<int64_t>(r.tokens.size()) > r.state.length + 1;
  w.passes = w.extend_only ? 0 : passes;
  return w;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(double(b[i])));
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
  }
  EXPECT_LE(diff, 1e-4 * std::max(scale, 1.0)) << what;
}

void check_batch_equals_alone(const std::string& dir, int64_t k) {
  auto model = fixtures::load_deepseek(dir);
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->info().vocab_size;
  auto spec = mtp_spec_config(k, 0, model->info().n_mtp_layers);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  // Ready to draft: 23 and 9 prompt tokens plus a first token. Part-way: 40 of 70 prompt tokens.
  auto make = [&]() {
    std::vector<Req> reqs(3);
    reqs[0].tokens = fixtures::random_ids(24, vocab, 1);
    reqs[0].computed = 23;
    reqs[1].tokens = fixtures::random_ids(10, vocab, 2);
    reqs[1].computed = 9;
    reqs[2].tokens = fixtures::random_ids(70, vocab, 3);
    reqs[2].computed = 40;
    return reqs;
  };

  std::vector<Req> batch = make();
  auto cache = model->make_cache(1024);
  ASSERT_TRUE(cache.ok());
  std::vector<MtpDraftWork> work;
  for (Req& r : batch) prefill(*model, *cache, r, k);
  for (Req& r : batch) work.push_back(work_of(r, *cache, k));
  MtpDrafter drafter(*model, *spec, vocab);
  ASSERT_TRUE(drafter.propose(work, cache->storage(), /*run_empty=*/false).ok());

  std::vector<Req> alone = make();
  for (size_t i = 0; i < alone.size(); ++i) {
    auto own = model->make_cache(1024);
    ASSERT_TRUE(own.ok());
    prefill(*model, *own, alone[i], k);
    std::vector<MtpDraftWork> one{work_of(alone[i], *own, k)};
    ASSERT_TRUE(drafter.propose(one, own->storage(), false).ok());
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(batch[i].state.drafts, alone[i].state.drafts);
    expect_near(batch[i].state.draft_hidden, alone[i].state.draft_hidden, "draft hidden");
    EXPECT_EQ(batch[i].state.mtp_length, alone[i].state.mtp_length);
    if (i == 2) {
      // Part-way: no drafts, every row final; the rest of its prompt and its first drafts in
      // the batch's cache equal those of its own cache.
      EXPECT_TRUE(batch[i].state.drafts.empty());
      EXPECT_EQ(batch[i].state.mtp_length, 40);
      for (auto [req, c] : {std::pair{&batch[i], &*cache}, std::pair{&alone[i], &*own}}) {
        auto chunk = c->chunk(req->seq, 40, std::span<const int32_t>(req->tokens).subspan(40, 29));
        ASSERT_TRUE(chunk.ok());
        StepOutput out;
        ASSERT_TRUE(model->forward({&*chunk, 1}, c->storage(), out).ok());
        mtp_spec_commit(req->state, out.hidden.data(), 29, model->info().hidden_size);
        ASSERT_TRUE(c->reserve(req->seq, mtp_spec_propose_end(req->state, k) + 1).ok());
        std::vector<MtpDraftWork> w{work_of(*req, *c, k)};
        ASSERT_TRUE(drafter.propose(w, c->storage(), false).ok());
      }
      ASSERT_EQ(batch[i].state.drafts.size(), static_cast<size_t>(k));
      EXPECT_EQ(batch[i].state.drafts, alone[i].state.drafts);
    } else {
      EXPECT_EQ(batch[i].state.drafts.size(), static_cast<size_t>(k));
    }
  }
}

TEST(MtpDrafter, BatchedPassesGiveEachRequestItsOwnDraftsOneLayer) {
  check_batch_equals_alone(checkpoint(1), 3);
}

TEST(MtpDrafter, BatchedPassesGiveEachRequestItsOwnDraftsTwoLayers) {
  check_batch_equals_alone(checkpoint(2), 3);
}

}  // namespace
}  // namespace xds::engine
