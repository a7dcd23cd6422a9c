#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <tuple>

#include "tokenizer/json_field.h"

namespace xds {
namespace {
// The GPT-2 pattern ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Result<SplitBehavior> parse_behavior(const std::string& b, const std::string& file,
                                     const std::string& field) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument("{}: field '{}.behavior': unknown split behavior \"{}\"", file, field, b);
}
}  // namespace

std::vector<std::pair<size_t, size_t>> apply_split_behavior(
    const std::vector<std::tuple<size_t, size_t, bool>>& pieces, SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (auto [b, e, m] : pieces) {
        if (!m) out.emplace_back(b, e);
      }
      break;
    case SplitBehavior::kIsolated:
      for (auto [b, e, m] : pieces) out.emplace_back(b, e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (auto [b, e, m] : pieces) {
        if (m && !prev_match && !out.empty()) {
          out.back().second = e;
        } else {
          out.emplace_back(b, e);
        }
        prev_match = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;  // walking right to left: "previous" is the piece to the right
      for (size_t i = pieces.size(); i-- > 0;) {
        auto [b, e, m] = pieces[i];
        if (m && !prev_match && !out.empty()) {
          out.back().first = b;
        } else {
          out.emplace_back(b, e);
        }
        prev_match = m;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (size_t i = 0; i < pieces.size(); ++i) {
        auto [b, e, m] = pieces[i];
        if (i > 0 && m == prev_match) {
          out.back().second = e;
        } else {
          out.emplace_back(b, e);
        }
        prev_match = m;
      }
      break;
    }
  }
  std::erase_if(out, [](const auto& r) { return r.first == r.second; });
  return out;
}

Status PreTokenizer::add_steps(const nlohmann::json& j, const std::string& file,
                               const std::string& field, PreTokenizer* pt) {
  if (j.is_null()) return {};
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument("{}: field '{}': expected an object with a string 'type'", file, field);
  }
  const std::string type = j["type"].get<std::string>();
  auto add_regex = [&](const std::string& pattern, SplitBehavior beh, bool invert) -> Status {
    auto r = Regex::compile(pattern);
    if (!r.ok()) return r.status().with_context(fmt::format("{}: field '{}'", file, field));
    Step st{Kind::kSplit, std::make_shared<Regex>(std::move(r).value()), "", beh, invert};
    pt->steps_.push_back(std::move(st));
    return {};
  };
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return invalid_argument("{}: field '{}.pretokenizers': missing or not an array", file, field);
    }
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i) {
      XDS_RETURN_IF_ERROR(add_steps(j["pretokenizers"][i], file,
                                    fmt::format("{}.pretokenizers[{}]", field, i), pt));
    }
    return {};
  }
  if (type == "Split") {
    XDS_ASSIGN_OR_RETURN(const std::string behavior,
                         json_field::field_or(j, "behavior", std::string("Isolated"), file, field));
    XDS_ASSIGN_OR_RETURN(auto beh, parse_behavior(behavior, file, field));
    XDS_ASSIGN_OR_RETURN(const bool invert, json_field::field_or(j, "invert", false, file, field));
    const auto& p = j.contains("pattern") ? j["pattern"] : nlohmann::json();
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      return add_regex(p["Regex"].get<std::string>(), beh, invert);
    }
    if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      Step st{Kind::kSplit, nullptr, p["String"].get<std::string>(), beh, invert};
      if (st.literal.empty()) {
        return invalid_argument("{}: field '{}.pattern.String': empty pattern", file, field);
      }
      pt->steps_.push_back(std::move(st));
      return {};
    }
    return invalid_argument("{}: field '{}.pattern': expected {{\"Regex\": ..}} or "
                            "{{\"String\": ..}}", file, field);
  }
  if (type == "ByteLevel") {
    pt->byte_level_ = true;
    XDS_ASSIGN_OR_RETURN(const bool prefix,
                         json_field::field_or(j, "add_prefix_space", false, file, field));
    XDS_ASSIGN_OR_RETURN(const bool use_regex,
                         json_field::field_or(j, "use_regex", true, file, field));
    if (prefix)
      pt->steps_.push_back(
          Step{Kind::kByteLevelPrefix, nullptr, "", SplitBehavior::kIsolated, false});
    if (use_regex) return add_regex(kGpt2Pattern, SplitBehavior::kIsolated, false);
    return {};
  }
  if (type == "Digits") {
    XDS_ASSIGN_OR_RETURN(const bool individual,
                         json_field::field_or(j, "individual_digits", false, file, field));
    return add_regex(individual ? R"(\p{N})" : R"(\p{N}+)", SplitBehavior::kIsolated, false);
  }
  if (type == "Whitespace") return add_regex(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, true);
  if (type == "WhitespaceSplit") return add_regex(R"(\s+)", SplitBehavior::kRemoved, false);
  return unimplemented("{}: field '{}.type': pre-tokenizer \"{}\" is not supported", file, field,
                       type);
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j, const std::string& file,
                                             const std::string& field) {
  PreTokenizer pt;
  XDS_RETURN_IF_ERROR(add_steps(j, file, field, &pt));
  return pt;
}

Status PreTokenizer::split_one(const Step& st, std::string_view s, RegexScratch* scratch,
                               std::vector<std::string>* out) const {
  std::vector<std::pair<size_t, size_t>> matches;
  if (st.regex) {
    XDS_RETURN_IF_ERROR(st.regex->find_all(s, scratch, &matches));
  } else {
    size_t p = 0;
    while ((p = s.find(st.literal, p)) != std::string_view::npos) {
      matches.emplace_back(p, p + st.literal.size());
      p += st.literal.size();
    }
  }
  std::vector<std::tuple<size_t, size_t, bool>> pieces;
  pieces.reserve(matches.size() * 2 + 1);
  size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) pieces.emplace_back(last, b, st.invert);
    pieces.emplace_back(b, e, !st.invert);
    last = e;
  }
  if (last < s.size()) pieces.emplace_back(last, s.size(), st.invert);
  for (auto [b, e] : apply_split_behavior(pieces, st.behavior)) out->emplace_back(s.substr(b, e - b));
  return {};
}

Status PreTokenizer::apply(std::string_view text, std::vector<std::string>* words) const {
  RegexScratch scratch;
  return apply(text, &scratch, words);
}

Status PreTokenizer::apply(std::string_view text, RegexScratch* scratch,
                           std::vector<std::string>* words) const {
  std::vector<std::string> cur, next;
  cur.emplace_back(text);
  for (const Step& st : steps_) {
    next.clear();
    for (const std::string& w : cur) {
      if (st.kind == Kind::kByteLevelPrefix) {
        next.push_back(!w.empty() && w[0] == ' ' ? w : " " + w);
      } else {
        XDS_RETURN_IF_ERROR(split_one(st, w, scratch, &next));
      }
    }
    std::swap(cur, next);
  }
  for (auto& w : cur) {
    if (!w.empty()) words->push_back(std::move(w));
  }
  return {};
}

}  // namespace xds
