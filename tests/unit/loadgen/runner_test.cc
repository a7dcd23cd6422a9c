// The runner against a scripted OpenAI-style server (fake_server.h): what it sends, how it
// counts tokens per event, usage, errors, the closed loop's concurrency and the open loop.
#include "loadgen/runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include <nlohmann/json.hpp>

#include "fake_server.h"

namespace xds::loadgen {
namespace {

using json = nlohmann::json;
using testing::FakeRequest;
using testing::FakeServer;
using testing::http_chunk;
using testing::send_all;
using testing::sse_head;

LengthDist fixed(int64_t n) {
  LengthDist d;
  d.lo = d.hi = n;
  return d;
}

TEST(ParseChunk, TokensPerEventUsageAndErrors) {
  auto ids = parse_chunk(R"({"choices":[{"index":0,"text":"","token_ids":[5,6,7]}]})",
                         Endpoint::kCompletions);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->tokens, 3);
  auto text = parse_chunk(R"({"choices":[{"text":" hi"}]})", Endpoint::kCompletions);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->tokens, 1);
  auto empty =
      parse_chunk(R"({"choices":[{"text":"","finish_reason":"length"}]})", Endpoint::kCompletions);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->tokens, 0);
  auto chat = parse_chunk(R"({"choices":[{"delta":{"content":"x"}}]})", Endpoint::kChat);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->tokens, 1);
  auto think = parse_chunk(R"({"choices":[{"delta":{"reasoning_content":"y"}}]})", Endpoint::kChat);
  ASSERT_TRUE(think.ok());
  EXPECT_EQ(think->tokens, 1);
  auto role =
      parse_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})", Endpoint::kChat);
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(role->tokens, 0);
  auto usage = parse_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34}})",
                           Endpoint::kCompletions);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->tokens, 0);
  EXPECT_EQ(usage->prompt_tokens, 12);
  EXPECT_EQ(usage->completion_tokens, 34);
  auto err =
      parse_chunk(R"({"error":{"message":"out of blocks","type":"x"}})", Endpoint::kCompletions);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->error, "out of blocks");
  auto done = parse_chunk("[DONE]", Endpoint::kChat);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
  EXPECT_FALSE(parse_chunk("{not json", Endpoint::kCompletions).ok());
  EXPECT_FALSE(parse_chunk("[1,2]", Endpoint::kCompletions).ok());
}

TEST(RequestBody, CompletionsWithTokenIds) {
  RequestSpec r;
  r.prompt_ids = {3, 4, 5};
  r.input_len = 3;
  r.output_len = 9;
  RunnerOptions o;
  o.model = "m";
  o.ignore_eos = true;
  o.temperature = 0.0;
  const json j = json::parse(request_body(r, o));
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["prompt"], json::array({3, 4, 5}));
  EXPECT_EQ(j["max_tokens"], 9);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["temperature"], 0.0);
  o.endpoint = Endpoint::kChat;
  o.ignore_eos = false;
  o.temperature.reset();
  r.prompt_ids.clear();
  r.prompt_text = "hello there";
  const json c = json::parse(request_body(r, o));
  EXPECT_EQ(c["messages"][0]["role"], "user");
  EXPECT_EQ(c["messages"][0]["content"], "hello there");
  EXPECT_FALSE(c.contains("prompt"));
  EXPECT_FALSE(c.contains("ignore_eos"));
  EXPECT_FALSE(c.contains("temperature"));
}

// A scripted completions server: answers max_tokens tokens, two per event when `pairs`, then
// a usage chunk and [DONE]. Records the bodies and the most requests it held at once.
struct ScriptedOpenAi {
  bool pairs = false;
  bool usage = true;
  int fail_max_tokens = -1;  // answer 400 to requests with this max_tokens
  std::mutex mu;
  std::vector<json> bodies;
  std::atomic<int> open{0};
  std::atomic<int> max_open{0};

  void handle(const FakeRequest& req, int fd) {
    const int now_open = ++open;
    int prev = max_open.load();
    while (now_open > prev && !max_open.compare_exchange_weak(prev, now_open)) {
    }
    const json body = json::parse(req.body, nullptr, false);
    {
      std::lock_guard<std::mutex> lock(mu);
      bodies.push_back(body);
    }
    const int n = body.value("max_tokens", 0);
    if (n == fail_max_tokens) {
      const std::string err = R"({"error":{"message":"max_tokens is cursed","type":"bad"}})";
      --open;
      send_all(fd,
               "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(err.size()) + "\r\n\r\n" + err);
      return;
    }
    std::string out = sse_head();
    int id = 100;
    for (int sent = 0; sent < n;) {
      const int k = pairs && n - sent >= 2 ? 2 : 1;
      json ids = json::array();
      for (int i = 0; i < k; ++i) ids.push_back(id++);
      out += http_chunk(
          "data: " +
          json{{"choices", json::array({json{{"text", ""}, {"token_ids", ids}}})}}.dump() + "\n\n");
      sent += k;
    }
    if (usage) {
      const int prompt = static_cast<int>(body["prompt"].size());
      out += http_chunk("data: " +
                        json{{"choices", json::array()},
                             {"usage", {{"prompt_tokens", prompt}, {"completion_tokens", n}}}}
                            .dump() +
                        "\n\n");
    }
    out += http_chunk("data: [DONE]\n\n") + "0\r\n\r\n";
    // Hold the stream open a moment so that concurrent requests overlap at the server.
    // Counted as closed before the last byte goes: the client cannot start its next request
    // before it has read this one's end.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    --open;
    send_all(fd, out);
  }
};

RunnerOptions options_for(uint16_t port) {
  RunnerOptions o;
  o.url.host = "127.0.0.1";
  o.url.port = port;
  o.model = "bench";
  o.ignore_eos = true;
  o.temperature = 0.0;
  o.progress = false;
  return o;
}

TEST(Runner, ClosedLoopKeepsConcurrencyAndCountsTokens) {
  ScriptedOpenAi script;
  script.pairs = true;
  FakeServer server([&](const FakeRequest& r, int fd) { script.handle(r, fd); });
  WorkloadSpec w;
  RequestClass c;
  c.input = fixed(6);
  auto out = parse_length_dist("3-5", "out");
  ASSERT_TRUE(out.ok());
  c.output = *out;
  w.classes = {c};
  w.concurrency = 3;
  w.num_requests = 11;
  w.seed = 4;
  w.prompt.id_lo = 10;
  w.prompt.id_hi = 20;
  auto res = run_workload(w, options_for(server.port()));
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  ASSERT_EQ(res->records.size(), 11u);
  EXPECT_LE(script.max_open.load(), 3);
  for (size_t i = 0; i < res->records.size(); ++i) {
    const RequestRecord& r = res->records[i];
    EXPECT_EQ(r.index, static_cast<int64_t>(i));
    EXPECT_TRUE(r.ok) << r.error;
    const RequestSpec spec = make_request(w, 0, r.index, 0);
    EXPECT_EQ(r.completion_tokens, spec.output_len);
    EXPECT_EQ(r.prompt_tokens, 6);
    // Two tokens per chunk (the last alone when the count is odd); chunks that arrived in
    // one read are one event, so there are at most that many events, at distinct times.
    EXPECT_GE(r.event_s.size(), 1u);
    EXPECT_LE(r.event_s.size(), static_cast<size_t>((spec.output_len + 1) / 2));
    ASSERT_EQ(r.event_tokens.size(), r.event_s.size());
    for (size_t e = 1; e < r.event_s.size(); ++e) EXPECT_LT(r.event_s[e - 1], r.event_s[e]);
    int64_t sum = 0;
    for (int32_t k : r.event_tokens) sum += k;
    EXPECT_EQ(sum, spec.output_len);
    EXPECT_LE(r.send_s, r.event_s.front());
    EXPECT_LE(r.event_s.back(), r.end_s);
  }
  std::lock_guard<std::mutex> lock(script.mu);
  ASSERT_EQ(script.bodies.size(), 11u);
  for (const json& b : script.bodies) {
    EXPECT_EQ(b["model"], "bench");
    EXPECT_EQ(b["prompt"].size(), 6u);
    for (const json& id : b["prompt"]) {
      EXPECT_GE(id.get<int>(), 10);
      EXPECT_LT(id.get<int>(), 20);
    }
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["stream"], true);
  }
  EXPECT_GT(res->events, 0);
}

TEST(Runner, OpenLoopSendsEveryArrivalAndRecordsFailures) {
  ScriptedOpenAi script;
  script.usage = false;  // completion tokens from the events
  script.fail_max_tokens = 2;
  FakeServer server([&](const FakeRequest& r, int fd) { script.handle(r, fd); });
  WorkloadSpec w;
  RequestClass c;
  c.arrival = ArrivalKind::kPoisson;
  c.rate = 500;  // a few ms apart: the test stays quick
  c.input = fixed(4);
  auto out = parse_length_dist("2:1/4:1", "out");
  ASSERT_TRUE(out.ok());
  c.output = *out;
  w.classes = {c};
  w.num_requests = 16;
  w.seed = 11;
  auto res = run_workload(w, options_for(server.port()));
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  ASSERT_EQ(res->records.size(), 16u);
  int failed = 0, twos = 0;
  for (const RequestRecord& r : res->records) {
    const RequestSpec spec = make_request(w, 0, r.index, 0);
    twos += spec.output_len == 2;
    if (spec.output_len == 2) {
      EXPECT_FALSE(r.ok);
      EXPECT_NE(r.error.find("HTTP 400: max_tokens is cursed"), std::string::npos) << r.error;
      ++failed;
    } else {
      EXPECT_TRUE(r.ok) << r.error;
      EXPECT_EQ(r.completion_tokens, 4);
      EXPECT_EQ(r.prompt_tokens, 4);  // no usage: the tokens sent
    }
  }
  EXPECT_EQ(failed, twos);
  EXPECT_GT(twos, 0);  // the seed draws both lengths
  EXPECT_LT(twos, 16);
  const RunSummary s = summarize_run(res->records, res->duration_s);
  EXPECT_EQ(s.failed, failed);
  EXPECT_EQ(s.completed, 16 - failed);
}

TEST(Runner, StreamWithoutDoneIsAnError) {
  FakeServer server([](const FakeRequest&, int fd) {
    send_all(fd, sse_head() +
                     http_chunk(R"(data: {"choices":[{"text":"a"}]})"
                                "\n\n") +
                     "0\r\n\r\n");
  });
  WorkloadSpec w;
  RequestClass c;
  c.input = fixed(2);
  c.output = fixed(2);
  w.classes = {c};
  w.num_requests = 1;
  auto res = run_workload(w, options_for(server.port()));
  ASSERT_TRUE(res.ok());
  ASSERT_EQ(res->records.size(), 1u);
  EXPECT_FALSE(res->records[0].ok);
  EXPECT_NE(res->records[0].error.find("[DONE]"), std::string::npos);
}

TEST(Runner, RefusesChatWithTokenIds) {
  WorkloadSpec w;
  RequestClass c;
  c.input = fixed(2);
  c.output = fixed(2);
  w.classes = {c};
  w.num_requests = 1;
  RunnerOptions o = options_for(1);
  o.endpoint = Endpoint::kChat;
  EXPECT_EQ(run_workload(w, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(Runner, FirstModelReadsTheModelList) {
  FakeServer server([](const FakeRequest& req, int fd) {
    const std::string body =
        req.target == "/v1/models"
            ? R"({"object":"list","data":[{"id":"bench-2.6b","object":"model"}]})"
            : "{}";
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  Url url;
  url.host = "127.0.0.1";
  url.port = server.port();
  auto m = first_model(url, "");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(*m, "bench-2.6b");
}

}  // namespace
}  // namespace xds::loadgen
