// Tokenizer::from_tiktoken_text: Kimi K2's tiktoken.model + tokenizer_config.json, as its
// tokenization_kimi.py builds them (tiktoken_model.h).
#include <charconv>
#include <memory>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace xds {
namespace {

// added_tokens_decoder: {"163584": {"content": "[BOS]", ...}, ...} -> content of each id in
// [first, first + kKimiNumSpecialTokens); other ids are "<|reserved_token_ID|>".
Result<std::vector<std::string>> special_token_names(const nlohmann::json& cfg, int32_t first,
                                                     const std::string& cfg_name) {
  std::vector<std::string> names(kKimiNumSpecialTokens);
  for (int32_t k = 0; k < kKimiNumSpecialTokens; ++k) {
    names[k] = fmt::format("<|reserved_token_{}|>", first + k);
  }
  const auto it = cfg.find("added_tokens_decoder");
  if (it == cfg.end() || it->is_null()) return names;
  if (!it->is_object()) {
    return invalid_argument("{}: field 'added_tokens_decoder': expected an object", cfg_name);
  }
  for (const auto& [key, entry] : it->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size()) {
      return invalid_argument("{}: field 'added_tokens_decoder': key \"{}\" is not an id",
                              cfg_name, key);
    }
    if (id < first || id >= int64_t{first} + kKimiNumSpecialTokens) {
      return invalid_argument(
          "{}: field 'added_tokens_decoder.{}': id {} is outside the special ids [{}, {}) that "
          "follow the {} tokens of tiktoken.model",
          cfg_name, key, id, first, int64_t{first} + kKimiNumSpecialTokens, first);
    }
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
        entry["content"].get<std::string>().empty()) {
      return invalid_argument(
          "{}: field 'added_tokens_decoder.{}': expected {{\"content\": non-empty string, ...}}",
          cfg_name, key);
    }
    names[id - first] = entry["content"].get<std::string>();
  }
  return names;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_tiktoken_text(std::string_view tiktoken_model,
                                                std::string_view config_json,
                                                const std::string& name) {
  const std::string cfg_name = "tokenizer_config.json";
  nlohmann::json cfg = nlohmann::json::object();
  if (!config_json.empty()) {
    XDS_ASSIGN_OR_RETURN(cfg, tokenizer_detail::parse_json(config_json, cfg_name));
    if (!cfg.is_object()) return invalid_argument("{}: expected a JSON object", cfg_name);
  }
  auto impl = std::make_shared<Impl>();
  XDS_ASSIGN_OR_RETURN(TiktokenModel model, TiktokenModel::parse(tiktoken_model, name));
  impl->tiktoken = std::move(model);
  const TiktokenModel& tt = *impl->tiktoken;
  {
    nlohmann::json split = nlohmann::json::object();
    split["type"] = "Split";
    split["pattern"]["Regex"] = std::string(kKimiSplitPattern);
    split["behavior"] = "Isolated";
    split["invert"] = false;
    XDS_ASSIGN_OR_RETURN(impl->pre_tokenizer,
                         PreTokenizer::from_json(split, name, "(Kimi K2 split pattern)"));
  }

  // Special tokens: matched in trusted text wherever they occur (tiktoken's
  // allowed_special="all"), decoded verbatim, skipped with skip_special_tokens.
  const int32_t first_special = tt.size();
  XDS_ASSIGN_OR_RETURN(std::vector<std::string> names,
                       special_token_names(cfg, first_special, cfg_name));
  std::unordered_set<std::string> seen;
  for (int32_t k = 0; k < kKimiNumSpecialTokens; ++k) {
    if (!seen.insert(names[k]).second) {
      return invalid_argument("{}: special token \"{}\" names two ids (the second is {})",
                              cfg_name, names[k], first_special + k);
    }
    AddedToken a;
    a.id = first_special + k;
    a.content = std::move(names[k]);
    a.special = true;
    a.normalized = false;
    impl->added.push_back(std::move(a));
  }
  impl->raw_matcher = AddedTokenMatcher(impl->added);

  impl->vocab_size = int64_t{first_special} + kKimiNumSpecialTokens;
  impl->pieces.resize(impl->vocab_size);
  impl->special.assign(impl->vocab_size, 0);
  for (int32_t id = 0; id < first_special; ++id) impl->pieces[id] = tt.token_bytes(id);
  for (const AddedToken& a : impl->added) {
    impl->pieces[a.id] = a.content;
    impl->special[a.id] = 1;
  }

  impl->bos_token = tokenizer_detail::config_token(cfg, "bos_token");
  impl->eos_token = tokenizer_detail::config_token(cfg, "eos_token");
  Tokenizer tok;
  tok.impl_ = impl;
  if (!impl->bos_token.empty()) impl->bos_id = tok.token_to_id(impl->bos_token);
  if (!impl->eos_token.empty()) impl->eos_id = tok.token_to_id(impl->eos_token);
  // tokenization_kimi.py never cleans up spaces (its clean_up_tokenization is the identity),
  // and adds BOS / EOS only where the config asks for it.
  XDS_ASSIGN_OR_RETURN(const bool cfg_bos_eos,
                       tokenizer_detail::apply_config_bos_eos(cfg, cfg_name, impl.get()));
  (void)cfg_bos_eos;
  return tok;
}

}  // namespace xds
