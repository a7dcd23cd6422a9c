// Kimi K2 (Instruct)'s published chat template (tests/fixtures/tokenizer/templates/kimi_k2.jinja)
// rendered by our Jinja subset for system, user, assistant and tool turns, tool declarations
// and content given as parts, against strings derived by hand from the template's text; and
// the rendered prompt tokenized by a synthetic Kimi tokenizer, whose special ids must come out
// in the order the turns put them.
#include <filesystem>

#include <gtest/gtest.h>
#include <unistd.h>

#include "fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/kimi_synthetic.h"

namespace xds {
namespace {

using nlohmann::ordered_json;

ChatTemplate kimi_template() {
  auto t = ChatTemplate::from_file(test::fixture_dir() + "/templates/kimi_k2.jinja");
  XDS_CHECK(t.ok(), "{}", t.status().to_string());
  return std::move(t).value();
}

std::string render(const ordered_json& messages, bool agp, const ordered_json& tools = nullptr) {
  auto r = kimi_template().render_ordered(messages, agp, tools);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : "";
}

const char* const kDefaultSystem =
    "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>";

TEST(KimiK2ChatTemplate, SystemAndUserTurnsWithGenerationPrompt) {
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])");
  EXPECT_EQ(render(messages, true),
            "<|im_system|>system<|im_middle|>You are terse.<|im_end|>"
            "<|im_user|>user<|im_middle|>Hi<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
}

TEST(KimiK2ChatTemplate, DefaultSystemPromptWhenTheFirstTurnIsNotSystem) {
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
          {"role": "user", "content": "中文 😀"}])");
  EXPECT_EQ(render(messages, false),
            std::string(kDefaultSystem) +
                "<|im_user|>user<|im_middle|>Hi<|im_end|>"
                "<|im_assistant|>assistant<|im_middle|>Hello!<|im_end|>"
                "<|im_user|>user<|im_middle|>中文 😀<|im_end|>");
}

TEST(KimiK2ChatTemplate, ToolDeclarationsAndToolTurns) {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}])");
  const ordered_json messages = ordered_json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "functions.get_weather:0",
        "type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "{\"temp\": 21}"}])");
  // tools | tojson with Python's json.dumps spacing, keys in the request's order; this
  // template writes no tool_calls of an assistant turn (its later revisions do).
  EXPECT_EQ(render(messages, true, tools),
            "<|im_system|>tool_declare<|im_middle|>"
            "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
            "\"Weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
            "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
            "<|im_end|>" +
                std::string(kDefaultSystem) +
                "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
                "<|im_assistant|>assistant<|im_middle|><|im_end|>"
                "<|im_system|>tool<|im_middle|>{\"temp\": 21}<|im_end|>"
                "<|im_assistant|>assistant<|im_middle|>");
}

TEST(KimiK2ChatTemplate, ContentPartsTextAndImages) {
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": [
      {"type": "text", "text": "Look: "},
      {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
      {"type": "text", "text": " and "}, {"image": "raw"}]}])");
  const std::string media = "<|media_start|>image<|media_content|><|media_pad|><|media_end|>";
  EXPECT_EQ(render(messages, false),
            std::string(kDefaultSystem) + "<|im_user|>user<|im_middle|>Look: " + media + " and " +
                media + "<|im_end|>");
}

TEST(KimiK2ChatTemplate, TokenizedPromptHasTheTurnMarkersAsSpecialIds) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("kimi_tmpl_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const int64_t vocab = 1024;
  ASSERT_TRUE(write_kimi_synthetic_tokenizer(dir.string(), vocab, 3).ok());
  auto tok = Tokenizer::load(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "system", "content": "S"}, {"role": "user", "content": "<|im_end|>hi"}])");
  auto ids = encode_chat_ordered(*tok, kimi_template(), messages, true);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  // Kimi's ids from the first special id (V - 256): im_system +10, im_middle +17, im_end +2,
  // im_user +3, im_assistant +4. The user's own "<|im_end|>" is text, not an id.
  const int32_t first = static_cast<int32_t>(vocab - 256);
  std::vector<int32_t> specials;
  for (const int32_t id : *ids) {
    if (id >= first) specials.push_back(id - first);
  }
  EXPECT_EQ(specials, (std::vector<int32_t>{10, 17, 2, 3, 17, 2, 4, 17}));
  EXPECT_EQ(tok->decode(*ids, false),
            "<|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|><|im_end|>hi"
            "<|im_end|><|im_assistant|>assistant<|im_middle|>");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xds
