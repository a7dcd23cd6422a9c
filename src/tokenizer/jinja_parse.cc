// Lexer and recursive-descent parser for the Jinja subset (see jinja_ast.h).
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "tokenizer/jinja_ast.h"

namespace xds::jinja {
namespace {

struct Token {
  enum class Kind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Kind kind;
  std::string text;
  int line;
};

[[noreturn]] void fail(int line, const std::string& msg) {
  throw TemplateError(fmt::format("line {}: {}", line, msg));
}

// An integer literal: Python's are unbounded, ours int64_t.
Value int_literal(const Token& tk) {
  int64_t v = 0;
  const char* end = tk.text.data() + tk.text.size();
  const auto [p, ec] = std::from_chars(tk.text.data(), end, v);
  if (ec != std::errc() || p != end)
    fail(tk.line, fmt::format("integer literal {} out of range", tk.text));
  return Value::integer(v);
}

// A float literal ("digits.digits"): beyond the double range it is inf, as in Python.
Value float_literal(const Token& tk) {
  return Value::number(std::strtod(tk.text.c_str(), nullptr));
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();  // keep_trailing_newline=False
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;
    while (pos < s_.size()) {
      size_t tag = pos;
      while (true) {
        tag = s_.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= s_.size()) {
          tag = std::string::npos;
          break;
        }
        const char c = s_[tag + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++tag;
      }
      const size_t text_end = tag == std::string::npos ? s_.size() : tag;
      std::string text = s_.substr(pos, text_end - pos);
      const int text_line = line_at(pos);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_ws(text[k])) ++k;
        text.erase(0, k);
        strip_next = false;
      }
      if (tag == std::string::npos) {
        if (!text.empty()) out_.push_back({Token::Kind::kText, text, text_line});
        break;
      }
      const char kind = s_[tag + 1];
      const char mod = tag + 2 < s_.size() ? s_[tag + 2] : 0;
      if (mod == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if ((kind == '%' || kind == '#') && mod != '+') {
        // lstrip_blocks: drop spaces/tabs between the line start and a block/comment tag.
        const size_t nl = text.rfind('\n');
        const size_t from = nl == std::string::npos ? 0 : nl + 1;
        const bool at_line_start = nl != std::string::npos || pos == 0 || s_[pos - 1] == '\n';
        if (at_line_start && text.find_first_not_of(" \t", from) == std::string::npos) text.erase(from);
      }
      if (!text.empty()) out_.push_back({Token::Kind::kText, text, text_line});
      size_t p = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      const int line = line_at(tag);
      if (kind == '#') {
        const size_t end = s_.find("#}", p);
        if (end == std::string::npos) fail(line, "unterminated comment");
        strip_next = end > 0 && s_[end - 1] == '-';
        pos = end + 2;
        if (!strip_next && pos < s_.size() && s_[pos] == '\n') ++pos;  // trim_blocks
        continue;
      }
      const bool var = kind == '{';
      out_.push_back({var ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", line});
      const char* close = var ? "}}" : "%}";
      while (true) {
        while (p < s_.size() && is_ws(s_[p])) ++p;
        if (p >= s_.size()) fail(line, var ? "unterminated '{{'" : "unterminated '{%'");
        if (s_[p] == '-' && s_.compare(p + 1, 2, close) == 0) {
          strip_next = true;
          p += 3;
          break;
        }
        if (s_.compare(p, 2, close) == 0) {
          p += 2;
          break;
        }
        p = lex_one(p);
      }
      out_.push_back({var ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", line_at(p - 1)});
      if (!var && !strip_next && p < s_.size() && s_[p] == '\n') ++p;  // trim_blocks
      pos = p;
    }
    out_.push_back({Token::Kind::kEof, "", line_at(s_.size())});
    return std::move(out_);
  }

 private:
  int line_at(size_t pos) {
    while (line_pos_ < pos && line_pos_ < s_.size()) {
      if (s_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  size_t lex_one(size_t p) {
    const int line = line_at(p);
    const char c = s_[p];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
      out_.push_back({Token::Kind::kName, s_.substr(p, e - p), line});
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = p;
      bool flt = false;
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
      if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
        flt = true;
        ++e;
        while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
      }
      std::string num = s_.substr(p, e - p);
      std::erase(num, '_');
      out_.push_back({flt ? Token::Kind::kFloat : Token::Kind::kInt, num, line});
      return e;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t e = p + 1;
      while (e < s_.size() && s_[e] != c) {
        if (s_[e] == '\\' && e + 1 < s_.size()) {
          const char n = s_[e + 1];
          switch (n) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            case '0': v += '\0'; break;
            default: v += '\\'; v += n; break;
          }
          e += 2;
        } else {
          v += s_[e++];
        }
      }
      if (e >= s_.size()) fail(line, "unterminated string literal");
      out_.push_back({Token::Kind::kString, v, line});
      return e + 1;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                 ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (const char* op : kOps) {
      if (s_.compare(p, std::strlen(op), op) == 0) {
        out_.push_back({Token::Kind::kOp, op, line});
        return p + std::strlen(op);
      }
    }
    fail(line, fmt::format("unexpected character '{}'", c));
  }

  std::string s_;
  std::vector<Token> out_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  // One level of recursive descent (a parenthesis, a "not", a block, ...): deeper than
  // kMaxNesting is an error while the stack is still shallow.
  class Nest {
   public:
    Nest(Parser* p, int line) : p_(p) {
      if (++p_->nesting_ > kMaxNesting) {
        --p_->nesting_;
        fail(line, fmt::format("nested deeper than {} levels", kMaxNesting));
      }
    }
    ~Nest() { --p_->nesting_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser* p_;
  };

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const {
    return peek(k).kind == Token::Kind::kOp && peek(k).text == op;
  }
  bool is_name(const char* n, size_t k = 0) const {
    return peek(k).kind == Token::Kind::kName && peek(k).text == n;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek().line, fmt::format("expected '{}', got '{}'", op, peek().text));
    ++i_;
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) fail(peek().line, fmt::format("expected a name, got '{}'", peek().text));
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != Token::Kind::kBlockEnd) {
      fail(peek().line, fmt::format("expected '%}}', got '{}'", peek().text));
    }
    ++i_;
  }

  // Parses statements until a block tag named in `ends`; stores the tag name in *end and
  // leaves the parser after that tag's name.
  Body parse_body(const std::set<std::string>& ends, std::string* end) {
    Body body;
    while (true) {
      const Token& tk = peek();
      if (tk.kind == Token::Kind::kEof) {
        if (!ends.empty()) fail(tk.line, fmt::format("unexpected end of template, expected '{}'", *ends.begin()));
        return body;
      }
      if (tk.kind == Token::Kind::kText) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = tk.line;
        s->text = tk.text;
        body.push_back(s);
        ++i_;
        continue;
      }
      if (tk.kind == Token::Kind::kVarBegin) {
        ++i_;
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tk.line;
        s->expr = parse_expr();
        if (peek().kind != Token::Kind::kVarEnd) fail(peek().line, fmt::format("expected '}}}}', got '{}'", peek().text));
        ++i_;
        body.push_back(s);
        continue;
      }
      if (tk.kind != Token::Kind::kBlockBegin) fail(tk.line, "unexpected token");
      ++i_;
      const int line = peek().line;
      const std::string tag = expect_name();
      if (ends.count(tag)) {
        *end = tag;
        return body;
      }
      body.push_back(parse_tag(tag, line));
    }
  }

  std::shared_ptr<Stmt> parse_tag(const std::string& tag, int line) {
    const Nest nest(this, line);
    auto s = std::make_shared<Stmt>();
    s->line = line;
    std::string end;
    if (tag == "if") {
      s->kind = Stmt::Kind::kIf;
      ExprPtr cond = parse_expr();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(cond, std::move(b));
        if (end == "elif") {
          cond = parse_expr();
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          Body eb = parse_body({"endif"}, &end);
          s->branches.emplace_back(nullptr, std::move(eb));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail(peek().line, "expected 'in' in for loop");
      ++i_;
      s->expr = parse_or();  // no conditional expression: "if" here is the loop filter
      if (is_name("if")) {
        ++i_;
        s->filter = parse_or();
      }
      if (is_name("recursive")) fail(line, "unsupported construct 'for ... recursive'");
      expect_block_end();
      s->body = parse_body({"else", "endfor"}, &end);
      expect_block_end();
      if (end == "else") {
        s->else_body = parse_body({"endfor"}, &end);
        expect_block_end();
      }
    } else if (tag == "set") {
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        ++i_;
        s->targets.push_back(expect_name());
      }
      if (is_op(",")) fail(line, "unsupported construct 'set' with tuple unpacking");
      if (is_op("=")) {
        ++i_;
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_expr();
        expect_block_end();
      } else {
        s->kind = Stmt::Kind::kSetBlock;
        expect_block_end();
        s->body = parse_body({"endset"}, &end);
        expect_block_end();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->targets.push_back(expect_name());
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++i_;
          def = parse_expr();
        }
        s->params.emplace_back(p, def);
        if (is_op(",")) ++i_;
        else if (!is_op(")")) fail(peek().line, "expected ',' or ')' in macro parameters");
      }
      ++i_;
      expect_block_end();
      s->body = parse_body({"endmacro"}, &end);
      if (peek().kind == Token::Kind::kName) ++i_;  // {% endmacro name %}
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' assistant-mask marker: renders its body unchanged.
      expect_block_end();
      s->kind = Stmt::Kind::kIf;
      auto yes = std::make_shared<Expr>();
      yes->kind = Expr::Kind::kLiteral;
      yes->literal = Value::boolean(true);
      s->branches.emplace_back(yes, parse_body({"endgeneration"}, &end));
      expect_block_end();
    } else {
      fail(line, fmt::format("unsupported tag '{}'", tag));
    }
    return s;
  }

  std::shared_ptr<Expr> node(Expr::Kind k, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  // A finished node: its height from its operands', at most kMaxNesting (chains such as
  // a.b.c... or 1+1+1... grow without recursion in the parser, but not in the interpreter).
  ExprPtr sealed(std::shared_ptr<Expr> e) {
    int h = 0;
    auto see = [&h](const ExprPtr& x) {
      if (x) h = std::max(h, x->height);
    };
    see(e->a);
    see(e->b);
    see(e->c);
    for (const auto& x : e->args) see(x);
    for (const auto& x : e->values) see(x);
    for (const auto& kv : e->kwargs) see(kv.second);
    e->height = h + 1;
    if (e->height > kMaxNesting) {
      fail(e->line, fmt::format("expression nested deeper than {} levels", kMaxNesting));
    }
    return e;
  }

  ExprPtr parse_expr() {
    const Nest nest(this, peek().line);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = node(Expr::Kind::kCond, peek().line);
      ++i_;
      c->b = e;
      c->a = parse_or();
      if (is_name("else")) {
        ++i_;
        c->c = parse_expr();
      }
      e = sealed(c);
    }
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = node(Expr::Kind::kBinary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return sealed(e);
  }
  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      e = binary("or", e, parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      e = binary("and", e, parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const Nest nest(this, peek().line);
      auto e = node(Expr::Kind::kUnary, next().line);
      e->name = "not";
      e->a = parse_not();
      return sealed(e);
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const int line = peek().line;
      if (peek().kind == Token::Kind::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        const std::string op = next().text;
        e = binary(op, e, parse_math1(), line);
      } else if (is_name("in")) {
        ++i_;
        e = binary("in", e, parse_math1(), line);
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        e = binary("not in", e, parse_math1(), line);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(op.text, e, parse_concat(), op.line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary("~", e, parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(op.text, e, parse_pow(), op.line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (is_op("**")) {
      const int line = next().line;
      e = binary("**", e, parse_unary(), line);
    }
    return e;
  }
  ExprPtr parse_unary() {
    if (is_op("-") || is_op("+")) {
      const Nest nest(this, peek().line);
      auto e = node(Expr::Kind::kUnary, peek().line);
      e->name = next().text;
      e->a = parse_unary_nofilter();
      return parse_filters(sealed(e));
    }
    return parse_filters(parse_postfix(parse_primary()));
  }
  ExprPtr parse_unary_nofilter() {
    if (is_op("-") || is_op("+")) {
      const Nest nest(this, peek().line);
      auto e = node(Expr::Kind::kUnary, peek().line);
      e->name = next().text;
      e->a = parse_unary_nofilter();
      return sealed(e);
    }
    return parse_postfix(parse_primary());
  }

  void parse_call_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
        std::string k = next().text;
        ++i_;
        e->kwargs.emplace_back(k, parse_expr());
      } else {
        e->args.push_back(parse_expr());
      }
      if (is_op(",")) ++i_;
      else if (!is_op(")")) fail(peek().line, fmt::format("expected ',' or ')', got '{}'", peek().text));
    }
    ++i_;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (is_op(".")) {
        ++i_;
        auto a = node(Expr::Kind::kAttr, line);
        a->a = e;
        if (peek().kind == Token::Kind::kInt) {
          a->kind = Expr::Kind::kItem;
          auto idx = node(Expr::Kind::kLiteral, line);
          idx->literal = int_literal(next());
          a->b = idx;
        } else {
          a->name = expect_name();
        }
        e = sealed(a);
      } else if (is_op("[")) {
        ++i_;
        ExprPtr lo, hi, step;
        bool slice = false;
        if (!is_op(":")) lo = parse_expr();
        if (is_op(":")) {
          slice = true;
          ++i_;
          if (!is_op(":") && !is_op("]")) hi = parse_expr();
          if (is_op(":")) {
            ++i_;
            if (!is_op("]")) step = parse_expr();
          }
        }
        expect_op("]");
        auto a = node(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        a->a = e;
        if (slice) {
          a->args = {lo, hi, step};
        } else {
          a->b = lo;
        }
        e = sealed(a);
      } else if (is_op("(")) {
        auto c = node(Expr::Kind::kCall, line);
        c->a = e;
        parse_call_args(c.get());
        e = sealed(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (is_op("|")) {
        ++i_;
        auto f = node(Expr::Kind::kFilter, line);
        f->name = expect_name();
        f->a = e;
        if (is_op("(")) parse_call_args(f.get());
        e = parse_postfix(sealed(f));
      } else if (is_name("is")) {
        ++i_;
        auto t = node(Expr::Kind::kTest, line);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = expect_name();
        t->a = e;
        if (is_op("(")) {
          parse_call_args(t.get());
        } else if (peek().kind == Token::Kind::kString || peek().kind == Token::Kind::kInt ||
                   peek().kind == Token::Kind::kFloat ||
                   (peek().kind == Token::Kind::kName && !is_name("and") && !is_name("or") &&
                    !is_name("if") && !is_name("else") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          t->args.push_back(parse_primary());
        }
        e = sealed(t);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& tk = next();
    auto lit = [&](Value v) {
      auto e = node(Expr::Kind::kLiteral, tk.line);
      e->literal = std::move(v);
      return e;
    };
    switch (tk.kind) {
      case Token::Kind::kString: {
        std::string s = tk.text;
        while (peek().kind == Token::Kind::kString) s += next().text;  // adjacent literals
        return lit(Value::string(s));
      }
      case Token::Kind::kInt: return lit(int_literal(tk));
      case Token::Kind::kFloat: return lit(float_literal(tk));
      case Token::Kind::kName: {
        if (tk.text == "true" || tk.text == "True") return lit(Value::boolean(true));
        if (tk.text == "false" || tk.text == "False") return lit(Value::boolean(false));
        if (tk.text == "none" || tk.text == "None") return lit(Value::none());
        auto e = node(Expr::Kind::kName, tk.line);
        e->name = tk.text;
        return e;
      }
      case Token::Kind::kOp:
        if (tk.text == "(") {
          if (is_op(")")) {
            ++i_;
            return node(Expr::Kind::kList, tk.line);  // empty tuple
          }
          ExprPtr e = parse_expr();
          if (is_op(",")) {  // tuple
            auto t = node(Expr::Kind::kList, tk.line);
            t->args.push_back(e);
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              t->args.push_back(parse_expr());
            }
            e = sealed(t);
          }
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          auto l = node(Expr::Kind::kList, tk.line);
          while (!is_op("]")) {
            l->args.push_back(parse_expr());
            if (is_op(",")) ++i_;
            else if (!is_op("]")) fail(peek().line, "expected ',' or ']' in list");
          }
          ++i_;
          return sealed(l);
        }
        if (tk.text == "{") {
          auto d = node(Expr::Kind::kDict, tk.line);
          while (!is_op("}")) {
            d->args.push_back(parse_expr());
            expect_op(":");
            d->values.push_back(parse_expr());
            if (is_op(",")) ++i_;
            else if (!is_op("}")) fail(peek().line, "expected ',' or '}' in dict");
          }
          ++i_;
          return sealed(d);
        }
        break;
      default: break;
    }
    fail(tk.line, fmt::format("unexpected '{}' in expression", tk.text.empty() ? "end of tag" : tk.text));
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int nesting_ = 0;  // Nest levels open
};

}  // namespace

Body parse(const std::string& source) {
  Lexer lx(source);
  Parser p(lx.run());
  return p.parse_template();
}

}  // namespace xds::jinja
