// Properties of the forward pass that need no oracle: batch composition does not change a
// sequence's logits, the fast (bf16) mode stays within its stated tolerance of the f32
// reference under teacher forcing, and the MTP head runs on the cached layer.
// (Logits against the float64 oracle: tests/conformance.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "kernels/cpu/mla_attention.h"
#include "mkmodel/mkmodel.h"
#include "test_models.h"
#include "model/deepseek_v3/deepseek_v3.h"

namespace xds {
namespace {

std::string make_tiny(const std::string& name, uint64_t seed) {
  return fixtures::random_checkpoint("forward_" + name, seed);
}

using fixtures::random_ids;

// The tiny model of `make_tiny(name, seed)`, loaded with 2 threads.
std::unique_ptr<DeepseekV3Model> load_tiny(const std::string& name, uint64_t seed) {
  ModelOptions mo;
  mo.threads = 2;
  auto m = DeepseekV3Model::load(make_tiny(name, seed), mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

using fixtures::chunk;

MtpChunk mtp_chunk(KvCache& cache, int64_t seq, int64_t start, std::span<const int32_t> next,
                   const float* hidden) {
  Result<MtpChunk> c = cache.mtp_chunk(seq, start, next, hidden);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : MtpChunk{};
}

// Logits of every position of `ids`, run alone (prefill in one chunk).
std::vector<float> alone(DeepseekV3Model& m, const std::vector<int32_t>& ids) {
  KvCache cache = m.make_cache(static_cast<int64_t>(ids.size()) + 16).value();
  const int64_t seq = cache.add_sequence();
  StepOutput out;
  const TokenChunk ch = chunk(cache, seq, 0, ids, true);
  EXPECT_TRUE(m.forward({&ch, 1}, cache.storage(), out).ok());
  return out.logits;
}

TEST(Forward, LogitsDoNotDependOnBatchComposition) {
  const auto m = load_tiny("batch", 11);
  ASSERT_NE(m, nullptr);
  DeepseekV3Model& model = *m;
  const int64_t v = model.config().vocab_size;
  // Three sequences: A and B are prefilled, then a mixed step carries A's decode token, a
  // prefill chunk of B, and a new sequence C whole.
  const auto a = random_ids(9, v, 1), b = random_ids(14, v, 2), c = random_ids(6, v, 3);
  const auto ref_a = alone(model, a), ref_b = alone(model, b), ref_c = alone(model, c);

  KvCache cache = model.make_cache(256).value();
  const int64_t sa = cache.add_sequence(), sb = cache.add_sequence(), sc = cache.add_sequence();
  StepOutput out;
  {
    const TokenChunk first[] = {chunk(cache, sa, 0, std::span(a).first(8), false),
                                chunk(cache, sb, 0, std::span(b).first(5), false)};
    ASSERT_TRUE(model.forward(first, cache.storage(), out).ok());
  }
  const TokenChunk mixed[] = {chunk(cache, sa, 8, std::span(a).subspan(8, 1), false),
                              chunk(cache, sb, 5, std::span(b).subspan(5, 9), true),
                              chunk(cache, sc, 0, std::span(c), true)};
  ASSERT_TRUE(model.forward(mixed, cache.storage(), out).ok());
  ASSERT_EQ(out.logit_tokens.size(), 1u + 9u + 6u);
  auto expect_row = [&](int64_t row, const std::vector<float>& ref, int64_t pos) {
    for (int64_t i = 0; i < v; ++i) {
      ASSERT_NEAR(out.logits[row * v + i], ref[pos * v + i],
                  1e-5f * (1.0f + std::fabs(ref[pos * v + i])))
          << "row " << row << " vocab " << i;
    }
  };
  expect_row(0, ref_a, 8);
  for (int64_t i = 0; i < 9; ++i) expect_row(1 + i, ref_b, 5 + i);
  for (int64_t i = 0; i < 6; ++i) expect_row(10 + i, ref_c, i);
}

// The shared experts run between the routed ones (SharedMlpOverlap) or after them: the
// same bits. The tiny model (16 experts, top-4) overlaps from 8 to 16 tokens a step; 5 and
// 20 tokens run after the routed experts either way.
TEST(Forward, SharedExpertsBetweenTheRoutedOnesGiveTheSameBits) {
  const std::string dir = make_tiny("overlap", 17);
  for (const ComputeDType compute : {ComputeDType::kF32, ComputeDType::kBF16}) {
    ModelOptions on, off;
    on.threads = off.threads = 2;
    on.compute = off.compute = compute;
    on.overlap_shared = true;
    off.overlap_shared = false;
    auto m_on = DeepseekV3Model::load(dir, on);
    auto m_off = DeepseekV3Model::load(dir, off);
    ASSERT_TRUE(m_on.ok() && m_off.ok());
    const int64_t v = (*m_on)->config().vocab_size;
    for (const int64_t n : {5, 8, 12, 16, 20}) {
      const auto ids = random_ids(n, v, static_cast<uint32_t>(n));
      const std::vector<float> a = alone(**m_on, ids), b = alone(**m_off, ids);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0)
          << "n=" << n << " bf16=" << (compute == ComputeDType::kBF16);
    }
  }
}

// Decode at a context long enough to be split into parts (absorbed attention, parts merged:
// kernels::absorbed_context_split) against the same positions prefilled in one chunk (the
// expanded form), and against the same decode step carried in a batch with a short sequence.
TEST(Forward, DecodeOverALongContextMatchesPrefill) {
  const auto m = load_tiny("long", 13);
  ASSERT_NE(m, nullptr);
  DeepseekV3Model& model = *m;
  const int64_t v = model.config().vocab_size, n = 300;
  const auto ids = random_ids(n, v, 4);
  const auto ref = alone(model, ids);  // every position, one prefill chunk
  for (const bool with_neighbour : {false, true}) {
    KvCache cache = model.make_cache(2 * n).value();
    const int64_t seq = cache.add_sequence(), other = cache.add_sequence();
    StepOutput out;
    const TokenChunk prefill = chunk(cache, seq, 0, std::span(ids).first(n - 1), false);
    ASSERT_TRUE(model.forward({&prefill, 1}, cache.storage(), out).ok());
    const auto short_ids = random_ids(3, v, 9);
    std::vector<TokenChunk> step = {
        chunk(cache, seq, n - 1, std::span(ids).subspan(n - 1, 1), false)};
    if (with_neighbour) step.push_back(chunk(cache, other, 0, std::span(short_ids), false));
    ASSERT_TRUE(model.forward(step, cache.storage(), out).ok());
    for (int64_t i = 0; i < v; ++i) {
      const float r = ref[(n - 1) * v + i];
      ASSERT_NEAR(out.logits[i], r, 1e-5f * (1.0f + std::fabs(r)))
          << "vocab " << i << (with_neighbour ? " (batched)" : " (alone)");
    }
  }
}

// Eight decode tokens over contexts of two parts each (kernels::absorbed_context_split):
// in one step the two threads take whole tokens as their units and merge each token's parts
// from their own scratch; a token alone shares its parts between the threads and merges
// them afterwards. The same parts merged in the same order: the same bits, in both modes.
TEST(Forward, DecodeOfManyLongContextsGivesTheBitsOfEachAlone) {
  const std::string dir = make_tiny("many_long", 19);
  for (const ComputeDType compute : {ComputeDType::kF32, ComputeDType::kBF16}) {
    ModelOptions mo;
    mo.threads = 2;
    mo.compute = compute;
    auto loaded = DeepseekV3Model::load(dir, mo);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    DeepseekV3Model& model = **loaded;
    const int64_t v = model.config().vocab_size, seqs = 8;
    std::vector<std::vector<int32_t>> ids;
    for (int64_t s = 0; s < seqs; ++s) ids.push_back(random_ids(520 + s, v, 30 + s));
    ASSERT_EQ(kernels::absorbed_context_split(520).count, 2);
    // Two caches with the same prefixes: one for the batched step, one for the steps alone.
    KvCache together = model.make_cache(seqs * 540).value();
    KvCache apart = model.make_cache(seqs * 540).value();
    StepOutput out;
    for (KvCache* cache : {&together, &apart}) {
      std::vector<TokenChunk> prefill;
      for (int64_t s = 0; s < seqs; ++s) {
        const int64_t seq = cache->add_sequence();
        ASSERT_EQ(seq, s);  // the step below names the sequences by their index
        prefill.push_back(chunk(*cache, seq, 0, std::span(ids[s]).first(ids[s].size() - 1), false));
      }
      ASSERT_TRUE(model.forward(prefill, cache->storage(), out).ok());
    }
    auto last = [&](int64_t s) { return std::span(ids[s]).last(1); };
    std::vector<TokenChunk> step, step_apart;
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t pos = static_cast<int64_t>(ids[s].size()) - 1;
      step.push_back(chunk(together, s, pos, last(s), true));
      step_apart.push_back(chunk(apart, s, pos, last(s), true));
    }
    ASSERT_TRUE(model.forward(step, together.storage(), out).ok());
    const std::vector<float> batched = out.logits;
    ASSERT_EQ(batched.size(), static_cast<size_t>(seqs * v));
    for (int64_t s = 0; s < seqs; ++s) {
      ASSERT_TRUE(model.forward({&step_apart[s], 1}, apart.storage(), out).ok());
      ASSERT_EQ(std::memcmp(out.logits.data(), batched.data() + s * v, sizeof(float) * v), 0)
          << "sequence " << s << " bf16=" << (compute == ComputeDType::kBF16);
    }
  }
}

TEST(Forward, Bf16ModeStaysWithinToleranceOfF32TeacherForced) {
  // Stated tolerance of the fast mode: per row, max |l_bf16 - l_f32| <= 3e-2 * max |l_f32|,
  // and the same argmax wherever the f32 top-2 margin exceeds twice that bound. Both apply to
  // rows whose experts are the same in both modes: on random weights a bf16 rounding can flip a
  // near-tied routing decision upstream, and then the row legitimately differs (the share of
  // such rows is bounded below instead).
  constexpr double kTol = 3e-2;
  const std::string dir = make_tiny("bf16", 5);
  ModelOptions f32, bf16;
  bf16.compute = ComputeDType::kBF16;
  auto mf = DeepseekV3Model::load(dir, f32);
  auto mb = DeepseekV3Model::load(dir, bf16);
  ASSERT_TRUE(mf.ok() && mb.ok());
  const int64_t v = (*mf)->config().vocab_size;
  const auto ids = random_ids(40, v, 9);
  using Routing = std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>>;
  Routing rf, rb;
  (*mf)->set_routing_observer([&](int64_t l, int64_t t, std::span<const int32_t> e) {
    rf[{l, t}].assign(e.begin(), e.end());
  });
  (*mb)->set_routing_observer([&](int64_t l, int64_t t, std::span<const int32_t> e) {
    rb[{l, t}].assign(e.begin(), e.end());
  });
  const auto lf = alone(**mf, ids), lb = alone(**mb, ids);
  // A row depends on the routing of every token up to it (through attention).
  std::vector<bool> same_routing(ids.size(), true);
  for (const auto& [key, experts] : rf) {
    if (rb[key] != experts) {
      for (size_t r = static_cast<size_t>(key.second); r < ids.size(); ++r) same_routing[r] = false;
    }
  }
  int compared_rows = 0, compared_top1 = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (!same_routing[r]) continue;
    ++compared_rows;
    const float* f = lf.data() + r * v;
    const float* b = lb.data() + r * v;
    double mx = 0, err = 0;
    for (int64_t i = 0; i < v; ++i) {
      mx = std::max(mx, std::fabs(double(f[i])));
      err = std::max(err, std::fabs(double(f[i]) - b[i]));
    }
    EXPECT_LE(err, kTol * mx) << "row " << r;
    int64_t best = 0, second = -1;
    for (int64_t i = 1; i < v; ++i) {
      if (f[i] > f[best]) {
        second = best;
        best = i;
      } else if (second < 0 || f[i] > f[second]) {
        second = i;
      }
    }
    if (f[best] - f[second] > 2 * kTol * mx) {
      ++compared_top1;
      EXPECT_EQ(std::max_element(b, b + v) - b, best) << "row " << r;
    }
  }
  EXPECT_GE(compared_rows, 10);
  EXPECT_GT(compared_top1, 0);
}

// The fast mode's absorbed attention rounds the cached rows to bf16 before its products, so a
// bf16 KV cache (the default there) gives the bits of an fp32 one: every position through
// the absorbed form (a prefill chunk, then decode steps at contexts of two parts,
// kernels::absorbed_context_split).
TEST(Forward, Bf16KvCacheGivesTheBitsOfAnF32CacheInTheFastMode) {
  if (!kernels::absorbed_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 attention kernel";
  const std::string dir = make_tiny("kv16", 23);
  ModelOptions o16, o32;
  o16.compute = o32.compute = ComputeDType::kBF16;
  o16.attention = o32.attention = AttentionMode::kAbsorbed;
  o16.threads = o32.threads = 2;
  o32.kv_cache = KvCacheDType::kF32;
  auto m16 = DeepseekV3Model::load(dir, o16);
  auto m32 = DeepseekV3Model::load(dir, o32);
  ASSERT_TRUE(m16.ok() && m32.ok());
  EXPECT_EQ((*m16)->kv_cache_dtype(), DType::kBF16);  // kAuto in the fast mode
  EXPECT_EQ((*m32)->kv_cache_dtype(), DType::kF32);
  const int64_t v = (*m16)->config().vocab_size;
  const auto ids = random_ids(520, v, 6);
  auto run = [&](DeepseekV3Model& m) {
    KvCache cache = m.make_cache(540).value();
    const int64_t seq = cache.add_sequence();
    StepOutput out;
    std::vector<float> logits;
    const TokenChunk prefill = chunk(cache, seq, 0, std::span(ids).first(514), true);
    EXPECT_TRUE(m.forward({&prefill, 1}, cache.storage(), out).ok());
    logits = out.logits;
    for (int64_t p = 514; p < 520; ++p) {
      const TokenChunk step =
          chunk(cache, seq, p, std::span(ids).subspan(static_cast<size_t>(p), 1), false);
      EXPECT_TRUE(m.forward({&step, 1}, cache.storage(), out).ok());
      logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    }
    return logits;
  };
  const std::vector<float> a = run(**m16), b = run(**m32);
  ASSERT_EQ(a.size(), static_cast<size_t>(520 * v));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0);
}

// Chunked prefill over a bf16 cache: each chunk's expanded attention reads the cached rows
// (bf16, widened) of the whole context, its own rows included, exactly as one chunk does,
// and every kernel's sums are the same whatever the chunking: the same bits.
TEST(Forward, ChunkedPrefillOverABf16CacheEqualsOneChunk) {
  if (!kernels::absorbed_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 attention kernel";
  ModelOptions o;
  o.compute = ComputeDType::kBF16;
  o.attention = AttentionMode::kExpanded;
  o.threads = 2;
  auto m = DeepseekV3Model::load(make_tiny("kv16_chunks", 29), o);
  ASSERT_TRUE(m.ok());
  DeepseekV3Model& model = **m;
  ASSERT_EQ(model.kv_cache_dtype(), DType::kBF16);
  const int64_t v = model.config().vocab_size, n = 45;
  const auto ids = random_ids(n, v, 12);
  const std::vector<float> whole = alone(model, ids);
  KvCache cache = model.make_cache(n + 16).value();
  const int64_t seq = cache.add_sequence();
  std::vector<float> chunked;
  StepOutput out;
  for (int64_t p = 0; p < n; p += 7) {
    const int64_t count = std::min<int64_t>(7, n - p);
    const TokenChunk ch =
        chunk(cache, seq, p, std::span(ids).subspan(static_cast<size_t>(p), count), true);
    ASSERT_TRUE(model.forward({&ch, 1}, cache.storage(), out).ok());
    chunked.insert(chunked.end(), out.logits.begin(), out.logits.end());
  }
  ASSERT_EQ(chunked.size(), whole.size());
  EXPECT_EQ(std::memcmp(chunked.data(), whole.data(), sizeof(float) * whole.size()), 0);
}

TEST(Forward, ABf16KvCacheOutsideTheFastModeIsRefused) {
  ModelOptions o;
  o.kv_cache = KvCacheDType::kBF16;  // with the f32 compute dtype
  const auto m = DeepseekV3Model::load(make_tiny("kv16_f32", 2), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("bf16 KV cache needs the bf16 compute dtype"),
            std::string::npos)
      << m.status().message();
}

TEST(Forward, MtpHeadRunsOnItsOwnCachedLayer) {
  const std::string dir = make_tiny("mtp", 3);
  auto m = DeepseekV3Model::load(dir, {});
  ASSERT_TRUE(m.ok());
  DeepseekV3Model& model = **m;
  const int64_t v = model.config().vocab_size, d = model.config().hidden_size;
  const auto ids = random_ids(12, v, 4);
  KvCache cache = model.make_cache(64).value();
  const int64_t seq = cache.add_sequence();
  StepOutput main_out, mtp_all, mtp_step;
  const TokenChunk ch = chunk(cache, seq, 0, ids, true);
  ASSERT_TRUE(model.forward({&ch, 1}, cache.storage(), main_out).ok());
  // All 11 MTP rows at once equal rows 0..9 then row 10 fed one at a time (MTP KV cache).
  const MtpChunk all =
      mtp_chunk(cache, seq, 0, std::span(ids).subspan(1, 11), main_out.hidden.data());
  ASSERT_TRUE(model.forward_mtp(0, {&all, 1}, cache.storage(), mtp_all).ok());
  ASSERT_EQ(mtp_all.logits.size(), static_cast<size_t>(11 * v));
  KvCache cache2 = model.make_cache(64).value();
  const int64_t seq2 = cache2.add_sequence();
  const TokenChunk ch2 = chunk(cache2, seq2, 0, ids, true);
  ASSERT_TRUE(model.forward({&ch2, 1}, cache2.storage(), main_out).ok());
  const MtpChunk first =
      mtp_chunk(cache2, seq2, 0, std::span(ids).subspan(1, 10), main_out.hidden.data());
  ASSERT_TRUE(model.forward_mtp(0, {&first, 1}, cache2.storage(), mtp_step).ok());
  const MtpChunk last =
      mtp_chunk(cache2, seq2, 10, std::span(ids).subspan(11, 1), main_out.hidden.data() + 10 * d);
  ASSERT_TRUE(model.forward_mtp(0, {&last, 1}, cache2.storage(), mtp_step).ok());
  for (int64_t i = 0; i < v; ++i)
    EXPECT_NEAR(mtp_step.logits[i], mtp_all.logits[10 * v + i], 1e-5f);
  EXPECT_FALSE(model.forward_mtp(1, {&all, 1}, cache.storage(), mtp_all).ok());
}

}  // namespace
}  // namespace xds
