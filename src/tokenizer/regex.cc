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

RegexScratch::RegexScratch()
    : match_data_(pcre2_match_data_create(1, nullptr)), match_context_(pcre2_match_context_create(nullptr)) {}

RegexScratch::~RegexScratch() {
  if (jit_stack_ != nullptr) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

Result<std::vector<std::pair<size_t, size_t>>> Regex::find_all(std::string_view text) const {
  RegexScratch scratch;
  std::vector<std::pair<size_t, size_t>> out;
  XDS_RETURN_IF_ERROR(find_all(text, &scratch, &out));
  return out;
}

Status Regex::find_all(std::string_view text, RegexScratch* scratch,
                       std::vector<std::pair<size_t, size_t>>* out) const {
  auto* md = static_cast<pcre2_match_data*>(scratch->match_data_);
  auto* mc = static_cast<pcre2_match_context*>(scratch->match_context_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && scratch->jit_stack_ == nullptr && code_->jit) {
      // Long runs (1 MB of spaces) can need more than the default 32 KiB JIT stack.
      auto* js = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
      if (js == nullptr) return resource_exhausted("regex '{}': cannot allocate a JIT stack", pattern_);
      scratch->jit_stack_ = js;
      pcre2_jit_stack_assign(mc, nullptr, js);
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, mc);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return internal_error("regex '{}': match failed at byte {}: {}", pattern_, start, pcre2_message(rc));
    }
    // rc == 0: ovector too small for the capture groups; the whole match is still set.
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      start = e;
    } else {
      // Empty match: skip one character.
      if (b >= text.size()) break;
      size_t n = 1;
      while (b + n < text.size() && (static_cast<uint8_t>(text[b + n]) & 0xC0) == 0x80) ++n;
      start = b + n;
    }
  }
  return {};
}

}  // namespace xds
