// W8A8 checkpoints with lm_head and kv_b_proj in int8 too (mkmodel --weights-int8
// --int8-head-and-kv-b): the layout written (config without them in `ignore`, their RTN
// values against the float model of the same seed, computed here), the bound int8 lm_head
// and the absorbed heads of kv_b_proj (W_UK with its row scales folded into the query, W_UV
// with its own) against a plain W8A8 reference bit for bit and against float64 products by
// the dequantized weights within the activation rounding's derived bound, and a scale
// tensor of the wrong shape refused by name. (Whole forwards, absorbed and expanded, against
// the float64 oracle: the conformance case w8a8_head_kv_b_kjv; accuracy of the shipped
// model: tests/integration/model/w8a8_kjv_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/bf16.h"
#include "base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "mkmodel/mkmodel.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/deepseek_v3/deepseek_v3_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "int8_head_kv_b_checks.h"
#include "test_files.h"

namespace xds {
namespace {

using json = nlohmann::json;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class Int8HeadKvB : public xds::testing::TempDirTest {
 protected:
  // The tiny model of `seed` as float (bf16) in dir/float, as W8A8 with int8 lm_head and
  // kv_b_proj in dir/int8 (one safetensors file each).
  void make_pair(uint64_t seed) {
    for (const bool int8 : {false, true}) {
      MkModelOptions o;
      o.out_dir = path(int8 ? "int8" : "float");
      o.seed = seed;
      o.weights_int8 = int8;
      o.int8_head_and_kv_b = int8;
      o.progress = false;
      o.threads = 2;
      const Status s = write_random_checkpoint(o);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
  }
  RepackOptions repack() const {
    RepackOptions o;
    o.dir = path("cache");
    o.progress = false;
    return o;
  }
};

TEST_F(Int8HeadKvB, LayoutQuantizesLmHeadAndKvBWithRtnOfTheFloatModel) {
  make_pair(5);
  std::ifstream cf(path("int8/config.json"));
  const json q = json::parse(cf).at("quantization_config");
  EXPECT_EQ(q.at("config_groups").at("group_0").at("targets"), json::array({"Linear"}));
  EXPECT_EQ(q.at("ignore"), json::parse(R"(["re:.*mlp\\.gate$", "re:.*eh_proj$"])"));
  auto fl = Checkpoint::open(path("float"));
  auto i8 = Checkpoint::open(path("int8"));
  ASSERT_TRUE(fl.ok() && i8.ok());
  int64_t checked = 0;
  xds::testing::expect_rtn_head_and_kv_b(*fl, *i8, &checked);
  EXPECT_GE(checked, 3);  // lm_head, the layers' kv_b_proj, the MTP layer's head
}

TEST_F(Int8HeadKvB, BoundHeadsAndLmHeadMatchPlainW8A8AndFloat64) {
  make_pair(7);
  auto cfg = load_deepseek_v3_config(path("int8"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto ckpt = Checkpoint::open(path("int8"));
  ASSERT_TRUE(ckpt.ok());
  RepackCache cache(repack());
  auto w = bind_deepseek_v3_weights(*cfg, *ckpt, cache);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  xds::testing::expect_bound_head_and_kv_b(*cfg, *ckpt, *w);
}

// The header of dir/model.safetensors with `tensor`'s shape [rows,1] written as [1,rows]
// (the same number of bytes, so the data offsets stay).
void transpose_scale_shape(const std::string& file, const std::string& tensor) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  in.close();
  const size_t at = bytes.find("\"" + tensor + "\"");
  ASSERT_NE(at, std::string::npos) << tensor;
  const size_t open = bytes.find("\"shape\":[", at) + 9;
  const size_t close = bytes.find(']', open);
  const std::string shape = bytes.substr(open, close - open);  // "rows,1"
  ASSERT_TRUE(shape.ends_with(",1")) << shape;
  bytes.replace(open, close - open, "1," + shape.substr(0, shape.size() - 2));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_F(Int8HeadKvB, AScaleOfTheWrongShapeIsRefusedNamingTheTensor) {
  ModelOptions mo;
  mo.threads = 1;
  for (const std::string tensor :
       {"model.layers.0.self_attn.kv_b_proj.weight_scale", "lm_head.weight_scale"}) {
    make_pair(9);
    transpose_scale_shape(path("int8/model.safetensors"), tensor);
    auto m = DeepseekV3Model::load(path("int8"), mo);
    ASSERT_FALSE(m.ok()) << tensor;
    EXPECT_CONTAINS(m.status().message(), tensor);
    EXPECT_CONTAINS(m.status().message(), "model.safetensors");
  }
}

}  // namespace
}  // namespace xds
