// How deeply JSON text nests, found without parsing it: a guard in front of the parsers of
// outside JSON (request bodies, checkpoint headers, tokenizer files). nlohmann's parser is
// iterative, but much of what consumes its result is not (dump(), copies, the chat template's
// values): a body of 4 million '[' would exhaust the stack there. Documents deeper than a
// limit are refused before they are parsed.
// Pure; thread-safe.
#pragma once

#include <string_view>

namespace xds {

// Nesting that every JSON document of this project stays well within (a tool's JSON schema
// in a request nests perhaps 20 levels; the files a few).
inline constexpr int kMaxJsonDepth = 128;

// Whether `text` opens more than `max_depth` arrays or objects inside one another. Brackets
// inside strings do not count. Exact for valid JSON; for invalid JSON an approximation (the
// parser rejects it anyway).
bool json_nesting_exceeds(std::string_view text, int max_depth);

}  // namespace xds
