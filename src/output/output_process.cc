#include "output/output_process.h"

#include <sys/prctl.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <zmq.hpp>

#include "base/log.h"
#include "base/process_name.h"
#include "output/output_processor.h"
#include "protocol/channel_security.h"
#include "protocol/messages.h"
#include "protocol/zmq_io.h"

namespace xds::output {
namespace {

using protocol::EngineRequest;
using protocol::Message;
using protocol::OutputDelta;
using protocol::RequestPhase;
using protocol::TokenDelta;

constexpr int kSendTimeoutMs = 2000;  // a gateway that stops reading loses its output, not us
constexpr int kLingerMs = 1000;       // delivery of queued deltas at shutdown
constexpr int kSendHwm = 100000;      // deltas queued per gateway before a send waits

struct RequestState {
  std::string reply_to;
  int32_t attempt = 0;  // EngineRequest::attempt, carried by every delta
  std::vector<OutputProcessor> choices;  // [n]
  int32_t finished = 0;
};

class OutputLoop {
 public:
  OutputLoop(const OutputProcessOptions& o, const Tokenizer* tok)
      : options_(o), tokenizer_(tok), in_(ctx_, zmq::socket_type::pull) {
    std::random_device rd;
    process_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  Status start() {
    XDS_ASSIGN_OR_RETURN(zap_, protocol::ZapGuard::start(ctx_));
    try {
      in_.set(zmq::sockopt::linger, 0);
      protocol::secure_binding(in_, options_.listen_address);
      in_.bind(options_.listen_address);
      if (!options_.cancel_address.empty()) {
        cancel_.emplace(ctx_, zmq::socket_type::push);
        cancel_->set(zmq::sockopt::linger, kLingerMs);
        cancel_->set(zmq::sockopt::sndtimeo, kSendTimeoutMs);
        protocol::secure_connecting(*cancel_);
        cancel_->connect(options_.cancel_address);
      }
    } catch (const zmq::error_t& e) {
      return unavailable("output process {}: cannot bind '{}' / connect '{}': {}", options_.group,
                         options_.listen_address, options_.cancel_address, e.what());
    }
    return {};
  }

  void run() {
    while (true) {
      Result<std::optional<Message>> got = protocol::recv_message(in_, /*dontwait=*/false);
      if (!got.ok()) {
        XDS_LOG_WARN("output process {}: {}", options_.group, got.status().to_string());
        continue;
      }
      if (!got->has_value()) continue;
      Message& m = **got;
      if (const auto* r = std::get_if<protocol::RequestMsg>(&m)) {
        add_request(r->request);
      } else if (const auto* t = std::get_if<protocol::TokensMsg>(&m)) {
        on_tokens(t->tokens);
      } else if (const auto* c = std::get_if<protocol::CancelMsg>(&m)) {
        requests_.erase(c->request_id);
      } else if (std::holds_alternative<protocol::ShutdownMsg>(m)) {
        return;
      } else {
        XDS_LOG_DEBUG("output process {}: ignored a {} message", options_.group,
                      protocol::kind_name(protocol::kind_of(m)));
      }
      flush();
    }
  }

 private:
  void add_request(const EngineRequest& r) {
    RequestState st;
    st.reply_to = r.reply_to;
    st.attempt = r.attempt;
    const int32_t n = std::max<int32_t>(1, r.sampling.n);
    Status error;
    for (int32_t i = 0; i < n && error.ok(); ++i) {
      ChoiceSetup s;
      s.request_id = r.id;
      s.index = i;
      s.options = r.output;
      s.tokenizer = tokenizer_;
      s.call_id_seed = process_seed_ ^ std::hash<std::string>()(r.id) ^
                       (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i + 1));
      Result<OutputProcessor> p = OutputProcessor::create(s);
      if (p.ok()) {
        st.choices.push_back(std::move(p).value());
      } else {
        error = p.status();
      }
    }
    if (!error.ok()) {
      XDS_LOG_WARN("output process {}: {}", options_.group, error.to_string());
      for (int32_t i = 0; i < n; ++i) {
        OutputDelta d;
        d.request_id = r.id;
        d.index = i;
        d.error = error.message();
        d.finish_reason = "abort";
        d.attempt = r.attempt;
        pending_[r.reply_to].push_back(std::move(d));
      }
      send_cancel(r.id);
      return;
    }
    // The decode phase of a disaggregated request: the prefill side's output process already
    // streamed the tokens generated so far; replaying them here (nothing sent) rebuilds the
    // same detokenizer offsets, held-back stop-string text and parser state.
    if (r.phase == RequestPhase::kDecode && !r.handoff.output.empty()) {
      TokenDelta replay;
      replay.request_id = r.id;
      replay.tokens = r.handoff.output;
      for (OutputProcessor& c : st.choices) (void)c.consume(replay);
    }
    // A request sent again after a fault (token recomputation): each choice replays what the
    // client already has, and a choice that had ended counts as finished.
    for (size_t i = 0; i < r.resume.size() && i < st.choices.size(); ++i) {
      if (i < r.resume_finished.size() && r.resume_finished[i] != 0) {
        ++st.finished;
        continue;
      }
      TokenDelta replay;
      replay.request_id = r.id;
      replay.index = static_cast<int32_t>(i);
      replay.tokens = r.resume[i];
      if (!replay.tokens.empty()) (void)st.choices[i].consume(replay);
    }
    requests_[r.id] = std::move(st);
  }

  void on_tokens(const std::vector<TokenDelta>& deltas) {
    for (const TokenDelta& d : deltas) {
      auto it = requests_.find(d.request_id);
      if (it == requests_.end()) continue;  // cancelled or finished here: late tokens
      RequestState& st = it->second;
      if (d.index < 0 || d.index >= static_cast<int32_t>(st.choices.size())) {
        XDS_LOG_WARN("output process {}: request '{}' has no choice {}", options_.group,
                     d.request_id, d.index);
        continue;
      }
      OutputStep step = st.choices[d.index].consume(d);
      if (!d.handoff.link.empty() && !step.finished) {
        // The prefill phase ends here: its text goes out with the handoff, and the decode
        // side's output process (which replays these tokens) takes the request over.
        step.delta.request_id = d.request_id;
        step.delta.index = d.index;
        step.delta.handoff = d.handoff;
        step.delta.attempt = st.attempt;
        pending_[st.reply_to].push_back(std::move(step.delta));
        requests_.erase(it);
        continue;
      }
      if (!step.emit) continue;
      step.delta.attempt = st.attempt;
      if (step.finished) ++st.finished;
      // A stop string ended this choice while the device still runs it: stop that choice
      // now (the others of an n > 1 request go on).
      if (step.cancel_on_device) send_cancel(d.request_id, d.index);
      pending_[st.reply_to].push_back(std::move(step.delta));
      if (st.finished == static_cast<int32_t>(st.choices.size())) requests_.erase(it);
    }
  }

  // Cancels `index` of the request on the device (-1: every choice).
  void send_cancel(const std::string& request_id, int32_t index = -1) {
    if (!cancel_) return;
    Status s = protocol::send_message(*cancel_, protocol::CancelMsg{request_id, index});
    if (!s.ok())
      XDS_LOG_WARN("output process {}: cancel '{}': {}", options_.group, request_id, s.to_string());
  }

  zmq::socket_t* reply_socket(const std::string& address) {
    auto it = replies_.find(address);
    if (it != replies_.end()) return it->second.get();
    auto sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::push);
    try {
      sock->set(zmq::sockopt::linger, kLingerMs);
      sock->set(zmq::sockopt::sndtimeo, kSendTimeoutMs);
      sock->set(zmq::sockopt::sndhwm, kSendHwm);
      protocol::secure_connecting(*sock);
      sock->connect(address);
    } catch (const zmq::error_t& e) {
      XDS_LOG_WARN("output process {}: cannot connect to reply_to '{}': {}", options_.group,
                   address, e.what());
      return nullptr;
    }
    return replies_.emplace(address, std::move(sock)).first->second.get();
  }

  // Sends what the last message produced, one kOutput per gateway.
  void flush() {
    for (auto& [address, outputs] : pending_) {
      if (outputs.empty()) continue;
      zmq::socket_t* sock = reply_socket(address);
      if (sock != nullptr) {
        Status s = protocol::send_message(*sock, protocol::OutputMsg{std::move(outputs)});
        if (!s.ok()) {
          XDS_LOG_WARN("output process {}: to '{}': {}", options_.group, address, s.to_string());
        }
      }
      outputs.clear();
    }
  }

  const OutputProcessOptions& options_;
  const Tokenizer* tokenizer_;
  uint64_t process_seed_ = 0;
  zmq::context_t ctx_{1};
  std::unique_ptr<protocol::ZapGuard> zap_;  // before the sockets: destroyed after them
  zmq::socket_t in_;
  std::optional<zmq::socket_t> cancel_;
  std::map<std::string, std::unique_ptr<zmq::socket_t>> replies_;  // by reply_to
  std::map<std::string, RequestState> requests_;                   // by request id
  std::map<std::string, std::vector<OutputDelta>> pending_;        // by reply_to
};

}  // namespace

int run_output_process(const OutputProcessOptions& options) {
  // "xds-out<group>" (or "xds-<instance>-out<group>") in ps and /proc/PID/comm.
  set_process_name(process_name("out", options.instance, options.group));
  std::optional<Tokenizer> tokenizer;
  if (!options.model_dir.empty() && Tokenizer::has_tokenizer_files(options.model_dir)) {
    Result<Tokenizer> t = Tokenizer::load(options.model_dir);
    if (!t.ok()) {
      XDS_LOG_ERROR("output process {}: {}", options.group, t.status().to_string());
      return 1;
    }
    tokenizer.emplace(std::move(t).value());
  }
  OutputLoop loop(options, tokenizer ? &*tokenizer : nullptr);
  if (Status s = loop.start(); !s.ok()) {
    XDS_LOG_ERROR("{}", s.to_string());
    return 1;
  }
  loop.run();
  return 0;
}

}  // namespace xds::output
