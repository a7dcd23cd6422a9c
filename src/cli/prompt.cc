#include "cli/prompt.h"

#include <cstdio>
#include <optional>

#include "output/output_processor.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace xds::cli {

struct PromptCodec::Impl {
  std::optional<Tokenizer> tokenizer;
  std::optional<output::OutputProcessor> output;  // with a tokenizer
  int64_t emitted = 0;                            // ids written (the form without one)
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
    output::ChoiceSetup setup;
    setup.request_id = "generate";
    setup.options.detokenize = true;
    setup.tokenizer = &*codec.impl_->tokenizer;
    XDS_ASSIGN_OR_RETURN(output::OutputProcessor output, output::OutputProcessor::create(setup));
    codec.impl_->output.emplace(std::move(output));
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
    // As serve does by default: the message content is untrusted (special-token text in it is
    // plain text), so `generate --chat` gives the ids serve gives for the same message.
    const nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
    return encode_chat(*impl_->tokenizer, tmpl, messages, /*add_generation_prompt=*/true,
                       MessageTrust::kUntrusted);
  }
  // A plain --prompt is the operator's own text: special tokens in it are matched.
  return impl_->tokenizer->encode(text, /*add_special_tokens=*/true);
}

int64_t PromptCodec::valid_vocab(int64_t model_vocab) const {
  if (!impl_->tokenizer) return model_vocab;
  return std::min(model_vocab, impl_->tokenizer->vocab_size());
}

void PromptCodec::emit(const protocol::TokenDelta& delta) {
  if (impl_->output) {
    const output::OutputStep step = impl_->output->consume(delta);
    std::fwrite(step.delta.text.data(), 1, step.delta.text.size(), stdout);
  } else {
    for (const int32_t id : delta.tokens) {
      std::printf(impl_->emitted++ == 0 ? "%d" : ",%d", id);
    }
  }
  std::fflush(stdout);
}

void PromptCodec::finish() {
  if (impl_->output && !impl_->output->finished()) {
    protocol::TokenDelta end;
    end.finish_reason = "length";
    const output::OutputStep step = impl_->output->consume(end);
    std::fwrite(step.delta.text.data(), 1, step.delta.text.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace xds::cli
