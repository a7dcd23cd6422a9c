#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "base/json_depth.h"
#include "base/read_file.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_eval.h"

namespace xds {
namespace {

// tokenizer_config.json's text as a JSON object; `path` names it in errors.
Result<nlohmann::ordered_json> parse_config(std::string_view text, const std::string& path) {
  if (json_nesting_exceeds(text, kMaxJsonDepth)) {
    return invalid_argument("{}: JSON nested deeper than {} levels", path, kMaxJsonDepth);
  }
  try {
    auto j = nlohmann::ordered_json::parse(text);
    if (!j.is_object()) return invalid_argument("{}: expected a JSON object", path);
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument("{}: invalid JSON: {}", path, e.what());
  }
}

Result<nlohmann::ordered_json> read_config(const std::string& path) {
  XDS_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  return parse_config(text, path);
}

// The special-token variables (bos_token, ...) of a parsed tokenizer_config.json.
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& cfg) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!cfg.contains(key)) continue;
    const auto& v = cfg[key];
    if (v.is_string())
      ctx[key] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      ctx[key] = v["content"];
  }
  return ctx;
}

// The template source of a parsed tokenizer_config.json: its "chat_template" string, or the
// "default" entry of a named list; nullopt when the field is absent or null.
Result<std::optional<std::string>> template_source_of(const nlohmann::ordered_json& cfg,
                                                      const std::string& path) {
  using Source = std::optional<std::string>;
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) return Source();
  const auto& ct = cfg["chat_template"];
  if (ct.is_string()) return Source(ct.get<std::string>());
  if (!ct.is_array()) {
    return invalid_argument("{}: field 'chat_template': expected a string or a list, got {}", path,
                            ct.type_name());
  }
  std::string src;
  for (const auto& e : ct) {
    // {"name": "default", "template": "..."}; entries of another shape are skipped.
    if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
        e["template"].is_string()) {
      src = e["template"].get<std::string>();
    }
  }
  if (src.empty()) {
    return invalid_argument("{}: field 'chat_template': a list without a \"default\" entry", path);
  }
  return Source(std::move(src));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_string(const std::string& source, const std::string& name) {
  ChatTemplate t;
  t.name_ = name;
  t.source_ = std::make_shared<const std::string>(source);
  try {
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse(source));
  } catch (const jinja::TemplateError& e) {
    return invalid_argument("chat template ({}): {}", name, e.what());
  }
  return t;
}

Result<ChatTemplate> ChatTemplate::from_file(const std::string& path) {
  XDS_ASSIGN_OR_RETURN(std::string src, read_whole_file(path));
  return from_string(src, path);
}

Result<nlohmann::ordered_json> ChatTemplate::special_tokens_context(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "tokenizer_config.json").string();
  if (!std::filesystem::exists(path)) return nlohmann::ordered_json::object();
  XDS_ASSIGN_OR_RETURN(auto cfg, read_config(path));
  return special_tokens_of(cfg);
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config_text(std::string_view text,
                                                              const std::string& path) {
  XDS_ASSIGN_OR_RETURN(auto cfg, parse_config(text, path));
  XDS_ASSIGN_OR_RETURN(std::optional<std::string> src, template_source_of(cfg, path));
  if (!src) return not_found("{}: field 'chat_template': missing", path);
  XDS_ASSIGN_OR_RETURN(auto t, from_string(*src, path + " chat_template"));
  return t.with_context(special_tokens_of(cfg));
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "tokenizer_config.json").string();
  const std::string jinja_path = (std::filesystem::path(model_dir) / "chat_template.jinja").string();
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (std::filesystem::exists(path)) {
    XDS_ASSIGN_OR_RETURN(auto cfg, read_config(path));
    ctx = special_tokens_of(cfg);
    XDS_ASSIGN_OR_RETURN(std::optional<std::string> src, template_source_of(cfg, path));
    if (src) {
      XDS_ASSIGN_OR_RETURN(auto t, from_string(*src, path + " chat_template"));
      return t.with_context(ctx);
    }
  }
  if (std::filesystem::exists(jinja_path)) {
    XDS_ASSIGN_OR_RETURN(auto t, from_file(jinja_path));
    return t.with_context(ctx);
  }
  return not_found("{}: field 'chat_template': missing (and no chat_template.jinja in {})", path, model_dir);
}

Result<ChatTemplate> ChatTemplate::load(const std::string& model_dir, const std::string& override_file) {
  if (override_file.empty()) return from_tokenizer_config(model_dir);
  XDS_ASSIGN_OR_RETURN(auto t, from_file(override_file));
  XDS_ASSIGN_OR_RETURN(auto ctx, special_tokens_context(model_dir));
  return t.with_context(ctx);
}

ChatTemplate ChatTemplate::with_limits(const jinja::RenderLimits& limits) const {
  ChatTemplate t = *this;
  t.limits_ = limits;
  return t;
}

ChatTemplate ChatTemplate::with_context(const nlohmann::ordered_json& extra) const {
  ChatTemplate t = *this;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) t.context_[it.key()] = it.value();
  }
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                         const nlohmann::json& tools) const {
  return render_ordered(nlohmann::ordered_json::parse(messages.dump()), add_generation_prompt,
                        tools.is_null() ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(tools.dump()));
}

Result<std::string> ChatTemplate::render_ordered(const nlohmann::ordered_json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& tools,
                                                 const nlohmann::ordered_json& extra) const {
  XDS_ASSIGN_OR_RETURN(PromptText p, render_prompt(messages, add_generation_prompt, tools, extra));
  return std::move(p.text);
}

Result<PromptText> ChatTemplate::render_prompt(const nlohmann::ordered_json& messages,
                                               bool add_generation_prompt,
                                               const nlohmann::ordered_json& tools,
                                               const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) {
    return invalid_argument("chat template ({}): messages must be a JSON array, got {}", name_, messages.type_name());
  }
  try {
    // from_json refuses values nested deeper than jinja::kMaxValueDepth.
    jinja::Dict ctx;
    for (auto it = context_.begin(); it != context_.end(); ++it)
      ctx.set(it.key(), jinja::Value::from_json(it.value()));
    if (extra.is_object()) {
      for (auto it = extra.begin(); it != extra.end(); ++it)
        ctx.set(it.key(), jinja::Value::from_json(it.value()));
    }
    ctx.set("messages", jinja::Value::from_json(messages, /*untrusted=*/true));
    ctx.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
    ctx.set("tools", tools.is_null() ? jinja::Value::none()
                                     : jinja::Value::from_json(tools, /*untrusted=*/true));
    jinja::Value out = jinja::render(*body_, ctx, limits_);
    return PromptText{std::move(out.s), std::move(out.taint)};
  } catch (const jinja::TemplateError& e) {
    return invalid_argument("chat template ({}): {}", name_, e.what());
  }
}

Result<std::vector<int32_t>> encode_chat_ordered(const Tokenizer& tok, const ChatTemplate& tmpl,
                                                 const nlohmann::ordered_json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& tools,
                                                 MessageTrust trust) {
  XDS_ASSIGN_OR_RETURN(PromptText prompt,
                       tmpl.render_prompt(messages, add_generation_prompt, tools));
  if (trust == MessageTrust::kTrusted) prompt.untrusted.clear();
  return encode_chat_prompt(tok, prompt);
}

Result<std::vector<int32_t>> encode_chat_prompt(const Tokenizer& tok, const PromptText& prompt) {
  XDS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(prompt, /*add_special_tokens=*/false));
  if (tok.adds_bos() && (ids.empty() || ids.front() != *tok.bos_id())) ids.insert(ids.begin(), *tok.bos_id());
  return ids;
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                         const nlohmann::json& messages, bool add_generation_prompt,
                                         MessageTrust trust) {
  return encode_chat_ordered(tok, tmpl, nlohmann::ordered_json::parse(messages.dump()),
                             add_generation_prompt, nullptr, trust);
}

}  // namespace xds
