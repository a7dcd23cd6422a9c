// Tree-walking interpreter for the Jinja subset (jinja_ast.h).
// Thread-safety: render() keeps all state on its own stack; a Body may be rendered by many
// threads at once.
#pragma once

#include <string>

#include "tokenizer/jinja_ast.h"

namespace xds::jinja {

// Renders `body` with `context` variables (plus the global functions). Throws TemplateError
// with "line N: ..." on errors.
std::string render(const Body& body, const Dict& context);

}  // namespace xds::jinja
