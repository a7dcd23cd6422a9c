#include "loadgen/runner.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/clock.h"

namespace xds::loadgen {
namespace {

using json = nlohmann::json;

double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

std::string_view prefix_of(std::string_view s, size_t n) {
  return s.substr(0, std::min(n, s.size()));
}

bool non_empty_string(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

// The message of an OpenAI-style error body, or the start of the body.
std::string error_message(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      return e["message"].get<std::string>();
    }
    if (e.is_string()) return e.get<std::string>();
  }
  return std::string(prefix_of(body, 200));
}

// Shared by the caller's thread and the client's io thread.
struct RunState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestRecord> finished;  // guarded by mu
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<int64_t> events{0};
  int64_t t0_ns = 0;
  double seconds(int64_t ns) const { return static_cast<double>(ns - t0_ns) * 1e-9; }
};

// Per request, on the io thread only.
struct Pending {
  RequestRecord record;
  bool saw_done = false;
  int64_t event_tokens = 0;
  std::optional<int64_t> usage_completion;
  std::optional<int64_t> usage_prompt;
};

class Runner {
 public:
  Runner(const WorkloadSpec& w, const RunnerOptions& o, HttpClient& client)
      : w_(w), o_(o), client_(client) {}

  RunState& state() { return st_; }

  void send(const RequestSpec& spec) {
    auto p = std::make_shared<Pending>();
    p->record.index = spec.index;
    p->record.class_id = spec.class_id;
    p->record.prompt_tokens = spec.input_len;
    p->record.send_s = st_.seconds(now_ns());
    ClientRequest req;
    req.path = o_.endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
    req.body = request_body(spec, o_);
    req.api_key = o_.api_key;
    client_.start(
        std::move(req), [this, p](const SseEvent& e) { on_event(*p, e); },
        [this, p](HttpExchange ex) { on_done(*p, std::move(ex)); });
  }

  // Called after each request ends (io thread), before it is counted as done.
  std::function<void()> on_request_end;

 private:
  void on_event(Pending& p, const SseEvent& e) {
    st_.events.fetch_add(1, std::memory_order_relaxed);
    if (p.saw_done) return;
    auto info = parse_chunk(e.data, o_.endpoint);
    if (!info.ok()) {
      if (p.record.error.empty()) p.record.error = info.status().message();
      return;
    }
    if (info->done) {
      p.saw_done = true;
      return;
    }
    if (!info->error.empty() && p.record.error.empty()) p.record.error = info->error;
    if (info->tokens > 0) {
      append_token_event(p.record, st_.seconds(e.time_ns), info->tokens);
      p.event_tokens += info->tokens;
      st_.tokens.fetch_add(info->tokens, std::memory_order_relaxed);
    }
    if (info->completion_tokens) p.usage_completion = info->completion_tokens;
    if (info->prompt_tokens) p.usage_prompt = info->prompt_tokens;
  }

  void on_done(Pending& p, HttpExchange ex) {
    RequestRecord& r = p.record;
    r.end_s = st_.seconds(ex.end_ns);
    if (!ex.error.ok()) {
      r.error = ex.error.to_string();
    } else if (ex.status != 200) {
      r.error = fmt::format("HTTP {}: {}", ex.status, error_message(ex.body));
    } else if (!ex.event_stream) {
      r.error = fmt::format("HTTP 200 without an event stream: {}", prefix_of(ex.body, 200));
    } else if (r.error.empty() && !p.saw_done) {
      r.error = "the stream ended without data: [DONE]";
    }
    r.ok = r.error.empty();
    r.completion_tokens = p.usage_completion.value_or(p.event_tokens);
    if (p.usage_prompt) r.prompt_tokens = *p.usage_prompt;
    if (!r.ok) st_.errors.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(st_.mu);
      st_.finished.push_back(std::move(r));
    }
    if (on_request_end) on_request_end();
    st_.done.fetch_add(1, std::memory_order_relaxed);
    st_.cv.notify_all();
  }

  const WorkloadSpec& w_;
  const RunnerOptions& o_;
  HttpClient& client_;
  RunState st_;
};

// The progress line: "\r" updates on a terminal, a line every 10 s otherwise.
class Progress {
 public:
  Progress(const RunnerOptions& o, RunState& st, int64_t total)
      : enabled_(o.progress),
        tty_(isatty(STDERR_FILENO) == 1),
        label_(o.label),
        st_(st),
        total_(total) {}

  void tick(bool force = false) {
    if (!enabled_) return;
    const int64_t now = now_ns();
    const int64_t every = tty_ ? 1'000'000'000LL : 10'000'000'000LL;
    if (!force && now - last_ns_ < every) return;
    last_ns_ = now;
    const double el = std::max(st_.seconds(now), 1e-9);
    const int64_t done = st_.done.load(), errors = st_.errors.load(), tokens = st_.tokens.load();
    const std::string total = total_ > 0 ? std::to_string(total_) : "?";
    std::fprintf(stderr, "%s%s%sdone %lld/%s  %.2f req/s  %.1f tok/s  errors %lld  %.0f s%s",
                 tty_ ? "\r" : "", label_.c_str(), label_.empty() ? "" : "  ",
                 static_cast<long long>(done), total.c_str(), static_cast<double>(done) / el,
                 static_cast<double>(tokens) / el, static_cast<long long>(errors), el,
                 tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  void end() {
    if (!enabled_) return;
    tick(true);
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  bool enabled_, tty_;
  std::string label_;
  RunState& st_;
  int64_t total_;
  int64_t last_ns_ = 0;
};

}  // namespace

std::string request_body(const RequestSpec& request, const RunnerOptions& options) {
  json j;
  j["model"] = options.model;
  if (options.endpoint == Endpoint::kChat) {
    j["messages"] = json::array({json{{"role", "user"}, {"content", request.prompt_text}}});
  } else if (!request.prompt_ids.empty()) {
    j["prompt"] = request.prompt_ids;
  } else {
    j["prompt"] = request.prompt_text;
  }
  j["max_tokens"] = request.output_len;
  j["stream"] = true;
  j["stream_options"] = json{{"include_usage", true}};
  if (options.temperature) j["temperature"] = *options.temperature;
  if (options.ignore_eos) j["ignore_eos"] = true;
  return j.dump();
}

Result<ChunkInfo> parse_chunk(std::string_view data, Endpoint endpoint) {
  ChunkInfo info;
  if (data == "[DONE]") {
    info.done = true;
    return info;
  }
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object()) {
    return data_loss("a stream event is not a JSON object: '{}'", prefix_of(data, 120));
  }
  if (const auto e = j.find("error"); e != j.end() && !e->is_null()) {
    info.error = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                     ? (*e)["message"].get<std::string>()
                     : e->dump();
  }
  if (const auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const json& choice = (*c)[0];
    if (choice.is_object()) {
      const auto ids = choice.find("token_ids");
      if (ids != choice.end() && ids->is_array()) {
        info.tokens = static_cast<int32_t>(ids->size());
      } else if (endpoint == Endpoint::kCompletions) {
        info.tokens = non_empty_string(choice, "text") ? 1 : 0;
      } else if (const auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        const bool tool = d->contains("tool_calls") && (*d)["tool_calls"].is_array() &&
                          !(*d)["tool_calls"].empty();
        info.tokens =
            non_empty_string(*d, "content") || non_empty_string(*d, "reasoning_content") || tool
                ? 1
                : 0;
      }
    }
  }
  if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer()) {
      info.prompt_tokens = (*u)["prompt_tokens"].get<int64_t>();
    }
    if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer()) {
      info.completion_tokens = (*u)["completion_tokens"].get<int64_t>();
    }
  }
  return info;
}

Result<RunResult> run_workload(const WorkloadSpec& workload, const RunnerOptions& options) {
  XDS_RETURN_IF_ERROR(validate_workload(workload));
  if (options.endpoint == Endpoint::kChat && workload.prompt.token_ids) {
    return invalid_argument("the chat endpoint takes text prompts; drop --token-ids");
  }
  if (options.max_in_flight < 1) {
    return invalid_argument("max_in_flight must be >= 1, got {}", options.max_in_flight);
  }
  const bool closed = workload.classes.front().arrival == ArrivalKind::kClosedLoop;
  std::vector<Arrival> arrivals;
  if (!closed) {
    XDS_ASSIGN_OR_RETURN(arrivals, open_loop_arrivals(workload));
  }
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client,
                       HttpClient::create(options.url, options.http));
  Runner runner(workload, options, *client);
  RunState& st = runner.state();
  const int64_t total = closed ? workload.num_requests : static_cast<int64_t>(arrivals.size());
  Progress progress(options, st, total);
  const double cpu0 = process_cpu_s();
  const double io_cpu0 = client->io_thread_cpu_s();
  st.t0_ns = now_ns();
  const double deadline_s = workload.duration_s > 0 ? workload.duration_s : 1e300;
  RunResult result;
  int64_t sent = 0;

  if (closed) {
    // The next request is sent from the io thread when one ends (before that one counts as
    // done), so done == sent means nothing is in flight and nothing more will be sent.
    std::mutex send_mu;
    const auto send_next = [&] {  // with send_mu held
      const bool more = (workload.num_requests == 0 || sent < workload.num_requests) &&
                        st.seconds(now_ns()) < deadline_s;
      if (more) runner.send(make_request(workload, 0, sent++, 0.0));
    };
    runner.on_request_end = [&] {
      std::lock_guard<std::mutex> lock(send_mu);
      send_next();
    };
    {
      std::lock_guard<std::mutex> lock(send_mu);
      for (int64_t i = 0; i < workload.concurrency; ++i) send_next();
    }
    while (true) {
      {
        std::lock_guard<std::mutex> lock(send_mu);
        if (st.done.load() == sent) break;
      }
      {
        std::unique_lock<std::mutex> lock(st.mu);
        st.cv.wait_for(lock, std::chrono::milliseconds(200));
      }
      progress.tick();
    }
    runner.on_request_end = nullptr;
  } else {
    for (const Arrival& a : arrivals) {
      const int64_t due = st.t0_ns + static_cast<int64_t>(a.time_s * 1e9);
      std::unique_lock<std::mutex> lock(st.mu);
      while (now_ns() < due) {
        st.cv.wait_for(lock,
                       std::chrono::nanoseconds(std::min<int64_t>(due - now_ns(), 200'000'000)));
        lock.unlock();
        progress.tick();
        lock.lock();
      }
      bool delayed = false;
      while (client->in_flight() >= options.max_in_flight) {
        delayed = true;
        st.cv.wait_for(lock, std::chrono::milliseconds(200));
      }
      lock.unlock();
      result.delayed_arrivals += delayed;
      result.max_send_lag_s = std::max(result.max_send_lag_s, st.seconds(now_ns()) - a.time_s);
      runner.send(make_request(workload, a.class_id, sent++, a.time_s));
      progress.tick();
    }
    std::unique_lock<std::mutex> lock(st.mu);
    while (st.done.load() < sent) {
      st.cv.wait_for(lock, std::chrono::milliseconds(200));
      lock.unlock();
      progress.tick();
      lock.lock();
    }
  }
  progress.end();

  result.client_cpu_s = client->io_thread_cpu_s() - io_cpu0;
  result.process_cpu_s = process_cpu_s() - cpu0;
  result.events = st.events.load();
  client.reset();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    result.records = std::move(st.finished);
  }
  std::sort(result.records.begin(), result.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  double first = 1e300, last = 0;
  for (const RequestRecord& r : result.records) {
    first = std::min(first, r.send_s);
    last = std::max(last, r.end_s);
  }
  result.duration_s = result.records.empty() ? 0 : std::max(last - first, 0.0);
  return result;
}

Result<std::string> get_body(const Url& url, const std::string& path, const std::string& api_key) {
  HttpClientOptions o;
  o.idle_timeout = std::chrono::milliseconds(30'000);
  XDS_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::create(url, o));
  ClientRequest req;
  req.method = "GET";
  req.path = path;
  req.api_key = api_key;
  const HttpExchange ex = client->fetch(req);
  if (!ex.error.ok()) return ex.error.with_context("GET " + path);
  if (ex.status != 200) {
    return unavailable("GET {}: HTTP {}: {}", path, ex.status, error_message(ex.body));
  }
  return ex.body;
}

Result<std::string> first_model(const Url& url, const std::string& api_key) {
  XDS_ASSIGN_OR_RETURN(const std::string body, get_body(url, "/v1/models", api_key));
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return data_loss("GET /v1/models: no data[0].id in '{}'", prefix_of(body, 200));
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace xds::loadgen
