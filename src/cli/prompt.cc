#include "cli/prompt.h"

#include <cstdio>

namespace xds::cli {

struct PromptCodec::Impl {};

PromptCodec::PromptCodec() : impl_(std::make_unique<Impl>()) {}
PromptCodec::PromptCodec(PromptCodec&&) noexcept = default;
PromptCodec& PromptCodec::operator=(PromptCodec&&) noexcept = default;
PromptCodec::~PromptCodec() = default;

Result<PromptCodec> PromptCodec::open(const std::string& model_dir, const std::string& chat_template_file) {
  return PromptCodec();
}

bool PromptCodec::has_tokenizer() const { return false; }

Result<std::vector<int32_t>> PromptCodec::encode_prompt(const std::string& text, bool chat) const {
  return failed_precondition("the model directory has no tokenizer files: pass --prompt-ids");
}

int64_t PromptCodec::valid_vocab(int64_t model_vocab) const { return model_vocab; }

void PromptCodec::emit(int32_t id, bool first) {
  std::printf(first ? "%d" : ",%d", id);
  std::fflush(stdout);
}

void PromptCodec::finish() {
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace xds::cli
