// Fuzz target: tokenizer_config.json loading: the tokenizer's side (special tokens,
// add_bos_token, clean-up; Tokenizer::from_json_text with a fixed small tokenizer.json) and
// the chat template's side (ChatTemplate::from_tokenizer_config_text). Input: the text of a
// tokenizer_config.json.
//
// Checked beyond "no crash, no hang, no exception": the tokenizer checks of
// tokenizer_checks.h, and a template that loads renders the fixed conversation (then encodes
// it with the tokenizer) or fails with a Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "tokenizer/byte_level.h"
#include "tokenizer_checks.h"

namespace {

// A small byte-level BPE tokenizer.json: the 256 byte symbols, a few merges, and added tokens
// that fuzzed configs may name as bos/eos ("<s>", "</s>", "<|im_start|>", "<|im_end|>").
std::string tiny_tokenizer_json() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  int32_t id = 0;
  for (char32_t cp : xds::byte_level::byte_to_char()) {
    std::string utf8;  // UTF-8 of the symbol: every one is below U+0800
    if (cp < 0x80) {
      utf8 += static_cast<char>(cp);
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[utf8] = id++;
  }
  const char* merges[][2] = {{"H", "e"}, {"l", "l"}, {"He", "ll"}, {"\xC4\xA0", "w"}};
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& m : merges) {
    vocab[std::string(m[0]) + m[1]] = id++;
    merge_list.push_back(std::string(m[0]) + " " + m[1]);
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const char* t : {"<s>", "</s>", "<|im_start|>", "<|im_end|>"}) {
    added.push_back({{"id", id++}, {"content", t}, {"special", true}, {"normalized", false}});
  }
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
  return j.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string kTokenizerJson = tiny_tokenizer_json();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto tok = xds::Tokenizer::from_json_text(kTokenizerJson, text, "tokenizer.json");
  if (tok.ok()) {
    // A config may ask for clean_up_tokenization_spaces, which a stream cannot apply.
    const auto cfg = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const bool clean_up = cfg.is_object() && cfg.contains("clean_up_tokenization_spaces") &&
                          cfg["clean_up_tokenization_spaces"] == true;
    xds::fuzz::check_tokenizer(tok.value(), /*stream_equals_decode=*/!clean_up);
  } else {
    XDS_CHECK(!tok.status().message().empty(), "an error without a message");
  }

  auto tmpl = xds::ChatTemplate::from_tokenizer_config_text(text, "tokenizer_config.json");
  if (!tmpl.ok()) return 0;
  xds::fuzz::check_template(tmpl.value());
  if (tok.ok()) {
    (void)xds::encode_chat_ordered(tok.value(),
                                   tmpl.value().with_limits(xds::fuzz::fuzz_render_limits()),
                                   xds::fuzz::fixed_messages(),
                                   /*add_generation_prompt=*/true, xds::fuzz::fixed_tools());
  }
  return 0;
}
