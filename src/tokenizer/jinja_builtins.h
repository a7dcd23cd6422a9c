// Filters, tests, methods (str / dict / list) and global functions of the Jinja subset.
// Each throws TemplateError (without a line; the caller adds it) for unsupported names or
// wrong argument types.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace xds::jinja {

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

Value apply_filter(const std::string& name, const Value& v, Args& args, Kwargs& kwargs);
bool apply_test(const std::string& name, const Value& v, Args& args);
// obj.name: a key of a dict / namespace, or a bound method; undefined when neither.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: list / string index (negative from the end), dict key; undefined when missing.
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& lo, const Value& hi, const Value& step);
bool contains(const Value& container, const Value& item);
// Items a for loop visits: list elements, dict keys, string characters.
List iterate(const Value& v);
// namespace, range, dict, raise_exception, strftime_now.
void add_globals(Dict* globals);

}  // namespace xds::jinja
