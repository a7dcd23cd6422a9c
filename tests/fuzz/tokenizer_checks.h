// What the tokenizer and chat-template fuzz targets do with a tokenizer or a template that
// loaded: a few fixed texts and one fixed small conversation through it, checked against what
// tokenizer.h, prompt_text.h and chat_template.h promise. Shared by fuzz_tokenizer_json.cc,
// fuzz_tokenizer_config.cc and fuzz_chat_template.cc.
#pragma once

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace xds::fuzz {

// Encodes fixed texts (ASCII, Unicode, special-token look-alikes, whitespace runs) with and
// without special tokens and checks: every id is below vocab_size(); BOS first when adds_bos();
// decode() runs; the incremental detokenizer's pieces and flush() add up to decode() (when
// `stream_equals_decode`: no clean_up_tokenization_spaces).
void check_tokenizer(const Tokenizer& tok, bool stream_equals_decode);

// A small conversation in the OpenAI shape (system, user, assistant with a tool call, tool,
// user) and one tool, as the gateway passes them to a template.
const nlohmann::ordered_json& fixed_messages();
const nlohmann::ordered_json& fixed_tools();

// Smaller render bounds than the defaults (jinja_eval.h), so that a template that loops until
// it hits one costs the fuzzer a fraction of a second, not many.
jinja::RenderLimits fuzz_render_limits();

// Renders the conversation (with and without the generation prompt) within
// fuzz_render_limits(); a rendered prompt's untrusted ranges must be in the form
// prompt_text.h states (sorted, non-empty, disjoint, not adjacent, inside the text). An error
// must be a Status, never an exception.
void check_template(const ChatTemplate& tmpl);

}  // namespace xds::fuzz
