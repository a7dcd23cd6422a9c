#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/json_depth.h"
#include "base/read_file.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_field.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace xds {


namespace tokenizer_detail {

Result<nlohmann::json> parse_json(std::string_view text, const std::string& name) {
  if (json_nesting_exceeds(text, kMaxJsonDepth)) {
    return invalid_argument("{}: JSON nested deeper than {} levels", name, kMaxJsonDepth);
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument("{}: invalid JSON: {}", name, e.what());
  }
}

std::string config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

Result<bool> apply_config_bos_eos(const nlohmann::json& cfg, const std::string& cfg_name,
                                  Tokenizer::Impl* impl) {
  const bool cfg_bos = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean();
  const bool cfg_eos = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean();
  if (cfg_bos && cfg["add_bos_token"].get<bool>()) {
    if (!impl->bos_id) {
      return invalid_argument("{}: field 'add_bos_token' is true but bos_token \"{}\" is not a "
                              "token", cfg_name, impl->bos_token);
    }
    impl->prefix.push_back(*impl->bos_id);
  }
  if (cfg_eos && cfg["add_eos_token"].get<bool>()) {
    if (!impl->eos_id) {
      return invalid_argument("{}: field 'add_eos_token' is true but eos_token \"{}\" is not a "
                              "token", cfg_name, impl->eos_token);
    }
    impl->suffix.push_back(*impl->eos_id);
  }
  return cfg_bos || cfg_eos;
}

}  // namespace tokenizer_detail

namespace {

using json_field::field_or;
using tokenizer_detail::config_token;
using tokenizer_detail::parse_json;

// The id space is dense (tables indexed by id): ids may leave gaps, but not more unused ids
// than listed tokens (plus this slack), so that a small file cannot ask for gigabytes.
constexpr int64_t kIdGapSlack = 1024;

Status parse_added_tokens(const nlohmann::json& j, const std::string& name,
                          std::vector<AddedToken>* out) {
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return {};
  if (!j["added_tokens"].is_array()) {
    return invalid_argument("{}: field 'added_tokens': expected an array", name);
  }
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
    const auto& t = j["added_tokens"][i];
    // An id beyond int32 would wrap around when stored (a negative index).
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX ||
        !t.contains("content") || !t["content"].is_string()) {
      return invalid_argument(
          "{}: field 'added_tokens[{}]': expected {{\"id\": int in [0, 2^31), "
          "\"content\": string, ...}}, got {}",
          name, i, t.dump());
    }
    AddedToken a;
    a.id = static_cast<int32_t>(t["id"].get<int64_t>());
    a.content = t["content"].get<std::string>();
    const std::string where = fmt::format("added_tokens[{}]", i);
    XDS_ASSIGN_OR_RETURN(a.special, field_or(t, "special", false, name, where));
    XDS_ASSIGN_OR_RETURN(a.lstrip, field_or(t, "lstrip", false, name, where));
    XDS_ASSIGN_OR_RETURN(a.rstrip, field_or(t, "rstrip", false, name, where));
    XDS_ASSIGN_OR_RETURN(a.single_word, field_or(t, "single_word", false, name, where));
    XDS_ASSIGN_OR_RETURN(a.normalized, field_or(t, "normalized", !a.special, name, where));
    out->push_back(std::move(a));
  }
  return {};
}

// Decoder: sets how each vocabulary token turns into bytes.
struct DecoderSpec {
  bool byte_level = false;
  std::vector<std::pair<std::string, std::string>> replaces;
  int strip_leading = 0;
  char strip_char = ' ';
};

Status parse_decoder(const nlohmann::json& d, const std::string& name, const std::string& field,
                     DecoderSpec* spec) {
  if (d.is_null()) return unimplemented("{}: field '{}': a missing decoder is not supported", name, field);
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string()) {
    return invalid_argument("{}: field '{}': expected an object with a string 'type'", name, field);
  }
  const std::string type = d["type"].get<std::string>();
  if (type == "ByteLevel") {
    spec->byte_level = true;
  } else if (type == "Sequence") {
    if (!d.contains("decoders") || !d["decoders"].is_array()) {
      return invalid_argument("{}: field '{}.decoders': missing or not an array", name, field);
    }
    for (size_t i = 0; i < d["decoders"].size(); ++i) {
      XDS_RETURN_IF_ERROR(parse_decoder(d["decoders"][i], name,
                                        fmt::format("{}.decoders[{}]", field, i), spec));
    }
  } else if (type == "ByteFallback" || type == "Fuse") {
    // <0xXX> tokens already decode to their byte; fusing is what concatenation does.
  } else if (type == "Replace") {
    const auto p = d.find("pattern");
    if (p == d.end() || !p->is_object() || !p->contains("String") || !(*p)["String"].is_string()) {
      return unimplemented("{}: field '{}.pattern': only String patterns are supported", name, field);
    }
    XDS_ASSIGN_OR_RETURN(std::string content, field_or(d, "content", std::string(), name, field));
    spec->replaces.emplace_back((*p)["String"].get<std::string>(), std::move(content));
  } else if (type == "Strip") {
    XDS_ASSIGN_OR_RETURN(const std::string content,
                         field_or(d, "content", std::string(" "), name, field));
    XDS_ASSIGN_OR_RETURN(const int64_t stop, field_or(d, "stop", int64_t{0}, name, field));
    XDS_ASSIGN_OR_RETURN(const int64_t start, field_or(d, "start", int64_t{0}, name, field));
    if (content.size() != 1 || stop != 0) {
      return unimplemented("{}: field '{}': only Strip with a 1-byte content and stop 0 is "
                           "supported", name, field);
    }
    if (start < 0 || start > INT32_MAX) {
      return invalid_argument("{}: field '{}.start': expected a count >= 0, got {}", name, field,
                              start);
    }
    spec->strip_char = content[0];
    spec->strip_leading = static_cast<int>(start);
  } else if (type == "Metaspace") {
    XDS_ASSIGN_OR_RETURN(std::string replacement,
                         field_or(d, "replacement", std::string("\xE2\x96\x81"), name, field));
    XDS_ASSIGN_OR_RETURN(const bool add_prefix_space,
                         field_or(d, "add_prefix_space", true, name, field));
    XDS_ASSIGN_OR_RETURN(const std::string scheme,
                         field_or(d, "prepend_scheme", std::string("always"), name, field));
    spec->replaces.emplace_back(std::move(replacement), " ");
    const bool prefix = add_prefix_space && scheme != "never";
    spec->strip_leading = prefix ? 1 : 0;
    spec->strip_char = ' ';
  } else {
    return unimplemented("{}: field '{}.type': decoder \"{}\" is not supported", name, field, type);
  }
  return {};
}

// A token id in a file: an integer in [0, 2^31).
Result<int32_t> id_value(const nlohmann::json& v, const std::string& name,
                         const std::string& field) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX ||
      (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX)) {
    return invalid_argument("{}: field '{}': expected a token id (an integer in [0, 2^31)), got {}",
                            name, field, v.dump());
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// Post-processor ids around the sequence, from tokenizer.json's post_processor. The ids are
// checked against the vocabulary by the caller.
Status parse_post_processor(const nlohmann::json& p, const Tokenizer::Impl& t,
                            const std::string& name, const std::string& field,
                            std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (p.is_null()) return {};
  if (!p.is_object()) return invalid_argument("{}: field '{}': expected an object", name, field);
  XDS_ASSIGN_OR_RETURN(const std::string type, field_or(p, "type", std::string(), name, field));
  auto lookup = [&](const std::string& tok) -> Result<int32_t> {
    for (const auto& a : t.added) {
      if (a.content == tok) return a.id;
    }
    if (auto id = t.model.id_of_text(tok)) return *id;
    return invalid_argument("{}: field '{}': token \"{}\" is not in the vocabulary", name, field, tok);
  };
  // A list field of the processor (absent or null: empty).
  auto list = [&](const char* key) -> Result<const nlohmann::json*> {
    static const nlohmann::json kEmpty = nlohmann::json::array();
    const auto it = p.find(key);
    if (it == p.end() || it->is_null()) return &kEmpty;
    if (!it->is_array())
      return invalid_argument("{}: field '{}.{}': expected a list", name, field, key);
    return &*it;
  };
  if (type == "ByteLevel") return {};
  if (type == "Sequence") {
    XDS_ASSIGN_OR_RETURN(const nlohmann::json* ps, list("processors"));
    for (size_t i = 0; i < ps->size(); ++i) {
      XDS_RETURN_IF_ERROR(parse_post_processor(
          (*ps)[i], t, name, fmt::format("{}.processors[{}]", field, i), prefix, suffix));
    }
    return {};
  }
  if (type == "TemplateProcessing") {
    XDS_ASSIGN_OR_RETURN(const nlohmann::json* single, list("single"));
    const auto st = p.find("special_tokens");
    bool seen_a = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const nlohmann::json& item = (*single)[i];
      const std::string where = fmt::format("{}.single[{}]", field, i);
      if (item.is_object() && item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken") ||
          !item["SpecialToken"].is_object()) {
        return invalid_argument("{}: field '{}': unexpected item {}", name, where, item.dump());
      }
      XDS_ASSIGN_OR_RETURN(
          const std::string tok,
          field_or(item["SpecialToken"], "id", std::string(), name, where + ".SpecialToken"));
      std::vector<int32_t> ids;
      if (st != p.end() && st->is_object() && st->contains(tok) && (*st)[tok].is_object() &&
          (*st)[tok].contains("ids")) {
        const nlohmann::json& list_ids = (*st)[tok]["ids"];
        const std::string ids_field = fmt::format("{}.special_tokens[\"{}\"].ids", field, tok);
        if (!list_ids.is_array()) {
          return invalid_argument("{}: field '{}': expected a list of ids", name, ids_field);
        }
        for (size_t k = 0; k < list_ids.size(); ++k) {
          XDS_ASSIGN_OR_RETURN(int32_t id,
                               id_value(list_ids[k], name, fmt::format("{}[{}]", ids_field, k)));
          ids.push_back(id);
        }
      } else {
        XDS_ASSIGN_OR_RETURN(int32_t id, lookup(tok));
        ids.push_back(id);
      }
      auto* dst = seen_a ? suffix : prefix;
      dst->insert(dst->end(), ids.begin(), ids.end());
    }
    return {};
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    // "cls": ["<s>", 0], "sep": ["</s>", 2]
    for (const char* key : {"cls", "sep"}) {
      const auto it = p.find(key);
      if (it == p.end() || !it->is_array() || it->size() != 2) {
        return invalid_argument("{}: field '{}.{}': expected [token, id]", name, field, key);
      }
      XDS_ASSIGN_OR_RETURN(int32_t id,
                           id_value((*it)[1], name, fmt::format("{}.{}[1]", field, key)));
      (std::string_view(key) == "cls" ? prefix : suffix)->push_back(id);
    }
    return {};
  }
  return unimplemented("{}: field '{}.type': post-processor \"{}\" is not supported", name, field, type);
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json_text(std::string_view tokenizer_json,
                                            std::string_view config_json, const std::string& name) {
  XDS_ASSIGN_OR_RETURN(TokenizerJson parsed, parse_tokenizer_json(tokenizer_json, name));
  const nlohmann::json& j = parsed.root;
  const std::string cfg_name = "tokenizer_config.json";
  nlohmann::json cfg = nlohmann::json::object();
  if (!config_json.empty()) {
    XDS_ASSIGN_OR_RETURN(cfg, parse_json(config_json, cfg_name));
    if (!cfg.is_object()) return invalid_argument("{}: expected a JSON object", cfg_name);
  }
  if (!j.is_object()) return invalid_argument("{}: expected a JSON object", name);
  if (!j.contains("model") || !j["model"].is_object()) {
    return invalid_argument("{}: field 'model': missing or not an object", name);
  }
  const auto& m = j["model"];
  const std::string mtype = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>()
                            : parsed.has_merges                         ? "BPE"
                                                                        : "";
  if (mtype != "BPE") {
    return unimplemented("{}: field 'model.type': model type \"{}\" is not supported (only BPE)",
                         name, mtype);
  }
  if (!parsed.has_vocab) return invalid_argument("{}: field 'model.vocab': missing or not an object", name);
  if (!parsed.has_merges) return invalid_argument("{}: field 'model.merges': missing or not an array", name);
  auto impl = std::make_shared<Impl>();
  {
    auto r = Normalizer::from_json(j.value("normalizer", nlohmann::json()), name, "normalizer");
    if (!r.ok()) return r.status();
    impl->normalizer = std::move(r).value();
  }
  {
    auto r = PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()), name, "pre_tokenizer");
    if (!r.ok()) return r.status();
    impl->pre_tokenizer = std::move(r).value();
  }
  {
    auto r = BpeModel::from_parts(m, parsed.vocab, parsed.merges, impl->pre_tokenizer.byte_level(), name);
    if (!r.ok()) return r.status();
    impl->model = std::move(r).value();
  }
  XDS_RETURN_IF_ERROR(parse_added_tokens(j, name, &impl->added));
  std::vector<AddedToken> raw, norm;
  for (const auto& a : impl->added) (a.normalized && !impl->normalizer.is_identity() ? norm : raw).push_back(a);
  impl->raw_matcher = AddedTokenMatcher(raw);
  impl->norm_matcher = AddedTokenMatcher(norm);

  // Decoded bytes of every id.
  DecoderSpec dec;
  XDS_RETURN_IF_ERROR(parse_decoder(j.value("decoder", nlohmann::json()), name, "decoder", &dec));
  impl->strip_leading = dec.strip_leading;
  impl->strip_char = dec.strip_char;
  impl->vocab_size = impl->model.size();
  for (const auto& a : impl->added)
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, int64_t{a.id} + 1);
  const int64_t listed = static_cast<int64_t>(parsed.vocab.size() + impl->added.size());
  if (impl->vocab_size > 2 * listed + kIdGapSlack) {
    return invalid_argument(
        "{}: field 'added_tokens': ids reach {} but only {} tokens are listed "
        "(ids may leave gaps, but not more than the listed tokens plus {})",
        name, impl->vocab_size - 1, listed, kIdGapSlack);
  }
  impl->pieces.resize(impl->vocab_size);
  impl->special.assign(impl->vocab_size, 0);
  for (int32_t id = 0; id < impl->model.size(); ++id) {
    const std::string& text = impl->model.token_text(id);
    std::string piece;
    if (dec.byte_level) {
      auto raw_bytes = byte_level::decode_token(text);
      piece = raw_bytes ? *raw_bytes : text;
    } else {
      piece = impl->model.token_bytes(id);
      for (const auto& [from, to] : dec.replaces) {
        std::string outp;
        size_t last = 0, p;
        while (!from.empty() && (p = piece.find(from, last)) != std::string::npos) {
          outp.append(piece, last, p - last);
          outp += to;
          last = p + from.size();
        }
        outp.append(piece, last);
        piece = std::move(outp);
      }
    }
    impl->pieces[id] = std::move(piece);
  }
  for (const auto& a : impl->added) {
    impl->pieces[a.id] = a.content;  // added tokens decode verbatim
    if (a.special) impl->special[a.id] = 1;
  }

  // Special tokens and post-processing.
  impl->bos_token = config_token(cfg, "bos_token");
  impl->eos_token = config_token(cfg, "eos_token");
  Tokenizer tok;
  tok.impl_ = impl;
  if (!impl->bos_token.empty()) impl->bos_id = tok.token_to_id(impl->bos_token);
  if (!impl->eos_token.empty()) impl->eos_id = tok.token_to_id(impl->eos_token);
  XDS_ASSIGN_OR_RETURN(impl->clean_up_spaces,
                       field_or(cfg, "clean_up_tokenization_spaces", false, cfg_name, ""));
  XDS_ASSIGN_OR_RETURN(const bool cfg_bos_eos,
                       tokenizer_detail::apply_config_bos_eos(cfg, cfg_name, impl.get()));
  if (!cfg_bos_eos) {
    XDS_RETURN_IF_ERROR(parse_post_processor(j.value("post_processor", nlohmann::json()), *impl,
                                             name, "post_processor", &impl->prefix, &impl->suffix));
    // Ids the file wrote down (special_tokens, cls/sep) must be ids encode may return.
    for (const auto* ids : {&impl->prefix, &impl->suffix}) {
      for (const int32_t id : *ids) {
        if (id >= impl->vocab_size) {
          return invalid_argument(
              "{}: field 'post_processor': id {} is not in the vocabulary "
              "(ids below {})",
              name, id, impl->vocab_size);
        }
      }
    }
  }
  return tok;
}

Result<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::string tj_path = (dir / "tokenizer.json").string();
  const std::string tt_path = (dir / "tiktoken.model").string();
  const std::string cfg_path = (dir / "tokenizer_config.json").string();
  std::string cfg;
  if (std::filesystem::exists(cfg_path)) {
    XDS_ASSIGN_OR_RETURN(cfg, read_whole_file(cfg_path));
  }
  // tokenizer.json wins when both are present (it is what transformers' fast tokenizers read).
  if (!std::filesystem::is_regular_file(tj_path) && std::filesystem::is_regular_file(tt_path)) {
    XDS_ASSIGN_OR_RETURN(std::string tt, read_whole_file(tt_path));
    return from_tiktoken_text(tt, cfg, tt_path);
  }
  XDS_ASSIGN_OR_RETURN(std::string tj, read_whole_file(tj_path));
  auto r = from_json_text(tj, cfg, tj_path);
  if (!r.ok()) return r.status();
  return r;
}

bool Tokenizer::has_tokenizer_files(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  return std::filesystem::is_regular_file(dir / "tokenizer.json") ||
         std::filesystem::is_regular_file(dir / "tiktoken.model");
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode_impl(text, {}, add_special_tokens);
}

Result<std::vector<int32_t>> Tokenizer::encode(const PromptText& text,
                                               bool add_special_tokens) const {
  return encode_impl(text.text, text.untrusted, add_special_tokens);
}

Result<std::vector<int32_t>> Tokenizer::encode_impl(std::string_view text,
                                                    const TaintRanges& untrusted,
                                                    bool add_special_tokens) const {
  const Impl& t = *impl_;
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos) {
    return invalid_argument("encode: input is not valid UTF-8 at byte offset {} (0x{:02x})", bad,
                            static_cast<uint8_t>(text[bad]));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = t.prefix;
  std::vector<std::string> words;
  RegexScratch scratch;
  // Per-call cache of short words (they repeat in ordinary text): word -> [offset, length) in
  // cached_ids. Local to this call, so concurrent encodes share nothing mutable.
  constexpr size_t kCacheWordMax = 15, kCacheEntriesMax = 1 << 16;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cached_ids;
  auto encode_text = [&](std::string_view s) -> Status {
    words.clear();
    XDS_RETURN_IF_ERROR(t.pre_tokenizer.apply(s, &scratch, &words));
    for (const auto& w : words) {
      const bool cacheable = w.size() <= kCacheWordMax;
      if (cacheable) {
        if (auto it = cache.find(std::string_view(w)); it != cache.end()) {
          ids.insert(ids.end(), cached_ids.begin() + it->second.first,
                     cached_ids.begin() + it->second.first + it->second.second);
          continue;
        }
      }
      const size_t before = ids.size();
      if (t.tiktoken) {
        t.tiktoken->encode_word(w, &ids);
      } else {
        t.model.encode_word(w, &ids);
      }
      if (cacheable && cache.size() < kCacheEntriesMax) {
        cache.emplace(w, std::make_pair(static_cast<uint32_t>(cached_ids.size()),
                                        static_cast<uint32_t>(ids.size() - before)));
        cached_ids.insert(cached_ids.end(), ids.begin() + before, ids.end());
      }
    }
    return {};
  };
  for (const AddedSegment& seg : t.raw_matcher.split(text, untrusted)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized;
    if (!t.normalizer.is_identity()) {
      XDS_ASSIGN_OR_RETURN(normalized, t.normalizer.apply(piece));
      piece = normalized;
    }
    // The normalizer moves bytes, so a piece with untrusted bytes in it matches no normalized
    // token at all (safe: never a token from untrusted text; rare: such tokenizers are few).
    if (t.norm_matcher.empty() || taint::overlaps(untrusted, seg.begin, seg.end)) {
      XDS_RETURN_IF_ERROR(encode_text(piece));
      continue;
    }
    for (const AddedSegment& s2 : t.norm_matcher.split(piece)) {
      if (s2.id >= 0) {
        ids.push_back(s2.id);
      } else {
        XDS_RETURN_IF_ERROR(encode_text(piece.substr(s2.begin, s2.end - s2.begin)));
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

namespace {
// transformers' clean_up_tokenization.
std::string clean_up_spaces(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    const std::string_view f(from);
    size_t last = 0, p;
    while ((p = s.find(f, last)) != std::string::npos) {
      out.append(s, last, p - last);
      out += to;
      last = p + f.size();
    }
    out.append(s, last);
    s = std::move(out);
  }
  return s;
}
}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const int32_t id : ids) bytes.append(token_bytes(id, skip_special_tokens));
  size_t b = 0;
  for (int k = 0; k < impl_->strip_leading && b < bytes.size() && bytes[b] == impl_->strip_char; ++k) ++b;
  std::string out = utf8::replace_invalid(std::string_view(bytes).substr(b));
  return impl_->clean_up_spaces ? clean_up_spaces(std::move(out)) : out;
}

std::string_view Tokenizer::token_bytes(int32_t id, bool skip_special_tokens) const {
  if (id < 0 || id >= impl_->vocab_size) return {};
  if (skip_special_tokens && impl_->special[id]) return {};
  return impl_->pieces[id];
}

int Tokenizer::decode_strip_leading() const { return impl_->strip_leading; }
char Tokenizer::decode_strip_char() const { return impl_->strip_char; }
int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
bool Tokenizer::adds_bos() const {
  return impl_->bos_id && !impl_->prefix.empty() && impl_->prefix.front() == *impl_->bos_id;
}
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return std::nullopt;
  for (const auto& a : impl_->added) {
    if (a.id == id) return a.content;
  }
  if (impl_->tiktoken) {
    // As tokenization_kimi.py names its tokens: the bytes in the GPT-2 byte alphabet.
    if (id < impl_->tiktoken->size()) return byte_level::encode_bytes(impl_->tiktoken->token_bytes(id));
    return std::nullopt;
  }
  if (id < impl_->model.size()) return impl_->model.token_text(id);
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : impl_->added) {
    if (a.content == token) return a.id;
  }
  if (impl_->tiktoken) {
    const auto bytes = byte_level::decode_token(token);
    return bytes ? impl_->tiktoken->id_of_bytes(*bytes) : std::nullopt;
  }
  return impl_->model.id_of_text(token);
}

// ---- IncrementalDetokenizer ----

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens), strip_left_(tok.decode_strip_leading()) {}

std::string IncrementalDetokenizer::take(bool final) {
  while (strip_left_ > 0 && !pending_.empty()) {
    if (pending_[0] != tok_->decode_strip_char()) {
      strip_left_ = 0;
      break;
    }
    pending_.erase(0, 1);
    --strip_left_;
  }
  if (strip_left_ > 0 && !final) return {};  // nothing seen yet
  const size_t keep = final ? 0 : utf8::incomplete_tail(pending_);
  std::string out = utf8::replace_invalid(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  pending_.append(tok_->token_bytes(id, skip_special_));
  return take(false);
}

std::string IncrementalDetokenizer::flush() {
  std::string out = take(true);
  strip_left_ = tok_->decode_strip_leading();
  return out;
}

}  // namespace xds
