// Values of the Jinja subset interpreter (chat templates). Python semantics: lists and dicts
// are shared by reference (list.append in a namespace is visible everywhere), dicts keep
// insertion order (tools | tojson prints keys as the caller gave them), strings are UTF-8 and
// indexed / measured by code point.
//
// Lists and dicts may nest without bound (l = [l] in a loop): destroying one never recurses
// (~Value takes the containers it last owns apart iteratively), the functions below that walk
// values (repr, to_json, equals, compare, from_json) fail beyond kMaxValueDepth levels, and a
// list or namespace may not contain itself (reaches(); cycles would leak). A bound method
// (list.append) holds its list or dict in its own `list` / `dict`, so those walks see it.
//
// Taint: a string carries the byte ranges that came from untrusted input (Value::from_json with
// untrusted = true: the request's messages and tools). Every operation that builds a string
// from others keeps them — concatenation, ~, join, slicing, indexing, iteration, strip / trim,
// split, replace, case mapping, indent — and one that cannot say which bytes came from where
// (tojson, repr of a list, escape, reverse) marks its whole result untrusted when any input
// was. Dict keys of untrusted input are untrusted when read as strings (items(), iteration).
// Thread-safety: values are not thread-safe; each render() builds its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/prompt_text.h"

namespace xds::jinja {

// Thrown inside the interpreter only; ChatTemplate::render() turns it into a Status.
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How deeply repr, to_json, equals, compare and from_json follow nested values.
inline constexpr int kMaxValueDepth = 128;
// The longest text repr / to_json and the string-building filters produce.
inline constexpr size_t kMaxBuiltBytes = size_t{16} << 20;

struct Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  bool untrusted_keys = false;  // some key came from untrusted input: every key reads as untrusted
  Value* find(const std::string& k);
  void set(const std::string& k, Value v);
};
using NativeFn = std::function<Value(std::vector<Value>& args, std::vector<std::pair<std::string, Value>>& kwargs)>;

struct Value {
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };
  Type type = Type::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  TaintRanges taint;               // kString: untrusted byte ranges of s
  std::shared_ptr<List> list;      // kList
  std::shared_ptr<Dict> dict;      // kDict, kNamespace
  std::shared_ptr<NativeFn> fn;    // kCallable
  std::string undefined_name;      // kUndefined: what was looked up, for error messages

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // The last owner of a list or dict takes it apart without recursion (see above).
  ~Value();

  static Value undefined(std::string name = "") {
    Value v;
    v.undefined_name = std::move(name);
    return v;
  }
  static Value none() { return with(Type::kNone); }
  static Value boolean(bool x) { auto v = with(Type::kBool); v.b = x; return v; }
  static Value integer(int64_t x) { auto v = with(Type::kInt); v.i = x; return v; }
  static Value number(double x) { auto v = with(Type::kFloat); v.f = x; return v; }
  static Value string(std::string x, TaintRanges taint = {}) {
    auto v = with(Type::kString);
    v.s = std::move(x);
    v.taint = std::move(taint);
    return v;
  }
  // A string wholly from untrusted input.
  static Value untrusted_string(std::string x) {
    const size_t n = x.size();
    return string(std::move(x), n ? TaintRanges{{0, n}} : TaintRanges{});
  }
  static Value new_list(List items = {}) {
    auto v = with(Type::kList);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value new_dict() { auto v = with(Type::kDict); v.dict = std::make_shared<Dict>(); return v; }
  static Value new_namespace() { auto v = with(Type::kNamespace); v.dict = std::make_shared<Dict>(); return v; }
  static Value callable(NativeFn f) {
    auto v = with(Type::kCallable);
    v.fn = std::make_shared<NativeFn>(std::move(f));
    return v;
  }
  // untrusted: every string and dict key in `j` is untrusted.
  static Value from_json(const nlohmann::ordered_json& j, bool untrusted = false);

  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_none() const { return type == Type::kNone; }
  bool is_string() const { return type == Type::kString; }
  bool is_number() const { return type == Type::kInt || type == Type::kFloat; }
  bool is_list() const { return type == Type::kList; }
  bool is_mapping() const { return type == Type::kDict || type == Type::kNamespace; }
  double as_double() const { return type == Type::kFloat ? f : static_cast<double>(type == Type::kBool ? b : i); }

 private:
  static Value with(Type t) { Value v; v.type = t; return v; }
};

// Python truthiness.
bool truthy(const Value& v);
// Python str() of a value as Jinja prints it ({{ x }}): undefined "", None "None", True/False,
// lists and dicts as Python repr.
std::string to_str(const Value& v);
// to_str() as a string value that keeps taint: a string as it is; a list or dict printed
// wholly untrusted when anything in it is.
Value to_str_value(const Value& v);
// Whether a string, or any string or key inside a list or dict, is untrusted.
bool deep_tainted(const Value& v);
// Whether `container` (a List or Dict) is `v`'s own or one nested in it (through lists, dicts
// and bound methods): storing v in the container would make a cycle.
bool reaches(const Value& v, const void* container);
// A dict key read as a string value (untrusted when the dict's keys are).
Value key_value(const Dict& d, const std::string& key);
// dst (a string) += src (a string), taint included.
void append_str(Value* dst, const Value& src);
// Bytes [begin, end) of the string `s` with their taint.
Value substr(const Value& s, size_t begin, size_t end);
// The string `out` derived from `src` as a whole: wholly untrusted when src is deep_tainted.
Value derived_string(std::string out, const Value& src);
// Python repr() (strings quoted).
std::string repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=sort_keys) as
// transformers' tojson does. indent < 0 means None.
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys);
bool equals(const Value& a, const Value& b);
// Python ordering for numbers, strings and lists; throws TemplateError otherwise.
int compare(const Value& a, const Value& b);
std::string type_name(const Value& v);

// Code points of a UTF-8 string (ill-formed bytes become U+FFFD).
std::u32string to_u32(const std::string& s);
std::string from_u32(const std::u32string& s);
// Byte offset where each code point of to_u32(s) starts, then s.size() ([n_code_points + 1]).
std::vector<size_t> u32_offsets(const std::string& s);
// Code points [cb, ce) of the string v (u = to_u32(v.s), at = u32_offsets(v.s)) with their taint.
Value cp_substr(const Value& v, const std::u32string& u, const std::vector<size_t>& at, size_t cb,
                size_t ce);

}  // namespace xds::jinja
