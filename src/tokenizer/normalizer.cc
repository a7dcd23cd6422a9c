#include "tokenizer/normalizer.h"

#include <cstdlib>

#include <utf8proc.h>

#include "tokenizer/json_field.h"
#include "tokenizer/utf8.h"

namespace xds {
namespace {

bool is_ascii(std::string_view s) {
  for (const char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}

Result<std::string> unicode_map(std::string_view s, int options) {
  if (is_ascii(s)) return std::string(s);  // every normalization form is the identity on ASCII
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) return invalid_argument("unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace

Status Normalizer::add_steps(const nlohmann::json& j, const std::string& file,
                             const std::string& field, std::vector<Step>* steps) {
  if (j.is_null()) return {};
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument("{}: field '{}': expected an object with a string 'type'", file, field);
  }
  const std::string type = j["type"].get<std::string>();
  Step st{};
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return invalid_argument("{}: field '{}.normalizers': missing or not an array", file, field);
    }
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      XDS_RETURN_IF_ERROR(add_steps(j["normalizers"][i], file,
                                    fmt::format("{}.normalizers[{}]", field, i), steps));
    }
    return {};
  } else if (type == "NFC") {
    st.kind = Kind::kNfc;
  } else if (type == "NFD") {
    st.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    st.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    st.kind = Kind::kNfkd;
  } else if (type == "Lowercase") {
    st.kind = Kind::kLowercase;
  } else if (type == "Prepend") {
    st.kind = Kind::kPrepend;
    XDS_ASSIGN_OR_RETURN(st.content,
                         json_field::field_or(j, "prepend", std::string(), file, field));
  } else if (type == "Strip") {
    st.kind = Kind::kStrip;
    XDS_ASSIGN_OR_RETURN(st.strip_left, json_field::field_or(j, "strip_left", true, file, field));
    XDS_ASSIGN_OR_RETURN(st.strip_right, json_field::field_or(j, "strip_right", true, file, field));
  } else if (type == "Replace") {
    st.kind = Kind::kReplace;
    XDS_ASSIGN_OR_RETURN(st.content,
                         json_field::field_or(j, "content", std::string(), file, field));
    const auto& p = j.contains("pattern") ? j["pattern"] : nlohmann::json();
    if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      st.literal = p["String"].get<std::string>();
      if (st.literal.empty()) {
        return invalid_argument("{}: field '{}.pattern.String': empty pattern", file, field);
      }
    } else if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      auto r = Regex::compile(p["Regex"].get<std::string>());
      if (!r.ok()) return r.status().with_context(fmt::format("{}: field '{}.pattern'", file, field));
      st.regex = std::make_shared<Regex>(std::move(r).value());
    } else {
      return invalid_argument("{}: field '{}.pattern': expected {{\"String\": ..}} or "
                              "{{\"Regex\": ..}}", file, field);
    }
  } else {
    return unimplemented("{}: field '{}.type': normalizer \"{}\" is not supported", file, field, type);
  }
  steps->push_back(std::move(st));
  return {};
}

Result<Normalizer> Normalizer::from_json(const nlohmann::json& j, const std::string& file,
                                         const std::string& field) {
  Normalizer n;
  XDS_RETURN_IF_ERROR(add_steps(j, file, field, &n.steps_));
  return n;
}

Result<std::string> Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& st : steps_) {
    switch (st.kind) {
      case Kind::kNfc: {
        XDS_ASSIGN_OR_RETURN(s, unicode_map(s, UTF8PROC_COMPOSE));
        break;
      }
      case Kind::kNfd: {
        XDS_ASSIGN_OR_RETURN(s, unicode_map(s, UTF8PROC_DECOMPOSE));
        break;
      }
      case Kind::kNfkc: {
        XDS_ASSIGN_OR_RETURN(s, unicode_map(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
        break;
      }
      case Kind::kNfkd: {
        XDS_ASSIGN_OR_RETURN(s, unicode_map(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
        break;
      }
      case Kind::kLowercase: {
        std::string out;
        out.reserve(s.size());
        for (size_t i = 0; i < s.size();) {
          char32_t cp;
          const size_t n = utf8::decode_one(s, i, &cp);
          utf8::append(&out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
          i += n ? n : 1;
        }
        s = std::move(out);
        break;
      }
      case Kind::kPrepend:
        if (!s.empty()) s = st.content + s;
        break;
      case Kind::kStrip: {
        size_t b = 0, e = s.size();
        char32_t cp;
        while (st.strip_left && b < e) {
          const size_t n = utf8::decode_one(s, b, &cp);
          if (n == 0 || !is_space(cp)) break;
          b += n;
        }
        while (st.strip_right && e > b) {
          size_t k = e - 1;
          while (k > b && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
          const size_t n = utf8::decode_one(s, k, &cp);
          if (n == 0 || !is_space(cp)) break;
          e = k;
        }
        s = s.substr(b, e - b);
        break;
      }
      case Kind::kReplace: {
        std::string out;
        if (st.regex) {
          XDS_ASSIGN_OR_RETURN(auto m, st.regex->find_all(s));
          size_t last = 0;
          for (auto [b, e] : m) {
            out.append(s, last, b - last);
            out += st.content;
            last = e;
          }
          out.append(s, last);
        } else {
          size_t last = 0, p;
          while ((p = s.find(st.literal, last)) != std::string::npos) {
            out.append(s, last, p - last);
            out += st.content;
            last = p + st.literal.size();
          }
          out.append(s, last);
        }
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

}  // namespace xds
