#include "output/output_processor.h"

#include <utility>

namespace xds::output {

using protocol::OutputDelta;
using protocol::OutputOptions;
using protocol::TokenDelta;
using protocol::ToolCall;

Result<OutputProcessor> OutputProcessor::create(const ChoiceSetup& setup) {
  const OutputOptions& o = setup.options;
  if (o.detokenize && setup.tokenizer == nullptr) {
    return failed_precondition(
        "request '{}': the model has no tokenizer, so its output cannot be detokenized "
        "(token ids only)",
        setup.request_id);
  }
  OutputProcessor p(setup);
  if (!o.detokenize) return p;
  if (!o.reasoning_parser.empty()) {
    XDS_ASSIGN_OR_RETURN(ReasoningParser r,
                         ReasoningParser::create(o.reasoning_parser, o.prompt_in_reasoning));
    p.reasoning_.emplace(std::move(r));
  }
  if (!o.tool_call_parser.empty() && o.tools_requested) {
    XDS_ASSIGN_OR_RETURN(ToolParser t, ToolParser::create(o.tool_call_parser, setup.call_id_seed));
    p.tools_.emplace(std::move(t));
  }
  return p;
}

OutputProcessor::OutputProcessor(const ChoiceSetup& setup)
    : request_id_(setup.request_id),
      index_(setup.index),
      detokenize_(setup.options.detokenize),
      tokenizer_(setup.tokenizer),
      stop_(setup.options.detokenize ? setup.options.stop : std::vector<std::string>{}) {
  if (detokenize_) detok_.emplace(*tokenizer_, setup.options.skip_special_tokens);
}

void OutputProcessor::route(std::string_view text, bool finishing, OutputDelta* out) {
  std::string content;
  if (reasoning_) {
    ReasoningSplit r = reasoning_->push(text);
    out->reasoning = std::move(r.reasoning);
    content = std::move(r.content);
    if (finishing) {
      ReasoningSplit tail = reasoning_->finish();
      out->reasoning += tail.reasoning;
      content += tail.content;
    }
  } else {
    content.assign(text);
  }
  if (tools_) {
    ToolSplit t = tools_->push(content);
    out->text = std::move(t.content);
    out->tool_calls = std::move(t.calls);
    if (finishing) {
      ToolSplit tail = tools_->finish();
      out->text += tail.content;
      for (ToolCall& c : tail.calls) out->tool_calls.push_back(std::move(c));
    }
  } else {
    out->text = std::move(content);
  }
}

OutputStep OutputProcessor::consume(const TokenDelta& in) {
  OutputStep step;
  if (finished_) return step;
  OutputDelta& d = step.delta;
  d.request_id = request_id_;
  d.index = index_;
  if (in.prompt_tokens > 0) prompt_tokens_ = in.prompt_tokens;
  if (in.cached_tokens > 0) cached_tokens_ = in.cached_tokens;

  const size_t n = in.tokens.size();
  const bool with_logprobs = in.logprobs.size() == n && n > 0;
  const bool device_stop = in.finish_reason == "stop";
  bool stop_hit = false;
  std::string ready;  // text past the stop matcher
  for (size_t i = 0; i < n && !stop_hit; ++i) {
    const int32_t id = in.tokens[i];
    d.token_ids.push_back(id);
    ++completion_tokens_;
    if (with_logprobs) {
      d.logprobs.push_back(in.logprobs[i]);
      if (detokenize_) d.token_texts.push_back(detok_->token_text(id));
    }
    if (!detokenize_ || (device_stop && i + 1 == n)) continue;  // the stop token has no text
    StopPush s = stop_.push(detok_->append_one(id));
    ready += s.text;
    stop_hit = s.stopped;
  }
  const bool finishing = stop_hit || !in.finish_reason.empty();
  if (finishing && detokenize_ && !stop_hit) {
    StopPush s = stop_.push(detok_->finish());
    ready += s.text;
    stop_hit = s.stopped;
    if (!stop_hit) ready += stop_.finish();
  }
  if (detokenize_) route(ready, finishing, &d);

  if (finishing) {
    finished_ = true;
    step.finished = true;
    if (stop_hit) {
      d.finish_reason = "stop";
      step.cancel_on_device = in.finish_reason.empty();
    } else {
      d.finish_reason = in.finish_reason;
    }
    if (d.finish_reason == "stop" && tools_ && tools_->num_calls() > 0) {
      d.finish_reason = "tool_calls";
    }
  }
  d.prompt_tokens = prompt_tokens_;
  d.cached_tokens = cached_tokens_;
  d.completion_tokens = completion_tokens_;
  step.emit = true;
  return step;
}

}  // namespace xds::output
