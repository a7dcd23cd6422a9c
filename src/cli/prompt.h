// PromptCodec: text in and out for the CLI commands. With tokenizer files in the model
// directory, prompts are encoded (through the chat template with --chat) and generated
// ids are streamed as text; without them, ids are printed comma-separated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

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
  // Streams one generated id to stdout (text or "id," form).
  void emit(int32_t id, bool first);
  void finish();

 private:
  PromptCodec();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xds::cli
