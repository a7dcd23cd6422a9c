#include "output/detokenizer.h"

namespace xds::output {

Detokenizer::Detokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), stream_(tok, skip_special_tokens) {}

std::string Detokenizer::append(std::span<const int32_t> ids) {
  std::string out;
  for (const int32_t id : ids) out += stream_.push(id);
  return out;
}

std::string Detokenizer::append_one(int32_t id) {
  return stream_.push(id);
}

std::string Detokenizer::finish() {
  return stream_.flush();
}

std::string Detokenizer::token_text(int32_t id) const {
  const int32_t one[1] = {id};
  return tok_->decode(one, /*skip_special_tokens=*/false);
}

}  // namespace xds::output
