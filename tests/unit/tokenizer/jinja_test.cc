// Jinja subset: each expected string is derived by hand from Jinja2's documented semantics
// (as transformers configures it: trim_blocks, lstrip_blocks, Python values).
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace xds {
namespace {

std::string render(const std::string& src, const nlohmann::ordered_json& extra = nullptr) {
  auto t = ChatTemplate::from_string(src, "test");
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  auto r = t->render_ordered(nlohmann::ordered_json::array(), false, nullptr, extra);
  return r.ok() ? *r : "RENDER ERROR: " + r.status().message();
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("x\n  {% if true %}\n  y\n  {% endif %}\nz"), "x\n  y\nz");  // lstrip + trim
  EXPECT_EQ(render("a {{- ' b ' -}} c"), "a b c");
  EXPECT_EQ(render("a\n{# comment #}\nb\n"), "a\nb");  // trailing newline dropped
}

TEST(Jinja, LoopsAndScopes) {
  EXPECT_EQ(render("{% for x in ['a','b','c'] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
            "1a,2b,3c");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{% endfor %}"),
            "02True11False");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "3");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "012");
  EXPECT_EQ(render("{% for i in range(4) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"), "023");
  EXPECT_EQ(render("{% for i in [] %}x{% else %}empty{% endfor %}{% for i in range(6) if i % 2 == 0 %}{{ i }}{% endfor %}"),
            "empty024");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}"), "531");
  EXPECT_EQ(render("{% set ns = namespace(ids=[]) %}{% set _ = ns.ids.append(1) %}{% set _ = ns.ids.append(2) %}"
                   "{{ ns.ids.pop(0) }}{{ ns.ids }}"),
            "1[2]");
}

TEST(Jinja, ValuesPrintLikePython) {
  EXPECT_EQ(render("{{ true }} {{ none }} {{ 1.5 }} {{ 2.0 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }}"),
            "True None 1.5 2.0 3 -4 3.5 2");
  EXPECT_EQ(render("{{ ['a', 1, none] }} {{ {'k': 'v'} }}"), "['a', 1, None] {'k': 'v'}");
  EXPECT_EQ(render("{{ undefined_thing }}|"), "|");
}

TEST(Jinja, FiltersAndMethods) {
  EXPECT_EQ(render("{{ '  hi  ' | trim }}|{{ [1,2,3] | length }}|{{ none | default('d') }}|{{ nope | default('u') }}"),
            "hi|3|None|u");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 'x', true, none]} | tojson }}"), R"({"b": 1, "a": [1, "x", true, null]})");
  EXPECT_EQ(render("{{ {'a': [1, 2]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ 'é\"\n' | tojson }}"), "\"é\\\"\\n\"");
  EXPECT_EQ(render("{{ 'a,b'.split(',') }} {{ 'a  b '.split() }}"), "['a', 'b'] ['a', 'b']");
  EXPECT_EQ(render("{{ 'Hello'.startswith('He') }} {{ 'x</think>\\ny'.split('</think>')[-1].lstrip('\\n') }} {{ 'abc'.upper() }}"),
            "True y ABC");
  EXPECT_EQ(render("{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'xxhixx'.rstrip('x') }}"), "x|xxhi");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | join(',') }} {{ ['a', 'b'] | first }}{{ ['a', 'b'] | last }} {{ 'ab' | upper }}"),
            "1,2,3 ab AB");
  EXPECT_EQ(render("{{ [{'r': 'u'}, {'r': 's'}] | selectattr('r', 'equalto', 's') | list | length }}"), "1");
  EXPECT_EQ(render("{{ [{'r': 'u'}, {'r': 's'}] | map(attribute='r') | join('') }}"), "us");
  EXPECT_EQ(render("{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b', 'z') }} {{ {'a': 1}.get('b') }}"), "1 z None");
  EXPECT_EQ(render("{{ 'hello'[1:3] }}{{ [1,2,3][-1] }}{{ 'héllo'[::-1] }}{{ [1,2,3,4][::2] }}{{ 'héllo' | length }}"),
            "el3olléh[1, 3]5");
  EXPECT_EQ(render("{{ 'a\\nb' | indent(2) }}|{{ 'a' ~ 1 ~ none }}"), "a\n  b|a1None");
}

TEST(Jinja, TestsAndOperators) {
  EXPECT_EQ(render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ 3 is not string }} {{ 4 is divisibleby(2) }}"),
            "False True True True True");
  EXPECT_EQ(render("{{ 'a' in 'cat' }} {{ 2 not in [1,3] }} {{ 'y' if false else 'n' }} {{ 'k' in {'k': 1} }}"),
            "True True n True");
  EXPECT_EQ(render("{{ not x is defined }} {{ 1 < 2 and 2 < 3 }} {{ 0 or 'z' }} {{ 1 == 1.0 }}"), "True True z True");
  EXPECT_EQ(render("{{ [1] + [2] }} {{ 'ab' * 2 }} {{ 2 ** 10 }} {{ -(3) }}"), "[1, 2] abab 1024 -3");
}

TEST(Jinja, MacrosAndContext) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(render("{% set g = 'top' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}"), "top");
  EXPECT_EQ(render("{% set x %}in {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[in 2]");
  EXPECT_EQ(render("{{ bos_token }}{{ messages | length }}", {{"bos_token", "<s>"}}), "<s>0");
}

TEST(Jinja, ErrorsNameLineAndConstruct) {
  EXPECT_NE(render("line1\n{% include 'x' %}").find("line 2: unsupported tag 'include'"), std::string::npos)
      << render("line1\n{% include 'x' %}");
  EXPECT_NE(render("a\nb\n{{ x | xmlattr }}").find("line 3: unsupported filter 'xmlattr'"), std::string::npos);
  EXPECT_NE(render("{{ x is frobnicated }}").find("unsupported test 'frobnicated'"), std::string::npos);
  EXPECT_NE(render("{{ foo.bar }}").find("'foo' is undefined"), std::string::npos);
  EXPECT_NE(render("{{ raise_exception('bad role') }}").find("raise_exception: bad role"), std::string::npos);
  EXPECT_NE(render("{% if x %}").find("unexpected end of template"), std::string::npos);
  EXPECT_NE(render("{{ 'a' + 1 }}").find("unsupported operand types for +: 'str' and 'int'"), std::string::npos);
  EXPECT_NE(render("{% for x in y recursive %}{% endfor %}").find("recursive"), std::string::npos);
  EXPECT_NE(render("{{ '%s' % 1 }}").find("string formatting"), std::string::npos);
  EXPECT_NE(render("{% set x = 1 %}{% set x.y = 2 %}").find("namespace"), std::string::npos);
}

}  // namespace
}  // namespace xds
