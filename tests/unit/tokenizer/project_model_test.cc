// The project's own model (models/kjv-moe-tiny): its tokenizer and chat template against
// @huggingface/tokenizers / @huggingface/jinja. The fixtures carry an FNV-1a fingerprint of the
// model's tokenizer files; the test skips (saying so) when the model is absent or was retrained
// after the fixtures were generated (rerun tests/fixtures/tokenizer/gen/gen_fixtures.mjs).
#include <cinttypes>

#include "fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace xds {
namespace {

std::string fnv1a64_hex(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return fmt::format("{:016x}", h);
}

TEST(ProjectModel, KjvMoeTinyMatchesHuggingFace) {
  const std::string dir = std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";
  if (!Tokenizer::has_tokenizer_files(dir)) GTEST_SKIP() << dir << " has no tokenizer.json";
  const auto fx = test::read_json(test::fixture_dir() + "/expected/encode_kjv_moe_tiny.json");
  if (fnv1a64_hex(test::read_text(dir + "/tokenizer.json")) != fx["fingerprint"]["tokenizer_json_fnv1a64"] ||
      fnv1a64_hex(test::read_text(dir + "/tokenizer_config.json")) !=
          fx["fingerprint"]["tokenizer_config_json_fnv1a64"]) {
    GTEST_SKIP() << dir << ": tokenizer files changed since the fixtures were generated";
  }
  auto tok = Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  for (const auto& c : fx["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string text = utf8::replace_invalid(test::from_hex(c["text_hex"]));
    auto ids = tok->encode(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(*tok->encode(text, true), c["ids_special"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok->decode(*ids, false), c["decoded"].get<std::string>());
  }
  auto tmpl = ChatTemplate::from_tokenizer_config(dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  const auto cases = test::read_json(test::fixture_dir() + "/gen/chat_cases.json");
  for (const auto& e : test::read_json(test::fixture_dir() + "/expected/chat_kjv_moe_tiny.json")) {
    for (const auto& c : cases) {
      if (c["name"] != e["name"]) continue;
      auto got = tmpl->render_ordered(c["messages"], e["add_generation_prompt"].get<bool>());
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(*got, e["rendered"].get<std::string>());
      // transformers trusts the messages: our kTrusted (serve's default is checked in
      // untrusted_text_test.cc).
      auto ids =
          encode_chat_ordered(*tok, *tmpl, c["messages"], e["add_generation_prompt"].get<bool>(),
                              nullptr, MessageTrust::kTrusted);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(*ids, e["ids"].get<std::vector<int32_t>>());  // one BOS, from the template
    }
  }
}

}  // namespace
}  // namespace xds
