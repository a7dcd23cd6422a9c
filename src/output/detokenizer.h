// Incremental detokenization of one choice's output (the output process, P056).
//
// append(ids) returns the text that the new ids complete; it never returns half a UTF-8
// character: bytes of a character split across byte-level BPE tokens are held back until the
// character is complete (an ill-formed run becomes U+FFFD exactly as Tokenizer::decode would
// write it). The concatenation of every append() and finish() equals
// Tokenizer::decode(all ids, skip_special_tokens) for tokenizers without
// clean_up_tokenization_spaces (the published DeepSeek-V3, Qwen3 and the shipped model).
// Added tokens are written verbatim; special ones are dropped with skip_special_tokens.
//
// Thread-safety: not thread-safe; one owner (the output process's loop). Keeps a pointer to
// the Tokenizer, which must outlive the Detokenizer (it is immutable, so several Detokenizers
// may share it).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace xds::output {

class Detokenizer {
 public:
  Detokenizer(const Tokenizer& tok, bool skip_special_tokens);

  // Appends ids (in output order); returns the newly complete text (valid UTF-8).
  std::string append(std::span<const int32_t> ids);
  std::string append_one(int32_t id);
  // End of the choice: returns whatever is held back (an incomplete character becomes
  // U+FFFD). Further appends start a fresh stream.
  std::string finish();

  // The text of one token on its own, for logprobs: added and special tokens verbatim (also
  // under skip_special_tokens), a token holding part of a character gives U+FFFD for it.
  std::string token_text(int32_t id) const;

 private:
  const Tokenizer* tok_;
  IncrementalDetokenizer stream_;
};

}  // namespace xds::output
