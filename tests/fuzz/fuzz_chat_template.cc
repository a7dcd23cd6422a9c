// Fuzz target: the Jinja chat-template parser and interpreter (tokenizer/chat_template.h,
// jinja_*). Input: a template's source.
//
// Checked beyond "no crash, no hang, no exception": a template that parses renders the fixed
// small conversation of tokenizer_checks.h (bos/eos as context) or fails with a Status, and
// a rendered prompt's untrusted ranges are well formed.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = xds::ChatTemplate::from_string(source, "fuzz.jinja");
  if (!tmpl.ok()) {
    XDS_CHECK(!tmpl.status().message().empty(), "an error without a message");
    return 0;
  }
  const nlohmann::ordered_json context = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  xds::fuzz::check_template(tmpl.value().with_context(context));
  return 0;
}
