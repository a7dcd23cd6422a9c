// The engine's view of a model (CausalLm, load_causal_lm) on a tiny random checkpoint:
// the registry, zero-token steps that still join every MoE exchange, block tables checked
// before anything is written, and blocks shared between sequences (fork, copy on write)
// in caller-provided memory giving the logits of a cold run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "mkmodel/mkmodel.h"
#include "test_models.h"
#include "model/block_allocator.h"
#include "model/deepseek_v3/deepseek_v3.h"
#include "model/kv_storage.h"
#include "model/linear_runner.h"
#include "model/local_moe.h"
#include "model/registry.h"

namespace xds {
namespace {

std::string tiny_dir() {
  static const std::string dir = [] {
    const std::string d = (std::filesystem::temp_directory_path() / "xds_causal_lm_tiny").string();
    MkModelOptions o;
    o.out_dir = d;
    o.seed = 21;
    o.progress = false;
    const Status s = write_random_checkpoint(o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return d;
  }();
  return dir;
}

std::unique_ptr<CausalLm> load_tiny() {
  ModelOptions mo;
  mo.threads = 2;
  auto m = load_causal_lm(tiny_dir(), mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

using fixtures::random_ids;

KvStorage owned_storage(const CausalLm& m, int64_t blocks) {
  return KvStorage::create({m.kv_layout(), blocks, 16}, -1).value();
}

void write_config(const std::string& dir, const std::string& json) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << json;
}

// The tiny preset (mkmodel): 3 decoder layers, the first dense, one MTP layer; 16 experts,
// top-4; vocab 512; eos 1.
TEST(Registry, LoadsTheArchitectureNamedByModelType) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  const ModelInfo& info = m->info();
  EXPECT_EQ(info.model_type, "deepseek_v3");
  EXPECT_EQ(info.name, "xds_causal_lm_tiny");
  EXPECT_EQ(info.vocab_size, 512);
  EXPECT_EQ(info.hidden_size, 256);
  EXPECT_EQ(info.num_layers, 3);
  EXPECT_EQ(info.n_mtp_layers, 1);
  EXPECT_EQ(info.n_routed_experts, 16);
  EXPECT_EQ(info.experts_per_token, 4);
  EXPECT_EQ(info.moe_layers, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(info.max_position_embeddings, 512);
  EXPECT_EQ(info.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_NE(m->moe_weights(1), nullptr);
  EXPECT_EQ(m->moe_weights(0), nullptr);  // dense
  EXPECT_EQ(m->moe_weights(4), nullptr);  // no such layer
  // KV: 4 cache layers of latent 96 (f32, rows padded to 112: 7 lines) and rope 16.
  const KvLayout kv = m->kv_layout();
  EXPECT_EQ(kv.layers, 4);
  ASSERT_EQ(kv.planes.size(), 2u);
  EXPECT_EQ(kv.planes[0].elements, 96);
  EXPECT_EQ(kv.planes[0].row_bytes, 112 * 4);
  EXPECT_EQ(kv.planes[1].elements, 16);
  EXPECT_EQ(supported_model_types(),
            (std::vector<std::string>{"deepseek_v3", "kimi_k2", "deepseek_v2", "qwen3_moe",
                                      "glm4_moe", "xds_scripted"}));
  // load_model_info reads the same facts from the config files alone.
  const auto light = load_model_info(tiny_dir());
  ASSERT_TRUE(light.ok()) << light.status().to_string();
  EXPECT_EQ(light->model_type, info.model_type);
  EXPECT_EQ(light->name, info.name);
  EXPECT_EQ(light->vocab_size, info.vocab_size);
  EXPECT_EQ(light->hidden_size, info.hidden_size);
  EXPECT_EQ(light->num_layers, info.num_layers);
  EXPECT_EQ(light->n_mtp_layers, info.n_mtp_layers);
  EXPECT_EQ(light->n_routed_experts, info.n_routed_experts);
  EXPECT_EQ(light->experts_per_token, info.experts_per_token);
  EXPECT_EQ(light->moe_layers, info.moe_layers);
  EXPECT_EQ(light->max_position_embeddings, info.max_position_embeddings);
  EXPECT_EQ(light->eos_token_ids, info.eos_token_ids);
  EXPECT_EQ(light->bos_token_id, info.bos_token_id);
}

TEST(Registry, UnknownOrMissingTypesAreClearErrors) {
  const std::string root = (std::filesystem::temp_directory_path() / "xds_registry").string();
  write_config(root + "/mixtral", R"({"model_type": "mixtral"})");
  const auto unknown = load_causal_lm(root + "/mixtral", {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'model_type': 'mixtral' is not supported "
                                            "(supported: deepseek_v3, kimi_k2, deepseek_v2, "
                                            "qwen3_moe, glm4_moe, xds_scripted)"),
            std::string::npos)
      << unknown.status().message();
  write_config(root + "/arch", R"({"architectures": ["DeepseekV3ForCausalLM"]})");
  EXPECT_EQ(causal_lm_type(root + "/arch").value(), "deepseek_v3");
  write_config(root + "/v2arch", R"({"architectures": ["DeepseekV2ForCausalLM"]})");
  EXPECT_EQ(causal_lm_type(root + "/v2arch").value(), "deepseek_v2");
  write_config(root + "/kimi", R"({"model_type": "kimi_k2",
                                   "architectures": ["DeepseekV3ForCausalLM"]})");
  EXPECT_EQ(causal_lm_type(root + "/kimi").value(), "kimi_k2");
  write_config(root + "/glmarch", R"({"architectures": ["Glm4MoeForCausalLM"]})");
  EXPECT_EQ(causal_lm_type(root + "/glmarch").value(), "glm4_moe");
  write_config(root + "/none", R"({"hidden_size": 8})");
  EXPECT_NE(causal_lm_type(root + "/none").status().message().find("'model_type' is missing"),
            std::string::npos);
  const auto missing = load_causal_lm(root + "/absent", {});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Kimi K2 and DeepSeek-V2 checkpoints load through the registry with the DeepSeek-V3 model
// and report their own model_type; DeepSeek-V2's router rule reaches ModelInfo's gating
// (softmax, group_limited_greedy, × 16 only when not normalised) and it has no MTP layer.
TEST(Registry, LoadsKimiK2AndDeepseekV2) {
  for (const std::string arch : {"kimi_k2", "deepseek_v2"}) {
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("xds_causal_lm_" + arch)).string();
    MkModelOptions o;
    o.out_dir = dir;
    o.arch = arch;
    o.seed = 7;
    o.progress = false;
    o.threads = 1;
    ASSERT_TRUE(write_random_checkpoint(o).ok());
    ModelOptions mo;
    mo.threads = 1;
    const auto m = load_causal_lm(dir, mo);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const ModelInfo& info = (*m)->info();
    EXPECT_EQ(info.model_type, arch);
    EXPECT_EQ(info.n_mtp_layers, 0);
    EXPECT_EQ(info.moe_layers, (std::vector<int64_t>{1, 2}));
    if (arch == "deepseek_v2") {
      EXPECT_EQ(info.gating.score, GatingScore::kSoftmax);
      EXPECT_EQ(info.gating.method, TopkMethod::kGroupLimitedGreedy);
      EXPECT_EQ(info.gating.scaling, RoutedScaling::kUnnormalizedOnly);
      EXPECT_DOUBLE_EQ(info.gating.routed_scaling_factor, 16.0);
    } else {
      EXPECT_EQ(info.gating.n_group, 1);
      EXPECT_DOUBLE_EQ(info.gating.routed_scaling_factor, 2.827);
    }
    EXPECT_EQ(load_model_info(dir).value().model_type, arch);
  }
}

// The tiny preset's MoE as ModelInfo describes it, from the values mkmodel writes
// (mkmodel_config): 16 experts, top-4 in 4 groups keeping 2, sigmoid scores with the
// correction bias (noaux_tc), normalised, scaled by 2.5; experts 96 wide, one shared expert;
// layer 0 dense, layers 1-2 and the MTP layer 3 MoE.
TEST(CausalLm, ModelInfoDescribesTheMoe) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  const ModelInfo& info = m->info();
  EXPECT_EQ(info.n_routed_experts, 16);
  EXPECT_EQ(info.experts_per_token, 4);
  EXPECT_EQ(info.moe_layers, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(info.gating.num_experts, 16);
  EXPECT_EQ(info.gating.top_k, 4);
  EXPECT_EQ(info.gating.n_group, 4);
  EXPECT_EQ(info.gating.topk_group, 2);
  EXPECT_EQ(info.gating.score, GatingScore::kSigmoid);
  EXPECT_EQ(info.gating.method, TopkMethod::kNoauxTc);
  EXPECT_TRUE(info.gating.norm_topk_prob);
  EXPECT_DOUBLE_EQ(info.gating.routed_scaling_factor, 2.5);
  EXPECT_EQ(info.expert_intermediate_size, 96);
  EXPECT_EQ(info.n_shared_experts, 1);
  EXPECT_EQ(info.shared_intermediate_size, 96);
  for (int64_t l = 0; l < info.num_layers + info.n_mtp_layers; ++l) {
    const MoeWeights* w = m->moe_weights(l);
    const bool moe = std::find(info.moe_layers.begin(), info.moe_layers.end(), l) !=
                     info.moe_layers.end();
    ASSERT_EQ(w != nullptr, moe) << l;
    if (!moe) continue;
    EXPECT_EQ(static_cast<int64_t>(w->experts.size()), info.n_routed_experts);
    EXPECT_EQ(w->experts[0].gate_proj.rows, info.expert_intermediate_size);
    ASSERT_TRUE(w->shared.has_value());
    EXPECT_EQ(w->shared->gate_proj.rows, info.shared_intermediate_size);
  }
}

// Every cache layer's routed experts (nullptr for a dense layer).
std::vector<const MoeWeights*> moe_layers_of(const CausalLm& m) {
  std::vector<const MoeWeights*> layers;
  for (int64_t l = 0; l < m.info().num_layers + m.info().n_mtp_layers; ++l)
    layers.push_back(m.moe_weights(l));
  return layers;
}

// Records each exchange call (layer, rows) and computes it with the local experts.
class RecordingExchange final : public MoeExchange {
 public:
  RecordingExchange(const CausalLm& m, ThreadPool& pool)
      : linear_(ComputeDType::kF32, pool),
        local_(moe_layers_of(m), m.info().hidden_size, linear_) {}
  Status run(const MoeExchangeInput& in) override {
    calls.emplace_back(in.layer, in.n);
    return local_.run(in);
  }
  std::vector<std::pair<int64_t, int64_t>> calls;

 private:
  LinearRunner linear_;
  LocalMoeExchange local_;
};

// A device with no tokens joins every MoE layer's exchange, in the order a real step does.
TEST(CausalLm, ZeroTokenStepsJoinEveryMoeExchangeInLayerOrder) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  auto& model = dynamic_cast<DeepseekV3Model&>(*m);
  ThreadPool pool(1);
  RecordingExchange rec(model, pool);
  m->set_moe_exchange(&rec);
  KvStorage kv = owned_storage(*m, 4);
  StepOutput out;
  out.logits.assign(7, 1.0f);  // stale outputs are cleared
  out.hidden.assign(7, 1.0f);
  out.logit_tokens.assign(2, 0);

  ASSERT_TRUE(m->forward({}, kv, out).ok());
  const std::vector<std::pair<int64_t, int64_t>> empty_main = {{1, 0}, {2, 0}};
  EXPECT_EQ(rec.calls, empty_main);
  EXPECT_TRUE(out.logits.empty());
  EXPECT_TRUE(out.hidden.empty());
  EXPECT_TRUE(out.logit_tokens.empty());

  // Chunks without tokens are a zero-token step too.
  rec.calls.clear();
  const std::vector<int32_t> table = {0};
  const TokenChunk nothing[] = {{0, {}, table, false}, {3, {}, table, true}};
  ASSERT_TRUE(m->forward(nothing, kv, out).ok());
  EXPECT_EQ(rec.calls, empty_main);

  // A real step: the same layers in the same order.
  rec.calls.clear();
  const auto ids = random_ids(5, 512, 3);
  const TokenChunk real{0, ids, table, false};
  ASSERT_TRUE(m->forward({&real, 1}, kv, out).ok());
  EXPECT_EQ(rec.calls, (std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {2, 5}}));
  EXPECT_EQ(out.logits.size(), 512u);

  rec.calls.clear();
  ASSERT_TRUE(m->forward_mtp(0, {}, kv, out).ok());
  EXPECT_EQ(rec.calls, (std::vector<std::pair<int64_t, int64_t>>{{3, 0}}));
  EXPECT_TRUE(out.logits.empty());
  m->set_moe_exchange(nullptr);  // the local experts again
}

// The layer callback runs once after each decoder layer, in order: every layer of forward
// (a step with tokens and one without), the MTP layer of forward_mtp; none once cleared.
TEST(CausalLm, LayerCallbackRunsOnceAfterEachLayer) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  const int64_t layers = m->info().num_layers;
  ASSERT_EQ(layers, 3);
  std::vector<int64_t> seen;
  m->set_layer_callback(
      [](void* context, int64_t layer) {
        static_cast<std::vector<int64_t>*>(context)->push_back(layer);
      },
      &seen);
  KvStorage kv = owned_storage(*m, 4);
  StepOutput out;
  const std::vector<int32_t> table = {0};
  const auto ids = random_ids(5, 512, 7);
  const TokenChunk chunk{0, ids, table, false};
  ASSERT_TRUE(m->forward({&chunk, 1}, kv, out).ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2}));

  seen.clear();
  ASSERT_TRUE(m->forward({}, kv, out).ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2}));

  seen.clear();
  const std::vector<float> h(static_cast<size_t>(4 * m->info().hidden_size), 0.5f);
  const MtpChunk mtp{0, std::span(ids).subspan(1, 4), h.data(), table};
  ASSERT_TRUE(m->forward_mtp(0, {&mtp, 1}, kv, out).ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{3}));

  seen.clear();
  m->set_layer_callback(nullptr, nullptr);
  ASSERT_TRUE(m->forward({&chunk, 1}, kv, out).ok());
  EXPECT_TRUE(seen.empty());
}

// routed_token_counts (EPLB's Collect step) against a second count made from the routing
// observer's per-token choices: the same cumulative table, MTP layer included, and each layer's
// row sums to tokens x experts_per_token.
TEST(CausalLm, RoutedTokenCountsAccumulateEveryTokensChoices) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  const ModelInfo& info = m->info();
  const int64_t e = info.n_routed_experts, k = info.experts_per_token;
  const std::span<const int64_t> counts = m->routed_token_counts();
  ASSERT_EQ(counts.size(), info.moe_layers.size() * static_cast<size_t>(e));
  for (int64_t c : counts) EXPECT_EQ(c, 0);

  std::vector<int64_t> seen(counts.size(), 0);
  m->set_routing_observer([&](int64_t layer, int64_t, std::span<const int32_t> experts) {
    const auto row = std::find(info.moe_layers.begin(), info.moe_layers.end(), layer) -
                     info.moe_layers.begin();
    for (int32_t x : experts) ++seen[static_cast<size_t>(row * e + x)];
  });
  KvStorage kv = owned_storage(*m, 4);
  StepOutput out;
  const std::vector<int32_t> table = {0, 1};
  const auto ids = random_ids(20, 512, 5);
  const TokenChunk first{0, std::span(ids).first(12), table, false};
  const TokenChunk second{12, std::span(ids).subspan(12), table, false};
  ASSERT_TRUE(m->forward({&first, 1}, kv, out).ok());
  ASSERT_TRUE(m->forward({&second, 1}, kv, out).ok());
  std::vector<float> hidden = out.hidden;  // 8 rows
  const MtpChunk mtp{12, std::span(ids).subspan(12, 7), hidden.data(), table};
  ASSERT_TRUE(m->forward_mtp(0, {&mtp, 1}, kv, out).ok());
  m->set_routing_observer(nullptr);

  EXPECT_EQ(std::vector<int64_t>(counts.begin(), counts.end()), seen);
  for (size_t r = 0; r < info.moe_layers.size(); ++r) {
    const bool is_mtp = info.moe_layers[r] >= info.num_layers;
    int64_t sum = 0;
    for (int64_t x = 0; x < e; ++x) sum += counts[r * static_cast<size_t>(e) + x];
    EXPECT_EQ(sum, (is_mtp ? 7 : 20) * k) << "layer " << info.moe_layers[r];
  }
}

// A block table that does not cover a chunk, or names a block outside the storage, is an
// error naming the chunk, and nothing is written (the earlier chunks' rows included).
TEST(CausalLm, BlockTablesAreCheckedBeforeAnythingIsWritten) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  KvStorage kv = owned_storage(*m, 4);
  const auto ids = random_ids(20, 512, 5);
  const std::vector<int32_t> two = {0, 1}, one = {2}, bad = {3, 9};
  StepOutput out;
  const TokenChunk short_table[] = {{0, std::span(ids).first(4), two, false}, {0, ids, one, false}};
  const Status s = m->forward(short_table, kv, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk 1: positions [0, 20) need 2 blocks of 16 rows, its block "
                             "table has 1"),
            std::string::npos)
      << s.message();
  const TokenChunk out_of_range{0, ids, bad, false};
  const Status r = m->forward({&out_of_range, 1}, kv, out);
  EXPECT_NE(r.message().find("chunk 0: block table entry 1 is block 9, outside [0, 4)"),
            std::string::npos)
      << r.message();
  for (int64_t i = 0; i < kv.bytes(); ++i) ASSERT_EQ(kv.data()[i], std::byte{0}) << i;
  // A storage of another model's layout is refused.
  KvStorageShape other{mla_kv_layout(4, 64, 16, DType::kF32), 4, 16};
  KvStorage wrong = KvStorage::create(other, -1).value();
  const TokenChunk fine{0, ids, two, false};
  EXPECT_EQ(m->forward({&fine, 1}, wrong, out).code(), StatusCode::kInvalidArgument);
}

// Prefix sharing as the engine does it, in memory the caller owns: sequence B forks A after
// 20 tokens (block 0 shared, the partial block 1 copied on write), then each decodes its own
// next token. Each gets the bits of the same prefill + decode on a fresh, owned cache.
TEST(CausalLm, ForkedSequencesInCallerMemoryGiveTheLogitsOfColdRuns) {
  const auto m = load_tiny();
  ASSERT_NE(m, nullptr);
  const auto prompt = random_ids(20, 512, 8);
  const int32_t next_a = 17, next_b = 301;
  const KvStorageShape shape{m->kv_layout(), 8, 16};
  const int64_t bytes = KvStorage::bytes_for(shape);
  std::vector<std::byte> memory(static_cast<size_t>(bytes + 64));
  const size_t skew = (64 - reinterpret_cast<uintptr_t>(memory.data()) % 64) % 64;
  KvStorage kv =
      KvStorage::wrap(shape, std::span(memory.data() + skew, static_cast<size_t>(bytes))).value();
  BlockAllocator blocks(8);

  StepOutput out;
  std::vector<int32_t> table_a;
  ASSERT_TRUE(blocks.allocate(2, table_a).ok());  // 20 positions: 2 blocks of 16
  const TokenChunk prefill{0, prompt, table_a, false};
  ASSERT_TRUE(m->forward({&prefill, 1}, kv, out).ok());

  std::vector<int32_t> table_b = table_a;  // the fork
  blocks.ref(table_b);
  for (size_t i = 0; i < table_b.size(); ++i) {  // B writes position 20 of block 1
    if (i != 1) continue;
    const BlockAllocator::Writable w = blocks.ensure_writable(table_b[i]).value();
    ASSERT_GE(w.copy_from, 0);
    kv.copy_block(w.copy_from, w.block);
    table_b[i] = w.block;
  }
  EXPECT_TRUE(blocks.writable(table_a[1]));   // A's again alone
  EXPECT_FALSE(blocks.writable(table_a[0]));  // shared, never written

  auto decode = [&](const std::vector<int32_t>& table, const int32_t* token) {
    const TokenChunk step{20, std::span(token, 1), table, false};
    EXPECT_TRUE(m->forward({&step, 1}, kv, out).ok());
    return out.logits;
  };
  const std::vector<float> b = decode(table_b, &next_b);
  const std::vector<float> a = decode(table_a, &next_a);

  auto cold = [&](int32_t token) {
    KvStorage fresh = owned_storage(*m, 2);
    const std::vector<int32_t> t = {1, 0};
    StepOutput o;
    const TokenChunk p{0, prompt, t, false};
    EXPECT_TRUE(m->forward({&p, 1}, fresh, o).ok());
    const TokenChunk s{20, std::span(&token, 1), t, false};
    EXPECT_TRUE(m->forward({&s, 1}, fresh, o).ok());
    return o.logits;
  };
  const std::vector<float> cold_a = cold(next_a), cold_b = cold(next_b);
  ASSERT_EQ(a.size(), cold_a.size());
  EXPECT_EQ(std::memcmp(a.data(), cold_a.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(b.data(), cold_b.data(), b.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  blocks.unref(table_a);
  blocks.unref(table_b);
  EXPECT_EQ(blocks.free_count(), 8);
}

}  // namespace
}  // namespace xds
