// generation_config.json's sampling defaults: a request that leaves temperature / top_p / top_k
// out gets the file's values, one that sets them keeps its own; "none" and a missing file give
// the OpenAI defaults; malformed fields are errors naming the field. Expected values are the
// files' own numbers (Qwen3's published generation_config.json), written by hand.
#include "serve/generation_config.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

namespace xds::serve {
namespace {

using nlohmann::json;

// Qwen3-30B-A3B's generation_config.json as published.
constexpr const char* kQwen3GenerationConfig = R"({
  "bos_token_id": 151643,
  "do_sample": true,
  "eos_token_id": [151645, 151643],
  "pad_token_id": 151643,
  "temperature": 0.6,
  "top_k": 20,
  "top_p": 0.95,
  "transformers_version": "4.51.0"
})";

ApiLimits limits() {
  ApiLimits l;
  l.model_names = {"m"};
  l.vocab_size = 1000;
  return l;
}

ApiRequest chat_request(json extra) {
  json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  body.update(extra);
  auto r = parse_chat_request(body, limits());
  EXPECT_TRUE(r.ok());
  return r.value();
}

class GenerationConfigDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("gen_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "generation_config.json") << text; }
  std::filesystem::path dir_;
};

TEST_F(GenerationConfigDir, RequestsWithoutSamplingFieldsGetTheFilesValues) {
  write(kQwen3GenerationConfig);
  auto d = load_sampling_defaults(dir_.string(), "auto");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const engine::SamplingOptions s = make_sampling_options(chat_request(json::object()), 16, 1, *d);
  EXPECT_EQ(s.temperature, 0.6f);
  EXPECT_EQ(s.top_p, 0.95f);
  EXPECT_EQ(s.top_k, 20);
  // Each field the request sets is its own; the others still come from the file.
  const engine::SamplingOptions own = make_sampling_options(
      chat_request({{"temperature", 0.2}, {"top_p", 0.5}, {"top_k", 5}}), 16, 1, *d);
  EXPECT_EQ(own.temperature, 0.2f);
  EXPECT_EQ(own.top_p, 0.5f);
  EXPECT_EQ(own.top_k, 5);
  const engine::SamplingOptions greedy =
      make_sampling_options(chat_request({{"temperature", 0}}), 16, 1, *d);
  EXPECT_EQ(greedy.temperature, 0.0f);
  EXPECT_EQ(greedy.top_p, 0.95f);
  EXPECT_EQ(greedy.top_k, 20);
}

TEST_F(GenerationConfigDir, NoneAndAMissingFileGiveTheOpenAiDefaults) {
  write(kQwen3GenerationConfig);
  auto none = load_sampling_defaults(dir_.string(), "none");
  ASSERT_TRUE(none.ok());
  const engine::SamplingOptions s = make_sampling_options(chat_request(json::object()), 16, 1, *none);
  EXPECT_EQ(s.temperature, 1.0f);
  EXPECT_EQ(s.top_p, 1.0f);
  EXPECT_EQ(s.top_k, 0);
  std::filesystem::remove(dir_ / "generation_config.json");
  auto missing = load_sampling_defaults(dir_.string(), "auto");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->temperature, 1.0f);
  EXPECT_EQ(missing->top_p, 1.0f);
  EXPECT_EQ(missing->top_k, 0);
  auto unknown = load_sampling_defaults(dir_.string(), "vllm");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().to_string().find("'vllm' is unknown"), std::string::npos);
}

TEST(GenerationConfig, FieldsAndErrors) {
  // Only some fields: the rest keep the OpenAI defaults. top_k <= 0 is off.
  auto d = sampling_defaults_from_generation_config(R"({"temperature": 0.3, "top_k": -1})", "g");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->temperature, 0.3f);
  EXPECT_EQ(d->top_p, 1.0f);
  EXPECT_EQ(d->top_k, 0);
  // do_sample false: transformers' greedy decoding.
  d = sampling_defaults_from_generation_config(R"({"do_sample": false, "temperature": 0.7})", "g");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->temperature, 0.0f);
  // A file with no sampling fields (Kimi K2 publishes only eos / max_length).
  d = sampling_defaults_from_generation_config(R"({"eos_token_id": 163586, "max_length": 131072})",
                                               "g");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->temperature, 1.0f);

  const std::pair<const char*, const char*> bad[] = {
      {R"({"temperature": "hot"})", "field 'temperature': expected a number"},
      {R"({"temperature": -0.5})", "field 'temperature': expected >= 0"},
      {R"({"top_p": 0})", "field 'top_p': expected a number in (0, 1]"},
      {R"({"top_p": 1.5})", "field 'top_p': expected a number in (0, 1]"},
      {R"({"top_k": 1.5})", "field 'top_k': expected an integer"},
      {R"({"do_sample": "yes"})", "field 'do_sample': expected a boolean"},
      {"[1]", "expected a JSON object"},
      {"{", "invalid JSON"},
  };
  for (const auto& [text, needle] : bad) {
    auto r = sampling_defaults_from_generation_config(text, "dir/generation_config.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().to_string().find(std::string("dir/generation_config.json: ") + needle),
              std::string::npos)
        << r.status().to_string();
  }
}

}  // namespace
}  // namespace xds::serve
