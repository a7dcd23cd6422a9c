// AST of the Jinja subset, and parse() from template source. The lexer applies Jinja's
// whitespace rules as transformers configures them (trim_blocks, lstrip_blocks, one trailing
// newline dropped) plus the {%- / -%} controls. Anything outside the subset fails with the
// template line and the construct ("line 7: unsupported tag 'include'").
//
// Parsing, evaluating and destroying the tree recurse once per level, so the parser refuses
// expressions taller than kMaxNesting ("((((1))))", "a.b.c...", "1+1+1...") and blocks nested
// deeper than that: a template can never exhaust the stack.
// Thread-safety: a parsed Template is immutable and may be rendered concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace xds::jinja {

// The most nested levels of an expression tree (its height) and of blocks in one another.
inline constexpr int kMaxNesting = 100;

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary, kCond,
    kList, kDict
  };
  Kind kind;
  int line = 0;
  Value literal;                 // kLiteral
  std::string name;              // kName, kAttr (attribute), kFilter/kTest (name), kUnary/kBinary (op)
  ExprPtr a, b, c;               // operands: object / left / cond; index / right / then; step / else
  std::vector<ExprPtr> args;     // kCall, kFilter, kTest args; kList items; kDict keys
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall/kFilter/kTest kwargs
  std::vector<ExprPtr> values;   // kDict values
  bool negated = false;          // kTest: "is not"
  int height = 1;                // nodes on the longest path down from here (<= kMaxNesting)
};

struct Stmt;
using Body = std::vector<std::shared_ptr<const Stmt>>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Kind kind;
  int line = 0;
  std::string text;                                  // kText
  ExprPtr expr;                                      // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;    // kIf: (condition, body); else has null cond
  std::vector<std::string> targets;                  // kFor loop vars; kSet/kSetBlock: name [, attr]
  ExprPtr filter;                                    // kFor "if" filter
  Body body, else_body;                              // kFor, kSetBlock, kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro parameters and defaults
};

// Throws TemplateError with "line N: ..." on syntax errors and unsupported constructs.
Body parse(const std::string& source);

}  // namespace xds::jinja
