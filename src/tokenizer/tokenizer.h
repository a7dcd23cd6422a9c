// Tokenizer: Hugging Face tokenizer.json + tokenizer_config.json, as published for
// DeepSeek-V3/R1, Qwen3 and the project's own models (byte-level BPE); or tiktoken.model +
// tokenizer_config.json as Kimi K2 publishes them (the same steps below, with Kimi's split
// pattern, tiktoken's merge-by-rank and Kimi's 258 special ids: tiktoken_model.h).
//
// encode(text):
//   1. reject ill-formed UTF-8 (error names the byte offset; utf8::replace_invalid() gives the
//      lossy form that Python/JS would have received);
//   2. split out added tokens whose "normalized" is false (leftmost-longest, lstrip/rstrip);
//   3. per remaining piece: normalizer, then added tokens whose "normalized" is true;
//   4. pre-tokenizer (Split regexes via PCRE2, ByteLevel) into words; BPE on each word;
//   5. with add_special_tokens, the post-processor: tokenizer_config.json's add_bos_token /
//      add_eos_token when present (as transformers' LlamaTokenizerFast does), otherwise
//      tokenizer.json's post_processor (TemplateProcessing, Roberta/Bert, ByteLevel, Sequence).
// decode(ids): tokens to bytes (byte-level alphabet undone, <0xXX> byte fallback, added tokens
//   verbatim, skipped when special and skip_special_tokens), then ill-formed UTF-8 replaced by
//   U+FFFD per maximal subpart (as Rust's from_utf8_lossy and JS TextDecoder do), then
//   clean_up_tokenization_spaces when tokenizer_config.json asks for it.
//
// Thread-safety: a Tokenizer is immutable after load() and cheap to copy (shared state);
// encode/decode may run concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/prompt_text.h"

namespace xds {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json (or, when there is none, model_dir/tiktoken.model) and (if
  // present) model_dir/tokenizer_config.json.
  static Result<Tokenizer> load(const std::string& model_dir);
  // From in-memory JSON texts; `config_json` may be empty. `name` prefixes error messages.
  static Result<Tokenizer> from_json_text(std::string_view tokenizer_json,
                                          std::string_view config_json,
                                          const std::string& name = "tokenizer.json");
  // From a tiktoken.model text (Kimi K2's published format: tiktoken_model.h) with Kimi K2's
  // split pattern and special tokens (named by `config_json`'s added_tokens_decoder).
  static Result<Tokenizer> from_tiktoken_text(std::string_view tiktoken_model,
                                              std::string_view config_json,
                                              const std::string& name = "tiktoken.model");
  // Whether model_dir has tokenizer.json or tiktoken.model.
  static bool has_tokenizer_files(const std::string& model_dir);

  // add_special_tokens: apply the post-processor (BOS as configured). All of `text` is trusted:
  // added and special tokens are matched everywhere in it.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens) const;
  // The same with added / special tokens matched only in the trusted bytes of `text`: the
  // untrusted bytes go through the normalizer, pre-tokenizer and BPE as ordinary text, together
  // with their trusted neighbours up to the next matched token (so text without any token text
  // in its untrusted bytes encodes exactly as encode(text.text) does). With a normalizer and
  // added tokens marked "normalized", a piece holding untrusted bytes matches none of those.
  Result<std::vector<int32_t>> encode(const PromptText& text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // Number of ids the tokenizer can produce (vocabulary and added tokens): max id + 1.
  int64_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // tokenizer_config.json's bos_token / eos_token text ("" when none).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  // Whether add_special_tokens prepends the BOS id.
  bool adds_bos() const;
  bool is_special(int32_t id) const;
  // The token text as written in tokenizer.json (byte-level form), or nullopt.
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;

  // Bytes that token `id` contributes to decoded text ("" for unknown ids, and for special ids
  // when skip_special_tokens). Used by IncrementalDetokenizer.
  std::string_view token_bytes(int32_t id, bool skip_special_tokens) const;
  // Number of leading `decode_strip_char()` bytes the decoder strips from the whole output
  // (Strip / Metaspace decoders; 0 for byte-level).
  int decode_strip_leading() const;
  char decode_strip_char() const;

  struct Impl;

 private:
  Result<std::vector<int32_t>> encode_impl(std::string_view text, const TaintRanges& untrusted,
                                           bool add_special_tokens) const;
  std::shared_ptr<const Impl> impl_;
};

// One per stream. push() one id at a time; returns the newly complete text, never half a UTF-8
// character: bytes of a character split across tokens (byte-level or <0xXX> byte-fallback) are
// held back until it is complete, and a sequence that can no longer become valid is emitted as
// U+FFFD exactly as decode() would. The concatenation of all push() results and flush() equals
// decode(all ids) (without clean_up_tokenization_spaces, which a stream cannot apply).
// Thread-safety: not thread-safe; one owner. Keeps a reference to `tok`, which must outlive it.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = true);
  std::string push(int32_t id);
  // Emits whatever is held back (an incomplete final character becomes U+FFFD) and resets.
  std::string flush();

 private:
  std::string take(bool final);
  const Tokenizer* tok_;
  bool skip_special_;
  int strip_left_;       // leading strip chars still to remove
  std::string pending_;  // bytes not emitted yet
};

}  // namespace xds
