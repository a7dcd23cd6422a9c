// GLM-4.5 through the registry against the float64 oracle written from transformers' and
// vLLM's modeling code (tests/conformance/oracle/glm4_oracle.py), on checkpoints written by
// the independent make_tiny_glm4.py: the main model's logits of a prefill, and the MTP layer's
// draft logits (row t from the main hidden at t and token t+1, teacher forced), each row
// within 1e-4 of the row's largest |logit|. Decode and greedy tokens are checked by
// conformance.glm4_f32.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/registry.h"

namespace xds {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitRtol = 1e-4;
constexpr double kRoutingMargin = 5e-4;  // below it a routing decision may flip on rounding

std::vector<double> read_f64(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f.good()) << path;
  const auto bytes = static_cast<size_t>(f.tellg());
  std::vector<double> v(bytes / sizeof(double));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
  return v;
}

// Worst over rows of max |got - want| / max |want| ([rows, vocab] each).
double worst_row_error(const float* got, const std::vector<double>& want, int64_t rows,
                       int64_t vocab) {
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double err = 0, scale = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double w = want[static_cast<size_t>(r * vocab + i)];
      err = std::max(err, std::fabs(got[r * vocab + i] - w));
      scale = std::max(scale, std::fabs(w));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

struct Case {
  const char* name;
  const char* maker_args;  // make_tiny_glm4.py flags
  int seed;
};

// What the test's name shows of a case (not its bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Glm4Oracle : public ::testing::TestWithParam<Case> {};

TEST_P(Glm4Oracle, PrefillAndMtpDraftLogitsMatchTheReference) {
  const Case& c = GetParam();
  const std::string dir = (fs::temp_directory_path() /
                           ("xds_glm4_" + std::string(c.name) + "_" + std::to_string(::getpid())))
                              .string();
  const std::string oracle = std::string(XDS_SOURCE_DIR) + "/tests/conformance/oracle/";
  std::vector<int32_t> ids;
  for (int i = 0; i < 21; ++i) ids.push_back(static_cast<int32_t>(2 + (i * 53 + 7) % 250));
  std::string id_list;
  for (int32_t id : ids) id_list += (id_list.empty() ? "" : ",") + std::to_string(id);
  const std::string make = "/usr/bin/python3 " + oracle + "make_tiny_glm4.py --out " + dir +
                           " --seed " + std::to_string(c.seed) + " " + c.maker_args;
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const std::string ref = dir + "/ref";
  const std::string run = "/usr/bin/python3 " + oracle + "glm4_oracle.py --model " + dir +
                          " --ids " + id_list + " --out " + ref;
  ASSERT_EQ(std::system(run.c_str()), 0) << run;
  ASSERT_GT(read_f64(ref + ".gap.f64").at(0), kRoutingMargin)
      << "the case's seed leaves a routing decision within rounding of a tie: pick another";

  ModelOptions mo;
  mo.threads = 2;
  auto loaded = load_causal_lm(dir, mo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  CausalLm& m = **loaded;
  const int64_t vocab = m.info().vocab_size, n = static_cast<int64_t>(ids.size());
  ASSERT_EQ(m.info().n_mtp_layers, 1);
  KvStorageShape shape;
  shape.layout = m.kv_layout();
  shape.block_size = 16;
  shape.num_blocks = 4;
  auto cache = KvCache::create(shape, -1);
  ASSERT_TRUE(cache.ok()) << cache.status().message();
  const int64_t seq = cache->add_sequence();
  auto chunk = cache->chunk(seq, 0, ids, /*all_logits=*/true);
  ASSERT_TRUE(chunk.ok()) << chunk.status().message();
  StepOutput main;
  ASSERT_TRUE(m.forward({&*chunk, 1}, cache->storage(), main).ok());
  ASSERT_EQ(main.logits.size(), static_cast<size_t>(n * vocab));
  EXPECT_LE(worst_row_error(main.logits.data(), read_f64(ref + ".logits.f64"), n, vocab),
            kLogitRtol);

  // MTP rows 0..n-2: the main hidden at t and token t+1.
  const std::vector<int32_t> next(ids.begin() + 1, ids.end());
  auto mtp = cache->mtp_chunk(seq, 0, next, main.hidden.data());
  ASSERT_TRUE(mtp.ok()) << mtp.status().message();
  StepOutput draft;
  const Status s = m.forward_mtp(0, {&*mtp, 1}, cache->storage(), draft);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(draft.logits.size(), static_cast<size_t>((n - 1) * vocab));
  EXPECT_LE(worst_row_error(draft.logits.data(), read_f64(ref + ".mtp.f64"), n - 1, vocab),
            kLogitRtol);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, Glm4Oracle,
    ::testing::Values(
        // GLM-4.5's attention (biases, q/k norm), head_dim 24 with 12 rotated dims, GQA 2:1,
        // 2 expert groups keeping 1.
        Case{"bias_qknorm", "", 1},
        // GLM-4.5-Air's (no q/k norm), no biases, GQA 4:1, 4 of 16 dims rotate, two dense
        // layers, top-3 over one group, two shards.
        Case{"air_gqa4",
             "--heads 8 --kv-heads 2 --head-dim 16 --partial 0.25 --no-qk-norm "
             "--no-bias --groups 1,1 --top-k 3 --layers 4 --first-dense 2 --shards 2",
             1}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace xds
