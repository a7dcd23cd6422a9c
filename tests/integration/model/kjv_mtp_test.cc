// The shipped model's MTP head against the training recipe's float64 reference
// (tests/conformance/kjv_moe_tiny, written by tools/train_tiny/conformance.py): row t of
// the reference predicts token t+2 from the main model's hidden at t and token t+1. And the
// MTP layer's hidden output (the chained draft's input) against the head applied by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "base/bf16.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/safetensors.h"

namespace xds {
namespace {

template <typename T>
std::vector<T> read_raw(const std::string& path, size_t count) {
  std::vector<T> v(count);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(T)));
  EXPECT_TRUE(f.good()) << path;
  return v;
}

int32_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

double max_abs(const float* row, int64_t n) {
  double mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(double(row[i])));
  return mx;
}

TEST(KjvMoeTiny, MtpLogitsMatchTheRecipesReference) {
  const std::string root = XDS_SOURCE_DIR;
  const std::string ref = root + "/tests/conformance/kjv_moe_tiny/";
  auto loaded = DeepseekV3Model::load(root + "/models/kjv-moe-tiny", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  DeepseekV3Model& model = **loaded;
  const int64_t rows = 3, len = 64, v = model.config().vocab_size;
  ASSERT_EQ(v, 4096);
  const auto tokens = read_raw<int32_t>(ref + "tokens.i32", rows * len);
  const auto mtp_ref = read_raw<float>(ref + "mtp_logits.f32", rows * (len - 1) * v);
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const int32_t> ids(tokens.data() + r * len, len);
    KvCache cache = model.make_cache(len + 16).value();
    const int64_t seq = cache.add_sequence();
    StepOutput main_out, mtp_out;
    const TokenChunk ch = cache.chunk(seq, 0, ids).value();
    ASSERT_TRUE(model.forward({&ch, 1}, cache.storage(), main_out).ok());
    const MtpChunk m = cache.mtp_chunk(seq, 0, ids.subspan(1), main_out.hidden.data()).value();
    ASSERT_TRUE(model.forward_mtp(0, {&m, 1}, cache.storage(), mtp_out).ok());
    ASSERT_EQ(mtp_out.logits.size(), static_cast<size_t>((len - 1) * v));
    for (int64_t t = 0; t < len - 1; ++t) {
      const float* want = mtp_ref.data() + (r * (len - 1) + t) * v;
      const float* got = mtp_out.logits.data() + t * v;
      double mx = 0, err = 0;
      for (int64_t i = 0; i < v; ++i) {
        mx = std::max(mx, std::fabs(double(want[i])));
        err = std::max(err, std::fabs(double(want[i]) - got[i]));
      }
      EXPECT_LE(err, 1e-4 * mx) << "sequence " << r << " row " << t;
    }
  }
}

// forward_mtp's out.hidden is the MTP layer's residual output before shared_head.norm (the
// input of a chained draft): the checkpoint's head and norm applied to it by hand, in double,
// give the layer's logits; and a chained row fed from out.hidden in place equals one fed a
// copy of it.
TEST(KjvMoeTiny, MtpHiddenOutputIsTheResidualBeforeTheHeadNorm) {
  const std::string dir = std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";
  ModelOptions mo;
  mo.threads = 2;
  auto loaded = DeepseekV3Model::load(dir, mo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const auto& m = *loaded;
  const DeepseekV3Config& c = m->config();
  const int64_t v = c.vocab_size, d = c.hidden_size, L = c.num_hidden_layers;
  const auto all = read_raw<int32_t>(
      std::string(XDS_SOURCE_DIR) + "/tests/conformance/kjv_moe_tiny/tokens.i32", 64);
  const std::vector<int32_t> ids(all.begin(), all.begin() + 24);
  KvCache cache = m->make_cache(64).value();
  const int64_t seq = cache.add_sequence();
  StepOutput main_out, mtp_out;
  const TokenChunk tc = cache.chunk(seq, 0, ids).value();
  ASSERT_TRUE(m->forward({&tc, 1}, cache.storage(), main_out).ok());
  const int64_t rows = 23;
  const MtpChunk mc =
      cache.mtp_chunk(seq, 0, std::span(ids).subspan(1), main_out.hidden.data()).value();
  ASSERT_TRUE(m->forward_mtp(0, {&mc, 1}, cache.storage(), mtp_out).ok());
  ASSERT_EQ(mtp_out.hidden.size(), static_cast<size_t>(rows * d));
  ASSERT_EQ(mtp_out.logits.size(), static_cast<size_t>(rows * v));

  // By hand, in double, from the checkpoint's own tensors: logits = head · RMSNorm(hidden,
  // shared_head.norm), within the f32 contract (1e-4 of the row's largest |logit|).
  Checkpoint ck = Checkpoint::open(dir).value();
  const std::string pre = "model.layers." + std::to_string(L) + ".shared_head.";
  const TensorView* norm = ck.require(pre + "norm.weight", std::vector<int64_t>{d}).value();
  const TensorView* head = ck.require(pre + "head.weight", std::vector<int64_t>{v, d}).value();
  ASSERT_EQ(norm->dtype, DType::kBF16);
  ASSERT_EQ(head->dtype, DType::kBF16);
  const auto* nw = reinterpret_cast<const uint16_t*>(norm->data);
  const auto* hw = reinterpret_cast<const uint16_t*>(head->data);
  for (int64_t r = 0; r < rows; ++r) {
    const float* h = mtp_out.hidden.data() + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(h[i]) * h[i];
    const double inv = 1.0 / std::sqrt(ss / d + c.rms_norm_eps);
    std::vector<double> xn(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) xn[i] = h[i] * inv * bf16_to_f32(nw[i]);
    const float* got = mtp_out.logits.data() + r * v;
    const double tol = 1e-4 * max_abs(got, v);
    for (int64_t t = 0; t < v; ++t) {
      double want = 0;
      for (int64_t i = 0; i < d; ++i) want += double(bf16_to_f32(hw[t * d + i])) * xn[i];
      ASSERT_NEAR(got[t], want, tol) << "row " << r << " token " << t;
    }
  }

  // Chaining through out.hidden in place equals feeding a copy of the residual explicitly.
  const std::vector<float> residual(mtp_out.hidden.end() - d, mtp_out.hidden.end());
  const int32_t draft = argmax(mtp_out.logits.data() + (rows - 1) * v, v);
  KvCache twin = m->make_cache(64).value();
  const int64_t seq2 = twin.add_sequence();
  StepOutput main2, explicit_out;
  const TokenChunk tc2 = twin.chunk(seq2, 0, ids).value();
  ASSERT_TRUE(m->forward({&tc2, 1}, twin.storage(), main2).ok());
  const MtpChunk mc2 =
      twin.mtp_chunk(seq2, 0, std::span(ids).subspan(1), main2.hidden.data()).value();
  ASSERT_TRUE(m->forward_mtp(0, {&mc2, 1}, twin.storage(), explicit_out).ok());
  const MtpChunk chained =
      cache.mtp_chunk(seq, rows, std::span(&draft, 1), mtp_out.hidden.data() + (rows - 1) * d)
          .value();
  ASSERT_TRUE(m->forward_mtp(0, {&chained, 1}, cache.storage(), mtp_out).ok());
  const MtpChunk fed =
      twin.mtp_chunk(seq2, rows, std::span(&draft, 1), residual.data()).value();
  ASSERT_TRUE(m->forward_mtp(0, {&fed, 1}, twin.storage(), explicit_out).ok());
  ASSERT_EQ(mtp_out.logits.size(), static_cast<size_t>(v));
  EXPECT_EQ(std::memcmp(mtp_out.logits.data(), explicit_out.logits.data(), sizeof(float) * v), 0);
  EXPECT_EQ(std::memcmp(mtp_out.hidden.data(), explicit_out.hidden.data(), sizeof(float) * d), 0);
}

}  // namespace
}  // namespace xds
