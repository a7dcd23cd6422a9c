// PromptCodec: text in and out for the CLI commands. With tokenizer files in the model
// directory, prompts are encoded (through the chat template with --chat) and generated
// ids are streamed as text by the output process's per-choice code (output::OutputProcessor:
// the detokenizer and the stop rules, so the text is what serve streams for the same ids);
// without them, ids are printed comma-separated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "protocol/payloads.h"

namespace xds::cli {

class PromptCodec {
 public:
  static Result<PromptCodec> open(const std::string& model_dir,
                                  const std::string& chat_template_file);
  PromptCodec(PromptCodec&&) noexcept;
  PromptCodec& operator=(PromptCodec&&) noexcept;
  ~PromptCodec();

  bool has_tokenizer() const;
  Result<std::vector<int32_t>> encode_prompt(const std::string& text, bool chat) const;
  // Ids at or beyond this never win sampling: the tokenizer's vocabulary (or the model's).
  int64_t valid_vocab(int64_t model_vocab) const;
  // Streams a step's generated ids to stdout (text, or the "id,id" form). A delta whose
  // finish_reason is "stop" ends with the stop token, whose text is not written (as serve).
  void emit(const protocol::TokenDelta& delta);
  // Ends the output: what the detokenizer held back, then a newline.
  void finish();

 private:
  PromptCodec();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xds::cli
