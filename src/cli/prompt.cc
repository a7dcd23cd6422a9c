#include "cli/prompt.h"

#include <cstdio>
#include <optional>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace xds::cli {

struct PromptCodec::Impl {
  std::optional<Tokenizer> tokenizer;
  std::optional<IncrementalDetokenizer> stream;
  std::string chat_template_file;
  std::string model_dir;
};

PromptCodec::PromptCodec() : impl_(std::make_unique<Impl>()) {}
PromptCodec::PromptCodec(PromptCodec&&) noexcept = default;
PromptCodec& PromptCodec::operator=(PromptCodec&&) noexcept = default;
PromptCodec::~PromptCodec() = default;

Result<PromptCodec> PromptCodec::open(const std::string& model_dir,
                                      const std::string& chat_template_file) {
  PromptCodec codec;
  codec.impl_->model_dir = model_dir;
  codec.impl_->chat_template_file = chat_template_file;
  if (Tokenizer::has_tokenizer_files(model_dir)) {
    XDS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(model_dir));
    codec.impl_->tokenizer.emplace(std::move(tok));
    codec.impl_->stream.emplace(*codec.impl_->tokenizer);
  }
  return codec;
}

bool PromptCodec::has_tokenizer() const {
  return impl_->tokenizer.has_value();
}

Result<std::vector<int32_t>> PromptCodec::encode_prompt(const std::string& text, bool chat) const {
  if (!impl_->tokenizer) {
    return failed_precondition("{}: no tokenizer files (tokenizer.json): pass --prompt-ids",
                               impl_->model_dir);
  }
  if (chat) {
    XDS_ASSIGN_OR_RETURN(ChatTemplate tmpl,
                         ChatTemplate::load(impl_->model_dir, impl_->chat_template_file));
    const nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
    return encode_chat(*impl_->tokenizer, tmpl, messages, /*add_generation_prompt=*/true);
  }
  return impl_->tokenizer->encode(text, /*add_special_tokens=*/true);
}

int64_t PromptCodec::valid_vocab(int64_t model_vocab) const {
  if (!impl_->tokenizer) return model_vocab;
  return std::min(model_vocab, impl_->tokenizer->vocab_size());
}

void PromptCodec::emit(int32_t id, bool first) {
  if (impl_->stream) {
    const std::string text = impl_->stream->push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    std::printf(first ? "%d" : ",%d", id);
  }
  std::fflush(stdout);
}

void PromptCodec::finish() {
  if (impl_->stream) {
    const std::string text = impl_->stream->flush();
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace xds::cli
