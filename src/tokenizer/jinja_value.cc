#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include <fmt/format.h>

#include "tokenizer/utf8.h"

namespace xds::jinja {

Value* Dict::find(const std::string& k) {
  for (auto& [key, v] : items) {
    if (key == k) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& k, Value v) {
  if (Value* p = find(k)) {
    *p = std::move(v);
  } else {
    items.emplace_back(k, std::move(v));
  }
}

namespace {

[[noreturn]] void too_deep() {
  throw TemplateError(fmt::format("a value nested deeper than {} levels", kMaxValueDepth));
}

void check_printed(const std::string& out) {
  if (out.size() > kMaxBuiltBytes) {
    throw TemplateError(
        fmt::format("a value too large to print (more than {} bytes)", kMaxBuiltBytes));
  }
}

Value from_json_rec(const nlohmann::ordered_json& j, bool untrusted, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return untrusted ? Value::untrusted_string(j.get<std::string>())
                       : Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = Value::new_list();
      for (const auto& e : j) v.list->push_back(from_json_rec(e, untrusted, depth + 1));
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::new_dict();
      v.dict->untrusted_keys = untrusted && !j.empty();
      for (auto it = j.begin(); it != j.end(); ++it) {
        v.dict->items.emplace_back(it.key(), from_json_rec(it.value(), untrusted, depth + 1));
      }
      return v;
    }
    default: return Value::none();
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j, bool untrusted) {
  return from_json_rec(j, untrusted, 0);
}

Value::~Value() {
  if (!(list && list.use_count() == 1) && !(dict && dict.use_count() == 1)) return;
  // Every container held by an item of a container being freed moves to a work list; one is
  // taken apart when the work list is its last owner. No destructor below recurses.
  std::vector<std::shared_ptr<List>> lists;
  std::vector<std::shared_ptr<Dict>> dicts;
  auto take = [&](Value& x) {
    if (x.list) lists.push_back(std::move(x.list));
    if (x.dict) dicts.push_back(std::move(x.dict));
  };
  take(*this);
  while (!lists.empty() || !dicts.empty()) {
    if (!lists.empty()) {
      std::shared_ptr<List> l = std::move(lists.back());
      lists.pop_back();
      if (l.use_count() == 1) {
        for (Value& x : *l) take(x);
      }
    } else {
      std::shared_ptr<Dict> d = std::move(dicts.back());
      dicts.pop_back();
      if (d.use_count() == 1) {
        for (auto& kv : d->items) take(kv.second);
      }
    }
  }
}

bool reaches(const Value& v, const void* container) {
  std::vector<const Value*> todo{&v};
  std::unordered_set<const void*> seen;
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    if (x->list) {
      if (x->list.get() == container) return true;
      if (seen.insert(x->list.get()).second) {
        for (const Value& y : *x->list) todo.push_back(&y);
      }
    }
    if (x->dict) {
      if (x->dict.get() == container) return true;
      if (seen.insert(x->dict.get()).second) {
        for (const auto& kv : x->dict->items) todo.push_back(&kv.second);
      }
    }
  }
  return false;
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return false;
    case Value::Type::kBool: return v.b;
    case Value::Type::kInt: return v.i != 0;
    case Value::Type::kFloat: return v.f != 0;
    case Value::Type::kString: return !v.s.empty();
    case Value::Type::kList: return !v.list->empty();
    case Value::Type::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

namespace {
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string py_quote(const std::string& s) {
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + q;
}

void json_string(const std::string& s, std::string* out) {
  out->push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<uint8_t>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          *out += fmt::format("\\u{:04x}", c);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void json_rec(const Value& v, int indent, int depth, const std::string& isep, const std::string& ksep,
              bool sort_keys, std::string* out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  if (depth > kMaxValueDepth) too_deep();
  check_printed(*out);
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: *out += "null"; break;
    case Value::Type::kBool: *out += v.b ? "true" : "false"; break;
    case Value::Type::kInt: *out += std::to_string(v.i); break;
    case Value::Type::kFloat:
      *out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      break;
    case Value::Type::kString: json_string(v.s, out); break;
    case Value::Type::kList:
      if (v.list->empty()) {
        *out += "[]";
        break;
      }
      out->push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) *out += isep;
        newline(depth + 1);
        json_rec((*v.list)[k], indent, depth + 1, isep, ksep, sort_keys, out);
      }
      newline(depth);
      out->push_back(']');
      break;
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      if (v.dict->items.empty()) {
        *out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out->push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) *out += isep;
        newline(depth + 1);
        json_string(items[k]->first, out);
        *out += ksep;
        json_rec(items[k]->second, indent, depth + 1, isep, ksep, sort_keys, out);
      }
      newline(depth);
      out->push_back('}');
      break;
    }
    case Value::Type::kCallable: throw TemplateError("tojson: a function is not JSON serializable");
  }
}
}  // namespace

std::string to_str(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined: return "";
    case Value::Type::kNone: return "None";
    case Value::Type::kBool: return v.b ? "True" : "False";
    case Value::Type::kInt: return std::to_string(v.i);
    case Value::Type::kFloat: return float_repr(v.f);
    case Value::Type::kString: return v.s;
    default: return repr(v);
  }
}

namespace {
constexpr int kMaxTaintDepth = 64;  // deeper (or cyclic) containers count as untrusted

bool deep_tainted_rec(const Value& v, int depth) {
  switch (v.type) {
    case Value::Type::kString:
      return !v.taint.empty();
    case Value::Type::kList:
      if (depth >= kMaxTaintDepth) return true;
      for (const Value& x : *v.list) {
        if (deep_tainted_rec(x, depth + 1)) return true;
      }
      return false;
    case Value::Type::kDict:
    case Value::Type::kNamespace:
      if (depth >= kMaxTaintDepth) return true;
      if (v.dict->untrusted_keys) return true;
      for (const auto& [k, x] : v.dict->items) {
        if (deep_tainted_rec(x, depth + 1)) return true;
      }
      return false;
    default:
      return false;
  }
}
}  // namespace

bool deep_tainted(const Value& v) {
  return deep_tainted_rec(v, 0);
}

Value derived_string(std::string out, const Value& src) {
  return deep_tainted(src) ? Value::untrusted_string(std::move(out))
                           : Value::string(std::move(out));
}

Value to_str_value(const Value& v) {
  if (v.is_string()) return v;
  return derived_string(to_str(v), v);
}

Value key_value(const Dict& d, const std::string& key) {
  return d.untrusted_keys ? Value::untrusted_string(key) : Value::string(key);
}

void append_str(Value* dst, const Value& src) {
  taint::append(&dst->taint, src.taint, dst->s.size());
  dst->s += src.s;
}

Value substr(const Value& s, size_t begin, size_t end) {
  end = std::min(end, s.s.size());
  begin = std::min(begin, end);
  return Value::string(s.s.substr(begin, end - begin), taint::slice(s.taint, begin, end));
}

namespace {
void repr_rec(const Value& v, int depth, std::string* out) {
  if (depth > kMaxValueDepth) too_deep();
  check_printed(*out);
  switch (v.type) {
    case Value::Type::kString: *out += py_quote(v.s); break;
    case Value::Type::kList:
      *out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += ", ";
        repr_rec((*v.list)[k], depth + 1, out);
      }
      *out += "]";
      break;
    case Value::Type::kDict:
      *out += "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) *out += ", ";
        *out += py_quote(v.dict->items[k].first) + ": ";
        repr_rec(v.dict->items[k].second, depth + 1, out);
      }
      *out += "}";
      break;
    case Value::Type::kNamespace: *out += "<Namespace>"; break;
    case Value::Type::kCallable: *out += "<function>"; break;
    default: *out += to_str(v);
  }
}
}  // namespace

std::string repr(const Value& v) {
  std::string out;
  repr_rec(v, 0, &out);
  check_printed(out);
  return out;
}

std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys) {
  std::string out;
  json_rec(v, indent, 0, item_sep, key_sep, sort_keys, &out);
  check_printed(out);
  return out;
}

namespace {
bool equals_rec(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  const bool an = a.is_number() || a.type == Value::Type::kBool;
  const bool bn = b.is_number() || b.type == Value::Type::kBool;
  if (an && bn) return a.as_double() == b.as_double();
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return true;
    case Value::Type::kString: return a.s == b.s;
    case Value::Type::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals_rec((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      }
      return true;
    case Value::Type::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (o == nullptr || !equals_rec(v, *o, depth + 1)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.fn == b.fn;
  }
}

int compare_rec(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) too_deep();
  const bool an = a.is_number() || a.type == Value::Type::kBool;
  const bool bn = b.is_number() || b.type == Value::Type::kBool;
  if (an && bn) return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      if (const int c = compare_rec((*a.list)[k], (*b.list)[k], depth + 1); c != 0) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw TemplateError(fmt::format("cannot compare '{}' with '{}'", type_name(a), type_name(b)));
}
}  // namespace

bool equals(const Value& a, const Value& b) { return equals_rec(a, b, 0); }

int compare(const Value& a, const Value& b) { return compare_rec(a, b, 0); }

std::string type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined: return "undefined";
    case Value::Type::kNone: return "NoneType";
    case Value::Type::kBool: return "bool";
    case Value::Type::kInt: return "int";
    case Value::Type::kFloat: return "float";
    case Value::Type::kString: return "str";
    case Value::Type::kList: return "list";
    case Value::Type::kDict: return "dict";
    case Value::Type::kNamespace: return "Namespace";
    case Value::Type::kCallable: return "function";
  }
  return "?";
}

std::vector<size_t> u32_offsets(const std::string& s) {
  std::vector<size_t> at;
  size_t i = 0;
  while (i < s.size()) {
    at.push_back(i);
    char32_t cp;
    const size_t n = utf8::decode_one(s, i, &cp);
    i += n == 0 ? utf8::invalid_run(s, i) : n;
  }
  at.push_back(s.size());
  return at;
}

Value cp_substr(const Value& v, const std::u32string& u, const std::vector<size_t>& at, size_t cb,
                size_t ce) {
  std::string text = from_u32(u.substr(cb, ce - cb));
  const size_t b = at[cb], e = at[ce];
  if (std::string_view(v.s).substr(b, e - b) == text) {
    return Value::string(std::move(text), taint::slice(v.taint, b, e));
  }
  // Ill-formed bytes became U+FFFD: the piece is untrusted as a whole when any of it was.
  return taint::overlaps(v.taint, b, e) ? Value::untrusted_string(std::move(text))
                                        : Value::string(std::move(text));
}

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t n = utf8::decode_one(s, i, &cp);
    if (n == 0) {
      out.push_back(0xFFFD);
      i += utf8::invalid_run(s, i);
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  for (const char32_t c : s) utf8::append(&out, c);
  return out;
}

}  // namespace xds::jinja
