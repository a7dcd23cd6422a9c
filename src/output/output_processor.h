// One choice's output, token ids in, text out (the output process's per-request state, P056).
//
// consume(TokenDelta) runs each new token through
//   Detokenizer -> StopMatcher -> ReasoningParser (--reasoning-parser) -> ToolParser
//   (--tool-call-parser, only when the request carried tools)
// and returns an OutputDelta with only what is ready: text held back (half a character, a
// partial stop string, a split <think> tag, a tool call not yet closed) is released by a
// later delta, at the latest by the one that finishes the choice.
//
// Conventions with the device (the DP group):
// - A TokenDelta whose finish_reason is "stop" ends with the eos / stop token that ended the
//   choice: the id is reported (token_ids, usage) but its text is not (OpenAI and vLLM
//   behaviour; it matters when skip_special_tokens is off or the stop token is not special).
// - The device does not know stop strings: when one matches, the choice finishes here with
//   "stop", tokens after the one that completed the match are dropped, and the step says
//   `cancel_on_device` (the caller tells the DP group to stop generating for it). Deltas that
//   arrive after the finish are ignored (emit == false).
// - finish_reason "stop" becomes "tool_calls" when at least one call was parsed ("length"
//   and "abort" stay as they are: the client must see a truncated output).
// - detokenize == false (a model without a tokenizer): token ids, logprobs and usage only;
//   stop strings and parsers are not applied.
//
// Thread-safety: not thread-safe; one owner. Keeps the Tokenizer pointer, which must outlive
// the processor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"
#include "output/detokenizer.h"
#include "output/reasoning_parser.h"
#include "protocol/payloads.h"
#include "output/stop_matcher.h"
#include "output/tool_parser.h"
#include "tokenizer/tokenizer.h"

namespace xds::output {

struct ChoiceSetup {
  std::string request_id;
  int32_t index = 0;  // choice index (n > 1)
  protocol::OutputOptions options;
  const Tokenizer* tokenizer = nullptr;  // null: the model has no tokenizer (ids only)
  uint64_t call_id_seed = 0;             // keys the tool-call ids (see tool_parser.h)
};

struct OutputStep {
  protocol::OutputDelta delta;
  bool emit = false;              // the delta carries something (always, until finished)
  bool finished = false;          // this delta finishes the choice
  bool cancel_on_device = false;  // a stop string finished it; the device is still running it
};

class OutputProcessor {
 public:
  // Fails (InvalidArgument / FailedPrecondition naming the request) on an unknown parser name
  // or detokenize without a tokenizer.
  static Result<OutputProcessor> create(const ChoiceSetup& setup);

  OutputStep consume(const protocol::TokenDelta& in);
  bool finished() const { return finished_; }
  int32_t completion_tokens() const { return completion_tokens_; }

 private:
  explicit OutputProcessor(const ChoiceSetup& setup);
  // Runs released text through the parsers into `out` (finishing: flush them).
  void route(std::string_view text, bool finishing, protocol::OutputDelta* out);

  std::string request_id_;
  int32_t index_ = 0;
  bool detokenize_ = false;
  const Tokenizer* tokenizer_ = nullptr;
  std::optional<Detokenizer> detok_;
  StopMatcher stop_;
  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolParser> tools_;
  bool finished_ = false;
  int32_t completion_tokens_ = 0;
  int32_t prompt_tokens_ = 0;
  int32_t cached_tokens_ = 0;
};

}  // namespace xds::output
