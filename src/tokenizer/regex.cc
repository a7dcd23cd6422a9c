#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace xds {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {
std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

Result<Regex> Regex::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (code == nullptr) {
    return invalid_argument("regex '{}': {} at offset {}", pattern, pcre2_message(err), off);
  }
  Regex r;
  r.pattern_ = std::string(pattern);
  auto c = std::make_shared<Code>();
  c->code = code;
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  r.code_ = std::move(c);
  return r;
}

Result<std::vector<std::pair<size_t, size_t>>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  // Long runs (1 MB of spaces) need more than the default 32 KiB JIT stack for lookaheads.
  pcre2_jit_stack* js = code_->jit ? pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)
                                   : nullptr;
  if (js != nullptr) pcre2_jit_stack_assign(mc, nullptr, js);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  Status st;
  while (start <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      st = internal_error("regex '{}': match failed at byte {}: {}", pattern_, start,
                          pcre2_message(rc));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: skip one character.
      if (b >= text.size()) break;
      size_t n = 1;
      while (b + n < text.size() && (static_cast<uint8_t>(text[b + n]) & 0xC0) == 0x80) ++n;
      start = b + n;
    }
  }
  if (js != nullptr) pcre2_jit_stack_free(js);
  pcre2_match_context_free(mc);
  pcre2_match_data_free(md);
  if (!st.ok()) return st;
  return out;
}

}  // namespace xds
