// The shipped model's MTP head against the training recipe's float64 reference
// (tests/conformance/kjv_moe_tiny, written by tools/train_tiny/conformance.py): row t of
// the reference predicts token t+2 from the main model's hidden at t and token t+1.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include "model/deepseek_v3.h"

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

}  // namespace
}  // namespace xds
