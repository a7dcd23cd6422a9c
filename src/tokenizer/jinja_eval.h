// Tree-walking interpreter for the Jinja subset (jinja_ast.h).
// Thread-safety: render() keeps all state on its own stack; a Body may be rendered by many
// threads at once.
#pragma once

#include <string>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace xds::jinja {

// Renders `body` with `context` variables (plus the global functions): a string whose taint
// (jinja_value.h) marks the bytes that came from untrusted context values. Throws
// TemplateError with "line N: ..." on errors.
Value render(const Body& body, const Dict& context);

}  // namespace xds::jinja
