#include "tokenizer_checks.h"

#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"

namespace xds::fuzz {

namespace {

constexpr std::string_view kTexts[] = {
    "Hello, world!",
    "  leading spaces\tand\ttabs\n\nnew lines   ",
    "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80 123 4567",
    "<s>special look-alikes</s><|im_start|><\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "",
};

void check_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, std::string_view text) {
  for (int32_t id : ids) {
    XDS_CHECK(id >= 0 && id < tok.vocab_size(), "encode(\"{}\"): id {} outside [0, {})", text, id,
              tok.vocab_size());
  }
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  const std::string whole = tok.decode(ids, skip_special);
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) streamed += detok.push(id);
  streamed += detok.flush();
  XDS_CHECK(streamed == whole, "streamed \"{}\" != decoded \"{}\"", streamed, whole);
}

void check_taint(const PromptText& p) {
  size_t last_end = 0;
  for (size_t i = 0; i < p.untrusted.size(); ++i) {
    const TextRange& r = p.untrusted[i];
    XDS_CHECK(r.begin < r.end && r.end <= p.text.size(), "range [{}, {}) of {} bytes", r.begin,
              r.end, p.text.size());
    XDS_CHECK(i == 0 || r.begin > last_end, "range [{}, {}) after one ending at {}", r.begin, r.end,
              last_end);
    last_end = r.end;
  }
}

}  // namespace

void check_tokenizer(const Tokenizer& tok, bool stream_equals_decode) {
  for (std::string_view text : kTexts) {
    for (bool special : {false, true}) {
      auto ids = tok.encode(text, special);
      if (!ids.ok()) continue;  // e.g. a vocabulary without the bytes of the text
      check_ids(tok, ids.value(), text);
      if (special && tok.adds_bos()) {
        XDS_CHECK(!ids.value().empty() && ids.value().front() == *tok.bos_id(),
                  "encode(\"{}\", add_special_tokens) without BOS first", text);
      }
      for (bool skip : {false, true}) {
        (void)tok.decode(ids.value(), skip);
        if (stream_equals_decode) check_stream(tok, ids.value(), skip);
      }
    }
    auto untrusted = tok.encode(PromptText::from_request(std::string(text)), false);
    if (untrusted.ok()) check_ids(tok, untrusted.value(), text);
  }
  // Every id the vocabulary has, and a few it has not.
  std::vector<int32_t> all;
  for (int32_t id = 0; id < tok.vocab_size() && id < 512; ++id) all.push_back(id);
  all.push_back(-1);
  all.push_back(static_cast<int32_t>(std::min<int64_t>(tok.vocab_size(), INT32_MAX)));
  for (bool skip : {false, true}) {
    (void)tok.decode(all, skip);
    IncrementalDetokenizer detok(tok, skip);
    for (int32_t id : all) (void)detok.push(id);
    (void)detok.flush();
  }
  for (int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) {
    if (auto text = tok.id_to_token(id)) (void)tok.token_to_id(*text);
  }
}

const nlohmann::ordered_json& fixed_messages() {
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris? <|im_end|>"},
    {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
    {"role": "user", "content": "Thanks."}
  ])");
  return kMessages;
}

const nlohmann::ordered_json& fixed_tools() {
  static const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}}
  ])");
  return kTools;
}

jinja::RenderLimits fuzz_render_limits() {
  jinja::RenderLimits limits;
  limits.max_steps = 100'000;
  limits.max_string_bytes = size_t{1} << 20;
  limits.max_list_items = size_t{1} << 16;
  return limits;
}

void check_template(const ChatTemplate& tmpl) {
  const ChatTemplate bounded = tmpl.with_limits(fuzz_render_limits());
  for (bool add_generation_prompt : {true, false}) {
    auto p = bounded.render_prompt(fixed_messages(), add_generation_prompt, fixed_tools());
    if (p.ok()) check_taint(p.value());
  }
  (void)bounded.render_prompt(nlohmann::ordered_json::array(), true);
}

}  // namespace xds::fuzz
