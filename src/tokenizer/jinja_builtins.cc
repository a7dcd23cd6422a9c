#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "tokenizer/jinja_arith.h"

namespace xds::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

// Returns a copy: `def` is often a temporary.
Value arg(Args& args, Kwargs& kwargs, size_t pos, const char* name, const Value& def) {
  for (auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  return pos < args.size() ? args[pos] : def;
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) fail(fmt::format("{}: expected a string, got {}", what, type_name(v)));
  return v.s;
}

bool is_space32(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// sv (a string) without the leading / trailing characters; keeps the taint of what is left.
Value strip(const Value& sv, const Value& chars, bool left, bool right) {
  const std::u32string u = to_u32(sv.s);
  std::u32string set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) set = to_u32(need_str(chars, "strip"));
  auto drop = [&](char32_t c) { return ws ? is_space32(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  while (left && b < e && drop(u[b])) ++b;
  while (right && e > b && drop(u[e - 1])) --e;
  return cp_substr(sv, u, u32_offsets(sv.s), b, e);
}

// str.split; each piece keeps its bytes' taint.
Value split(const Value& sv, const Value& sep, int64_t maxsplit) {
  const std::string& s = sv.s;
  Value out = Value::new_list();
  if (sep.is_undefined() || sep.is_none()) {
    const std::u32string u = to_u32(s);
    const std::vector<size_t> at = u32_offsets(s);
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_space32(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.list->size()) >= maxsplit) {
        size_t e = u.size();
        while (e > i && is_space32(u[e - 1])) --e;
        out.list->push_back(cp_substr(sv, u, at, i, e));
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_space32(u[j])) ++j;
      out.list->push_back(cp_substr(sv, u, at, i, j));
      i = j;
    }
    return out;
  }
  const std::string& d = need_str(sep, "split");
  if (d.empty()) fail("split: empty separator");
  size_t last = 0, p;
  while ((maxsplit < 0 || static_cast<int64_t>(out.list->size()) < maxsplit) &&
         (p = s.find(d, last)) != std::string::npos) {
    out.list->push_back(substr(sv, last, p));
    last = p + d.size();
  }
  out.list->push_back(substr(sv, last, s.size()));
  return out;
}

// str.replace: the kept bytes keep their taint, each inserted copy of `to` has to's.
Value replace_all(const Value& sv, const Value& from_v, const Value& to, int64_t count) {
  const std::string& s = sv.s;
  const std::string& from = from_v.s;
  if (from.empty()) return sv;
  // Sized before it is built ('a' * 100000 | replace('a', 'b' * 100000)).
  if (to.s.size() > from.size()) {
    size_t found = 0;
    for (size_t p = s.find(from);
         p != std::string::npos && (count < 0 || static_cast<int64_t>(found) < count);
         p = s.find(from, p + from.size())) {
      ++found;
    }
    if (s.size() + found * (to.s.size() - from.size()) > kMaxBuiltBytes) {
      fail(fmt::format("replace: the result would exceed {} bytes", kMaxBuiltBytes));
    }
  }
  Value out = Value::string("");
  size_t last = 0, p;
  int64_t n = 0;
  while ((count < 0 || n < count) && (p = s.find(from, last)) != std::string::npos) {
    append_str(&out, substr(sv, last, p));
    append_str(&out, to);
    last = p + from.size();
    ++n;
  }
  append_str(&out, substr(sv, last, s.size()));
  return out;
}

// Byte for byte (ASCII case only), so a string's taint ranges stay where they are.
std::string case_map(const std::string& s, int mode) {  // 0 upper, 1 lower, 2 title, 3 capitalize
  std::string out = s;
  bool prev_alpha = false;
  for (size_t k = 0; k < out.size(); ++k) {
    const auto c = static_cast<unsigned char>(out[k]);
    const bool alpha = std::isalpha(c) != 0;
    if (mode == 0) out[k] = static_cast<char>(std::toupper(c));
    if (mode == 1) out[k] = static_cast<char>(std::tolower(c));
    if (mode == 2) out[k] = static_cast<char>(prev_alpha ? std::tolower(c) : std::toupper(c));
    if (mode == 3) out[k] = static_cast<char>(k == 0 ? std::toupper(c) : std::tolower(c));
    prev_alpha = alpha || c >= 0x80;
  }
  return out;
}

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  auto one = [&](const std::string& p) {
    return start ? s.starts_with(p) : s.ends_with(p);
  };
  if (what.is_list()) {
    for (const auto& v : *what.list) {
      if (one(need_str(v, start ? "startswith" : "endswith"))) return true;
    }
    return false;
  }
  return one(need_str(what, start ? "startswith" : "endswith"));
}

Value bind(NativeFn f) { return Value::callable(std::move(f)); }

// A method bound to a list or dict: the callable holds the container in its own `list` /
// `dict` (so that reaches() and ~Value see it); `f` refers to it without owning it.
Value bind_to(const Value& obj, NativeFn f) {
  Value m = Value::callable(std::move(f));
  m.list = obj.list;
  m.dict = obj.dict;
  return m;
}

// Storing `v` in the container `c` must not make a cycle (jinja_value.h).
void check_no_cycle(const Value& v, const void* c, const char* what) {
  if (reaches(v, c)) fail(fmt::format("{}: a list cannot contain itself", what));
}

Value str_method(const Value& obj, const std::string& name) {
  const std::string s = obj.s;
  const Value sv = obj;  // with its taint, for the methods that return pieces of it
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return bind(
        [sv, l, r](Args& a, Kwargs&) { return strip(sv, a.empty() ? Value() : a[0], l, r); });
  }
  if (name == "split") {
    return bind([sv](Args& a, Kwargs& k) {
      const Value ms = arg(a, k, 1, "maxsplit", Value::integer(-1));
      return split(sv, arg(a, k, 0, "sep", Value()), ms.i);
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool st = name == "startswith";
    return bind([s, st](Args& a, Kwargs&) {
      if (a.empty()) fail("startswith/endswith: missing argument");
      return Value::boolean(starts_or_ends(s, a[0], st));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    const int mode = name == "upper" ? 0 : name == "lower" ? 1 : name == "title" ? 2 : 3;
    return bind(
        [sv, mode](Args&, Kwargs&) { return Value::string(case_map(sv.s, mode), sv.taint); });
  }
  if (name == "replace") {
    return bind([sv](Args& a, Kwargs&) {
      if (a.size() < 2) fail("replace: expected 2 arguments");
      need_str(a[0], "replace");
      need_str(a[1], "replace");
      return replace_all(sv, a[0], a[1], a.size() > 2 ? a[2].i : -1);
    });
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    return bind([s, name](Args& a, Kwargs&) {
      if (a.empty()) fail(name + ": missing argument");
      const std::string& sub = need_str(a[0], name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(to_u32(s).size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      const size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name == "index") fail("index: substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(to_u32(s.substr(0, p)).size()));
    });
  }
  if (name == "join") {
    return bind([sv](Args& a, Kwargs&) {
      Value out = Value::string("");
      const List items = a.empty() ? List{} : iterate(a[0]);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) append_str(&out, sv);
        append_str(&out, to_str_value(items[k]));
      }
      return out;
    });
  }
  if (name == "splitlines") {
    return bind([sv](Args&, Kwargs&) {
      const std::string& s = sv.s;
      Value out = Value::new_list();
      size_t last = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
          out.list->push_back(substr(sv, last, k));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          last = k + 1;
        }
      }
      if (last < s.size()) out.list->push_back(substr(sv, last, s.size()));
      return out;
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
    return bind([s, name](Args&, Kwargs&) {
      if (s.empty()) return Value::boolean(false);
      for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        const bool ok = name == "isdigit" ? std::isdigit(c) : name == "isalpha" ? std::isalpha(c)
                        : name == "isspace" ? std::isspace(c) : std::isalnum(c);
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  }
  return Value::undefined(name);
}

Value dict_method(const Value& obj, const std::string& name) {
  Dict* d = obj.dict.get();
  if (name == "get") {
    return bind_to(obj, [d](Args& a, Kwargs&) {
      if (a.empty()) fail("get: missing key");
      const Value* v = a[0].is_string() ? d->find(a[0].s) : nullptr;
      return v ? *v : (a.size() > 1 ? a[1] : Value::none());
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return bind_to(obj, [d, name](Args&, Kwargs&) {
      Value out = Value::new_list();
      for (const auto& [k, v] : d->items) {
        if (name == "items") out.list->push_back(Value::new_list({key_value(*d, k), v}));
        if (name == "keys") out.list->push_back(key_value(*d, k));
        if (name == "values") out.list->push_back(v);
      }
      return out;
    });
  }
  return Value::undefined(name);
}

Value list_method(const Value& obj, const std::string& name) {
  List* l = obj.list.get();
  if (name == "append") {
    return bind_to(obj, [l](Args& a, Kwargs&) {
      if (a.size() != 1) fail("append: expected 1 argument");
      check_no_cycle(a[0], l, "append");
      l->push_back(a[0]);
      return Value::none();
    });
  }
  if (name == "extend") {
    return bind_to(obj, [l](Args& a, Kwargs&) {
      if (a.size() != 1) fail("extend: expected 1 argument");
      List items = iterate(a[0]);
      for (const Value& v : items) check_no_cycle(v, l, "extend");
      l->insert(l->end(), items.begin(), items.end());
      return Value::none();
    });
  }
  if (name == "pop") {
    return bind_to(obj, [l](Args& a, Kwargs&) {
      if (l->empty()) fail("pop from empty list");
      int64_t i = a.empty() ? -1 : a[0].i;
      if (i < 0) i += static_cast<int64_t>(l->size());
      if (i < 0 || i >= static_cast<int64_t>(l->size())) fail("pop index out of range");
      Value v = (*l)[i];
      l->erase(l->begin() + i);
      return v;
    });
  }
  if (name == "insert") {
    return bind_to(obj, [l](Args& a, Kwargs&) {
      if (a.size() != 2) fail("insert: expected 2 arguments");
      check_no_cycle(a[1], l, "insert");
      const auto n = static_cast<int64_t>(l->size());
      // a[0].i + n cannot overflow: n is a list's size, far from the int64 limits.
      const int64_t i = std::clamp<int64_t>(a[0].i < 0 ? std::max(a[0].i, -n) + n : a[0].i, 0, n);
      l->insert(l->begin() + i, a[1]);
      return Value::none();
    });
  }
  if (name == "index" || name == "count") {
    return bind_to(obj, [l, name](Args& a, Kwargs&) {
      if (a.empty()) fail(name + ": missing argument");
      int64_t n = 0;
      for (size_t k = 0; k < l->size(); ++k) {
        if (equals((*l)[k], a[0])) {
          if (name == "index") return Value::integer(static_cast<int64_t>(k));
          ++n;
        }
      }
      if (name == "index") fail("index: value not in list");
      return Value::integer(n);
    });
  }
  return Value::undefined(name);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t last = 0;
  while (true) {
    const size_t dot = path.find('.', last);
    const std::string part = path.substr(last, dot == std::string::npos ? std::string::npos : dot - last);
    cur = get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    last = dot + 1;
  }
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.type) {
    case Value::Type::kNamespace: {
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Type::kDict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Type::kString: return str_method(obj, name);
    case Value::Type::kList: return list_method(obj, name);
    default: return Value::undefined(name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_mapping()) {
    if (key.is_string()) {
      const Value* v = obj.dict->find(key.s);
      if (v) return *v;
      return obj.type == Value::Type::kDict ? dict_method(obj, key.s) : Value::undefined(key.s);
    }
    return Value::undefined(to_str(key));
  }
  if ((obj.is_list() || obj.is_string()) && (key.type == Value::Type::kInt || key.type == Value::Type::kBool)) {
    const std::u32string u = obj.is_string() ? to_u32(obj.s) : std::u32string();
    const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(u.size());
    int64_t i = key.type == Value::Type::kBool ? key.b : key.i;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(fmt::format("[{}]", key.i));
    return obj.is_list() ? (*obj.list)[i] : cp_substr(obj, u, u32_offsets(obj.s), i, i + 1);
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined(to_str(key));
}

Value slice(const Value& obj, const Value& lo_v, const Value& hi_v, const Value& step_v) {
  const bool is_str = obj.is_string();
  if (!is_str && !obj.is_list()) fail(fmt::format("cannot slice a {}", type_name(obj)));
  const std::u32string u = is_str ? to_u32(obj.s) : std::u32string();
  const int64_t n = is_str ? static_cast<int64_t>(u.size()) : static_cast<int64_t>(obj.list->size());
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  const int64_t step = given(step_v) ? step_v.i : 1;
  if (step == 0) fail("slice step cannot be zero");
  int64_t lo, hi;
  if (step > 0) {
    lo = given(lo_v) ? lo_v.i : 0;
    hi = given(hi_v) ? hi_v.i : n;
    if (lo < 0) lo = std::max<int64_t>(0, lo + n);
    if (hi < 0) hi = std::max<int64_t>(0, hi + n);
    lo = std::min(lo, n);
    hi = std::min(hi, n);
  } else {
    lo = given(lo_v) ? lo_v.i : n - 1;
    hi = given(hi_v) ? hi_v.i : -1 - n;
    if (lo < 0) lo = std::max<int64_t>(-1, lo + n);
    if (hi < 0) hi = std::max<int64_t>(-1, hi + n);
    lo = std::min(lo, n - 1);
    hi = std::min(hi, n - 1);
  }
  const std::vector<size_t> at = is_str ? u32_offsets(obj.s) : std::vector<size_t>();
  Value str = Value::string("");  // each code point with its own taint
  Value out = Value::new_list();
  // In 128 bits: i + step may leave the int64 range on the last turn ([5::2**63-1]).
  for (__int128 i = lo; step > 0 ? i < hi : i > hi; i += step) {
    const auto k = static_cast<size_t>(i);
    if (is_str) {
      append_str(&str, cp_substr(obj, u, at, k, k + 1));
    } else {
      out.list->push_back((*obj.list)[k]);
    }
  }
  return is_str ? str : out;
}

bool contains(const Value& c, const Value& item) {
  switch (c.type) {
    case Value::Type::kString:
      if (!item.is_string()) fail(fmt::format("'in <string>' requires a string, got {}", type_name(item)));
      return c.s.find(item.s) != std::string::npos;
    case Value::Type::kList:
      return std::any_of(c.list->begin(), c.list->end(), [&](const Value& v) { return equals(v, item); });
    case Value::Type::kDict:
    case Value::Type::kNamespace: return item.is_string() && c.dict->find(item.s) != nullptr;
    case Value::Type::kUndefined: return false;
    default: fail(fmt::format("argument of type '{}' is not iterable", type_name(c)));
  }
}

List iterate(const Value& v) {
  switch (v.type) {
    case Value::Type::kList: return *v.list;
    case Value::Type::kDict: {
      List out;
      for (const auto& kv : v.dict->items) out.push_back(key_value(*v.dict, kv.first));
      return out;
    }
    case Value::Type::kString: {
      List out;
      const std::u32string u = to_u32(v.s);
      if (u.size() > (size_t{1} << 20))
        fail("cannot iterate a string of more than 2^20 characters");
      const std::vector<size_t> at = u32_offsets(v.s);
      for (size_t k = 0; k < u.size(); ++k) out.push_back(cp_substr(v, u, at, k, k + 1));
      return out;
    }
    case Value::Type::kUndefined: return {};
    default: fail(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  auto need = [&](size_t n) {
    if (args.size() < n) fail(fmt::format("test '{}' needs an argument", name));
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.type == Value::Type::kInt;
  if (name == "float") return v.type == Value::Type::kFloat;
  if (name == "boolean") return v.type == Value::Type::kBool;
  if (name == "true") return v.type == Value::Type::kBool && v.b;
  if (name == "false") return v.type == Value::Type::kBool && !v.b;
  if (name == "mapping") return v.type == Value::Type::kDict;
  if (name == "iterable") return v.is_list() || v.is_string() || v.type == Value::Type::kDict;
  if (name == "sequence") return v.is_list() || v.is_string() || v.type == Value::Type::kDict;
  if (name == "callable") return v.type == Value::Type::kCallable;
  if (name == "odd" || name == "even") {
    if (v.type != Value::Type::kInt) fail(fmt::format("test '{}' needs an integer", name));
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    need(1);
    return args[0].i != 0 && int_mod(v.i, args[0].i) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "sameas") {
    need(1);
    return equals(v, args[0]);
  }
  if (name == "ne") { need(1); return !equals(v, args[0]); }
  if (name == "lt") { need(1); return compare(v, args[0]) < 0; }
  if (name == "le") { need(1); return compare(v, args[0]) <= 0; }
  if (name == "gt") { need(1); return compare(v, args[0]) > 0; }
  if (name == "ge") { need(1); return compare(v, args[0]) >= 0; }
  if (name == "in") { need(1); return contains(args[0], v); }
  if (name == "lower") return v.is_string() && case_map(v.s, 1) == v.s;
  if (name == "upper") return v.is_string() && case_map(v.s, 0) == v.s;
  fail(fmt::format("unsupported test '{}'", name));
}

Value apply_filter(const std::string& name, const Value& v, Args& args, Kwargs& kwargs) {
  const Value none;
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(static_cast<int64_t>(to_u32(v.s).size()));
    if (v.is_list()) return Value::integer(static_cast<int64_t>(v.list->size()));
    if (v.is_mapping()) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    if (v.is_undefined()) return Value::integer(0);
    fail(fmt::format("object of type '{}' has no length", type_name(v)));
  }
  if (name == "tojson") {
    const Value ind = arg(args, kwargs, 0, "indent", none);
    if (ind.type == Value::Type::kInt && ind.i > 1024) fail("tojson: indent must be at most 1024");
    const int indent =
        ind.type == Value::Type::kInt ? static_cast<int>(std::max<int64_t>(ind.i, -1)) : -1;
    std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
    const Value seps = arg(args, kwargs, 99, "separators", none);
    if (seps.is_list() && seps.list->size() == 2) {
      isep = need_str((*seps.list)[0], "tojson separators");
      ksep = need_str((*seps.list)[1], "tojson separators");
    }
    return derived_string(
        to_json(v, indent, isep, ksep, truthy(arg(args, kwargs, 99, "sort_keys", none))), v);
  }
  if (name == "trim") {
    need_str(v, "trim");
    return strip(v, arg(args, kwargs, 0, "chars", none), true, true);
  }
  if (name == "default" || name == "d") {
    const bool boolean = truthy(arg(args, kwargs, 1, "boolean", none));
    if (v.is_undefined() || (boolean && !truthy(v))) {
      const Value d = arg(args, kwargs, 0, "default_value", none);
      return d.is_undefined() ? Value::string("") : d;
    }
    return v;
  }
  if (name == "string") return to_str_value(v);
  if (name == "safe") return v;
  if (name == "escape" || name == "e") return derived_string(html_escape(to_str(v)), v);
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    const int mode = name == "upper" ? 0 : name == "lower" ? 1 : name == "title" ? 2 : 3;
    const Value sv = to_str_value(v);
    return Value::string(case_map(sv.s, mode), sv.taint);
  }
  if (name == "replace") {
    if (args.size() < 2) fail("filter 'replace' needs 2 arguments");
    need_str(args[0], "replace");
    need_str(args[1], "replace");
    return replace_all(to_str_value(v), args[0], args[1], args.size() > 2 ? args[2].i : -1);
  }
  if (name == "int") {
    if (v.type == Value::Type::kFloat) {
      if (!fits_int64(v.f)) fail(fmt::format("int: {} does not fit a 64-bit integer", v.f));
      return Value::integer(static_cast<int64_t>(v.f));
    }
    if (v.type == Value::Type::kInt || v.type == Value::Type::kBool) return Value::integer(v.type == Value::Type::kBool ? v.b : v.i);
    if (v.is_string()) {
      try {
        return Value::integer(std::stoll(v.s));
      } catch (...) {
      }
    }
    const Value d = arg(args, kwargs, 0, "default", none);
    return d.is_undefined() ? Value::integer(0) : d;
  }
  if (name == "float") {
    if (v.is_number() || v.type == Value::Type::kBool) return Value::number(v.as_double());
    if (v.is_string()) {
      try {
        return Value::number(std::stod(v.s));
      } catch (...) {
      }
    }
    return Value::number(0);
  }
  if (name == "abs") {
    if (v.type == Value::Type::kInt) return Value::integer(int_abs(v.i));
    return Value::number(std::fabs(v.as_double()));
  }
  if (name == "round") {
    const int64_t prec = arg(args, kwargs, 0, "precision", Value::integer(0)).i;
    const double p = std::pow(10.0, static_cast<double>(prec));
    return Value::number(std::round(v.as_double() * p) / p);
  }
  if (name == "list") return Value::new_list(iterate(v));
  if (name == "first" || name == "last") {
    const List items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = to_u32(v.s);
      std::reverse(u.begin(), u.end());
      return derived_string(from_u32(u), v);
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "join") {
    const Value sep = to_str_value(arg(args, kwargs, 0, "d", Value::string("")));
    const Value attr = arg(args, kwargs, 1, "attribute", none);
    Value out = Value::string("");
    const List items = iterate(v);
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) append_str(&out, sep);
      append_str(&out,
                 to_str_value(attr.is_undefined() ? items[k] : attr_path(items[k], to_str(attr))));
    }
    return out;
  }
  if (name == "items") {
    if (!v.is_mapping()) fail("filter 'items' needs a mapping");
    Value out = Value::new_list();
    for (const auto& [k, x] : v.dict->items)
      out.list->push_back(Value::new_list({key_value(*v.dict, k), x}));
    return out;
  }
  if (name == "dictsort") {
    if (!v.is_mapping()) fail("filter 'dictsort' needs a mapping");
    auto items = v.dict->items;
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    Value out = Value::new_list();
    for (const auto& [k, x] : items)
      out.list->push_back(Value::new_list({key_value(*v.dict, k), x}));
    return out;
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name.ends_with("attr");
    const bool keep = name.starts_with("select");
    Value out = Value::new_list();
    const size_t t0 = by_attr ? 1 : 0;
    for (const Value& item : iterate(v)) {
      const Value x = by_attr ? attr_path(item, need_str(args.at(0), name.c_str())) : item;
      bool ok;
      if (args.size() > t0) {
        Args targs(args.begin() + t0 + 1, args.end());
        ok = apply_test(need_str(args[t0], name.c_str()), x, targs);
      } else {
        ok = truthy(x);
      }
      if (ok == keep) out.list->push_back(item);
    }
    return out;
  }
  if (name == "map") {
    Value out = Value::new_list();
    const Value attr = arg(args, kwargs, 99, "attribute", none);
    for (const Value& item : iterate(v)) {
      if (!attr.is_undefined()) {
        Value x = attr_path(item, to_str(attr));
        if (x.is_undefined()) x = arg(args, kwargs, 99, "default", none);
        out.list->push_back(x);
      } else {
        if (args.empty()) fail("filter 'map' needs a filter name or attribute=");
        Args fargs(args.begin() + 1, args.end());
        Kwargs fk;
        out.list->push_back(apply_filter(need_str(args[0], "map"), item, fargs, fk));
      }
    }
    return out;
  }
  if (name == "unique") {
    // Each item is compared with those kept: quadratic, so the input is bounded.
    const List items = iterate(v);
    if (items.size() > 4096) fail("filter 'unique': more than 4096 items");
    Value out = Value::new_list();
    for (const Value& item : items) {
      if (!contains(out, item)) out.list->push_back(item);
    }
    return out;
  }
  if (name == "sort") {
    List items = iterate(v);
    const bool rev = truthy(arg(args, kwargs, 0, "reverse", none));
    const Value attr = arg(args, kwargs, 2, "attribute", none);
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const Value ka = attr.is_undefined() ? a : attr_path(a, to_str(attr));
      const Value kb = attr.is_undefined() ? b : attr_path(b, to_str(attr));
      return rev ? compare(kb, ka) < 0 : compare(ka, kb) < 0;
    });
    return Value::new_list(std::move(items));
  }
  if (name == "sum") {
    double f = 0;
    int64_t i = 0;
    bool is_float = false;
    for (const Value& x : iterate(v)) {
      if (x.type == Value::Type::kFloat) is_float = true;
      f += x.as_double();
      i = int_add(i, x.type == Value::Type::kInt ? x.i : 0);
    }
    return is_float ? Value::number(f) : Value::integer(i);
  }
  if (name == "min" || name == "max") {
    const List items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    Value best = items[0];
    for (const Value& x : items) {
      if ((name == "min" && compare(x, best) < 0) || (name == "max" && compare(x, best) > 0)) best = x;
    }
    return best;
  }
  if (name == "indent") {
    const int64_t width = arg(args, kwargs, 0, "width", Value::integer(4)).i;
    if (width > 1024) fail("filter 'indent': width must be at most 1024");
    const bool first = truthy(arg(args, kwargs, 1, "first", none));
    const bool blank = truthy(arg(args, kwargs, 2, "blank", none));
    const std::string pad(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
    const Value sv = to_str_value(v);
    const std::string& s = sv.s;
    Value out = Value::string("");  // the padding is the template's; each line keeps its taint
    size_t last = 0;
    bool first_line = true;
    while (last <= s.size()) {
      const size_t nl = s.find('\n', last);
      const size_t end = nl == std::string::npos ? s.size() : nl;
      if ((first_line ? first : true) && (blank || end > last) && !(first_line && !first))
        out.s += pad;
      append_str(&out, substr(sv, last, nl == std::string::npos ? end : end + 1));
      first_line = false;
      if (nl == std::string::npos) break;
      last = nl + 1;
    }
    return out;
  }
  if (name == "wordcount")
    return Value::integer(static_cast<int64_t>(split(to_str_value(v), none, -1).list->size()));
  fail(fmt::format("unsupported filter '{}'", name));
}

void add_globals(Dict* g) {
  g->set("namespace", Value::callable([](Args& a, Kwargs& k) {
    Value ns = Value::new_namespace();
    if (!a.empty() && a[0].is_mapping()) {
      ns.dict->untrusted_keys = a[0].dict->untrusted_keys;
      for (const auto& [key, v] : a[0].dict->items) ns.dict->set(key, v);
    }
    for (const auto& [key, v] : k) ns.dict->set(key, v);
    return ns;
  }));
  g->set("dict", Value::callable([](Args&, Kwargs& k) {
    Value d = Value::new_dict();
    for (const auto& [key, v] : k) d.dict->set(key, v);
    return d;
  }));
  g->set("range", Value::callable([](Args& a, Kwargs&) {
    if (a.empty() || a.size() > 3) fail("range: expected 1 to 3 arguments");
    for (const auto& x : a) {
      if (x.type != Value::Type::kInt) fail(fmt::format("range: expected integers, got {}", type_name(x)));
    }
    const int64_t start = a.size() == 1 ? 0 : a[0].i;
    const int64_t stop = a.size() == 1 ? a[0].i : a[1].i;
    const int64_t step = a.size() == 3 ? a[2].i : 1;
    if (step == 0) fail("range: step must not be zero");
    // The count first, in 128 bits: start + k * step never overflows for the items kept.
    const __int128 span =
        step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 by = step > 0 ? static_cast<__int128>(step) : -static_cast<__int128>(step);
    const __int128 count = span <= 0 ? 0 : (span + by - 1) / by;
    if (count > 1000001) fail("range: more than 1000000 items");
    Value out = Value::new_list();
    for (__int128 k = 0; k < count; ++k) {
      out.list->push_back(Value::integer(static_cast<int64_t>(start + k * step)));
    }
    return out;
  }));
  g->set("raise_exception", Value::callable([](Args& a, Kwargs&) -> Value {
    fail(fmt::format("raise_exception: {}", a.empty() ? "" : to_str(a[0])));
  }));
  g->set("strftime_now", Value::callable([](Args& a, Kwargs&) {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), a.empty() ? "%Y-%m-%d" : to_str(a[0]).c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
}

}  // namespace xds::jinja
