// Tree-walking interpreter for the Jinja subset (jinja_ast.h).
// Thread-safety: render() keeps all state on its own stack; a Body may be rendered by many
// threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace xds::jinja {

// Bounds on one render, so that no template, however wrong, exhausts the stack, the memory or
// the CPU: a render that would pass one fails with a TemplateError naming it.
//   max_depth:        expressions, blocks and macro calls evaluating inside one another;
//   max_steps:        work, counted as statements and expressions evaluated, loop iterations
//                     (16 each), and the items and bytes (per 64) of the values built, copied
//                     or scanned;
//   max_string_bytes: the rendered text and any one string;
//   max_list_items:   any one list.
// The defaults are far beyond what chat templates use (a few thousand steps per message).
struct RenderLimits {
  int max_depth = 256;
  int64_t max_steps = 20'000'000;
  size_t max_string_bytes = size_t{16} << 20;
  size_t max_list_items = size_t{1} << 20;
};

// Renders `body` with `context` variables (plus the global functions): a string whose taint
// (jinja_value.h) marks the bytes that came from untrusted context values. Throws
// TemplateError with "line N: ..." on errors.
Value render(const Body& body, const Dict& context, const RenderLimits& limits = {});

}  // namespace xds::jinja
