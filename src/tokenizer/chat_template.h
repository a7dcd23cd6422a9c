// Chat templates: the Jinja template string in tokenizer_config.json ("chat_template", or the
// "default" entry of a named list, or chat_template.jinja beside it), rendered with the
// variables transformers passes: messages, tools, add_generation_prompt, bos_token, eos_token,
// unk_token, pad_token (and any extra context). Jinja subset: see jinja_ast.h / jinja_eval.h.
//
// Trust: every string in `messages` and `tools` (content, names, tool descriptions, call
// arguments, dict keys) is untrusted; the template's own text and its context (bos_token, the
// `extra` variables) are trusted. render_prompt() returns which bytes are which, through every
// string operation of the template (jinja_value.h), and encode_chat*() matches special tokens
// only in the trusted bytes (docs/design/tokenizer.md, "Untrusted text"). A caller that puts
// request values into `extra` must not: they would be trusted.
//
// Thread-safety: immutable after construction; render() may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/jinja_eval.h"
#include "tokenizer/prompt_text.h"
#include "tokenizer/tokenizer.h"

namespace xds {

namespace jinja {
struct Stmt;
}

class ChatTemplate {
 public:
  static Result<ChatTemplate> from_tokenizer_config(const std::string& model_dir);
  static Result<ChatTemplate> from_file(const std::string& path);
  // What `--chat-template FILE` means: `override_file` when non-empty (with the model's special
  // tokens as context), otherwise the model's own template.
  static Result<ChatTemplate> load(const std::string& model_dir, const std::string& override_file);
  // The template of a tokenizer_config.json's text, with its special tokens as context (pure:
  // from_tokenizer_config() without the files). `path` names it in errors. NotFound when the
  // config has no "chat_template".
  static Result<ChatTemplate> from_tokenizer_config_text(std::string_view text,
                                                         const std::string& path);
  // `name` names the source in errors.
  static Result<ChatTemplate> from_string(const std::string& source, const std::string& name);

  // A copy whose render context also holds these variables (e.g. bos_token for a template
  // loaded with from_file). Keys already present are replaced.
  ChatTemplate with_context(const nlohmann::ordered_json& extra) const;
  // A copy that renders within these bounds (jinja_eval.h; the defaults otherwise): a render
  // beyond one fails with an error naming it.
  ChatTemplate with_limits(const jinja::RenderLimits& limits) const;
  // The special-token variables (bos_token, eos_token, unk_token, pad_token) of a model's
  // tokenizer_config.json; an empty object when the file is absent.
  static Result<nlohmann::ordered_json> special_tokens_context(const std::string& model_dir);

  // messages: [{"role":..,"content":..,"tool_calls":..}, ...] (OpenAI shape), tools may be null.
  // nlohmann::json sorts object keys; tools | tojson then prints them sorted. Use
  // render_ordered() to keep the caller's key order, as Python does.
  Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                             const nlohmann::json& tools = nullptr) const;
  Result<std::string> render_ordered(const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& tools = nullptr,
                                     const nlohmann::ordered_json& extra = nullptr) const;

  // render_ordered() with provenance: the bytes that came from `messages` and `tools` are
  // untrusted.
  Result<PromptText> render_prompt(const nlohmann::ordered_json& messages,
                                   bool add_generation_prompt,
                                   const nlohmann::ordered_json& tools = nullptr,
                                   const nlohmann::ordered_json& extra = nullptr) const;

  const std::string& source() const { return *source_; }

 private:
  std::string name_;
  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const std::vector<std::shared_ptr<const jinja::Stmt>>> body_;
  nlohmann::ordered_json context_ = nlohmann::ordered_json::object();
  jinja::RenderLimits limits_;
};

// Whether the text of messages and tools may hold special tokens: kUntrusted (the server's
// default) encodes it as ordinary text; kTrusted (serve --trust-request-special-tokens, for
// callers who build their prompts themselves) matches special tokens everywhere, as
// transformers' apply_chat_template does.
enum class MessageTrust { kUntrusted, kTrusted };

// Chat prompt -> ids: render, encode without the post-processor (special tokens matched only in
// the trusted bytes), then prepend BOS only when the tokenizer is configured to add one
// (add_bos_token) and the prompt does not already start with it — a template that emits
// {{ bos_token }} is not given a second one.
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                         const nlohmann::json& messages, bool add_generation_prompt,
                                         MessageTrust trust = MessageTrust::kUntrusted);
Result<std::vector<int32_t>> encode_chat_ordered(const Tokenizer& tok, const ChatTemplate& tmpl,
                                                 const nlohmann::ordered_json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& tools = nullptr,
                                                 MessageTrust trust = MessageTrust::kUntrusted);
// The last two steps for a prompt already rendered.
Result<std::vector<int32_t>> encode_chat_prompt(const Tokenizer& tok, const PromptText& prompt);

}  // namespace xds
