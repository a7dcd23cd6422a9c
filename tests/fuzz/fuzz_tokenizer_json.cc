// Fuzz target: tokenizer.json loading (tokenizer/tokenizer.h, Tokenizer::from_json_text, with
// the SAX reader of tokenizer_json.h). Input: the text of a tokenizer.json.
//
// Checked beyond "no crash, no hang, no exception": a tokenizer that loads encodes fixed
// texts to ids below vocab_size(), decodes them, and streams them to the same text
// (tokenizer_checks.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tok = xds::Tokenizer::from_json_text(text, /*config_json=*/"", "tokenizer.json");
  if (!tok.ok()) {
    XDS_CHECK(!tok.status().message().empty(), "an error without a message");
    return 0;
  }
  xds::fuzz::check_tokenizer(tok.value(), /*stream_equals_decode=*/true);
  return 0;
}
