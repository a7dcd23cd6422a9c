// `xdeepserve bench`: the benchmark client for an OpenAI-compatible server (src/loadgen/).
//
// Three modes:
//   - a run: closed loop (--concurrency C) or Poisson arrivals (--request-rate R), or a mix of
//     request classes (--mix, workload.h's syntax); prints a table, writes --json;
//   - a rate sweep (--sweep-rates with --goodput-ttft-ms / --goodput-tpot-ms): one Poisson run
//     per rate, then the goodput: the highest rate at which >= --goodput-fraction of the
//     requests meet both limits (and, beside it, the highest rate whose TTFT P99 and TPOT P99
//     are within them);
//   - --peak-decode --streams B: fixed lengths, ignore_eos, greedy; all B requests are sent at
//     once and decode tokens/s is measured over the window in which all B streams decode
//     (from the last stream's first token to the first stream's last token), per device
//     (--devices N) and as TPOT.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "base/read_file.h"
#include "cli/commands.h"
#include "loadgen/report.h"
#include "loadgen/server_metrics.h"
#include "loadgen/runner.h"

namespace xds::cli {
namespace {

using json = nlohmann::json;
using namespace xds::loadgen;

struct BenchArgs {
  std::string url;
  std::string model;
  std::string endpoint = "completions";
  int64_t concurrency = 1;
  double request_rate = 0;
  int64_t num_requests = 0;
  double duration_s = 0;
  int64_t input_len = 128;
  std::string input_len_dist;
  int64_t output_len = 128;
  std::string output_len_dist;
  std::string mix;
  std::string token_ids;
  std::string prompts_file;
  uint64_t seed = 0;
  bool ignore_eos = false;
  double temperature = 0;
  std::string api_key;
  std::string json_path;
  double goodput_ttft_ms = 0;
  double goodput_tpot_ms = 0;
  double goodput_fraction = 0.9;
  std::string sweep_rates;
  bool peak_decode = false;
  int64_t streams = 0;
  int64_t devices = 1;
  double request_timeout_s = 600;
  int64_t max_in_flight = 4096;
  bool no_progress = false;
  // Which options were given (set by the callback from CLI11's counts).
  bool rate_given = false, goodput_given = false;
};

std::string trim_brackets(std::string s) {
  while (!s.empty() && (s.front() == '(' || s.front() == '[' || s.front() == ' ')) s.erase(0, 1);
  while (!s.empty() && (s.back() == ')' || s.back() == ']' || s.back() == ' ')) s.pop_back();
  return s;
}

// "LO,HI", "(LO,HI)" or "LO:HI": token ids in [LO, HI).
Status parse_id_range(const std::string& text, PromptSpec& prompt) {
  const std::string s = trim_brackets(text);
  const size_t sep = s.find_first_of(",:");
  long long lo = -1, hi = -1;
  size_t used_lo = 0, used_hi = 0;
  try {
    if (sep == std::string::npos) throw std::invalid_argument(s);
    const std::string a = s.substr(0, sep), b = s.substr(sep + 1);
    lo = std::stoll(a, &used_lo);
    hi = std::stoll(b, &used_hi);
    if (used_lo != a.size() || used_hi != b.size()) throw std::invalid_argument(s);
  } catch (const std::exception&) {
    return invalid_argument("--token-ids '{}' is not LO,HI", text);
  }
  if (lo < 0 || hi <= lo || hi > INT32_MAX) {
    return invalid_argument("--token-ids '{}': need 0 <= LO < HI <= {}", text, INT32_MAX);
  }
  prompt.token_ids = true;
  prompt.id_lo = static_cast<int32_t>(lo);
  prompt.id_hi = static_cast<int32_t>(hi);
  return {};
}

Result<std::vector<double>> parse_rates(const std::string& text) {
  std::vector<double> rates;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(v > 0) || !std::isfinite(v)) {
      return invalid_argument("--sweep-rates: '{}' is not a rate > 0", item);
    }
    rates.push_back(v);
  }
  if (rates.empty()) return invalid_argument("--sweep-rates: no rate in '{}'", text);
  return rates;
}

Result<LengthDist> lengths(int64_t fixed, const std::string& dist, const char* dist_flag) {
  if (!dist.empty()) return parse_length_dist(dist, dist_flag);
  LengthDist d;
  d.lo = d.hi = fixed;
  return d;
}

// --prompts FILE: one prompt per non-empty line.
Result<std::vector<std::string>> read_prompts(const std::string& path) {
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  std::vector<std::string> prompts;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(std::move(line));
    pos = end + 1;
  }
  if (prompts.empty()) return invalid_argument("--prompts {}: no prompt (one per line)", path);
  return prompts;
}

// The workload of a run; `rate` > 0 makes it Poisson (the sweep), else --request-rate,
// --mix or the closed loop decide.
Result<WorkloadSpec> build_workload(const BenchArgs& a, double rate) {
  WorkloadSpec w;
  w.num_requests = a.num_requests;
  w.duration_s = a.duration_s;
  w.seed = a.seed;
  w.prompt.token_ids = false;
  if (!a.token_ids.empty()) XDS_RETURN_IF_ERROR(parse_id_range(a.token_ids, w.prompt));
  if (!a.prompts_file.empty()) {
    XDS_ASSIGN_OR_RETURN(w.prompt.texts, read_prompts(a.prompts_file));
  }
  if (!a.mix.empty()) {
    XDS_ASSIGN_OR_RETURN(w.classes, parse_mix(a.mix));
  } else {
    RequestClass c;
    XDS_ASSIGN_OR_RETURN(c.input, lengths(a.input_len, a.input_len_dist, "--input-len-dist"));
    XDS_ASSIGN_OR_RETURN(c.output, lengths(a.output_len, a.output_len_dist, "--output-len-dist"));
    if (rate > 0) {
      c.arrival = ArrivalKind::kPoisson;
      c.rate = rate;
    } else {
      c.arrival = ArrivalKind::kClosedLoop;
      w.concurrency = a.concurrency;
    }
    w.classes = {c};
  }
  if (a.peak_decode) {
    w.concurrency = a.streams;
    w.num_requests = a.streams;
    w.duration_s = 0;
  } else if (w.num_requests == 0 && w.duration_s == 0) {
    w.num_requests = 100;  // the default run
  }
  XDS_RETURN_IF_ERROR(validate_workload(w));
  return w;
}

json run_json(const RunResult& r, const RunSummary& s) {
  json j = summary_json(s);
  j["client"] = {{"events", r.events},
                 {"io_thread_cpu_s", r.client_cpu_s},
                 {"process_cpu_s", r.process_cpu_s},
                 {"io_us_per_event", r.events > 0 ? r.client_cpu_s * 1e6 / r.events : 0.0},
                 {"delayed_arrivals", r.delayed_arrivals},
                 {"max_send_lag_s", r.max_send_lag_s}};
  return j;
}

void print_client_line(const RunResult& r) {
  std::printf(
      "client       io thread %.3f s CPU for %lld events (%.1f us/event), process %.3f s "
      "CPU; latest send %.1f ms after its planned time%s\n",
      r.client_cpu_s, static_cast<long long>(r.events),
      r.events > 0 ? r.client_cpu_s * 1e6 / r.events : 0.0, r.process_cpu_s, r.max_send_lag_s * 1e3,
      r.delayed_arrivals > 0
          ? fmt::format(", {} arrivals waited for --max-in-flight", r.delayed_arrivals).c_str()
          : "");
}

Status write_json(const std::string& path, const json& j) {
  if (path.empty()) return {};
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(j.dump(2) + "\n"));
  XDS_RETURN_IF_ERROR(f.commit());
  std::printf("wrote %s\n", path.c_str());
  return {};
}

Status all_failed(const RunSummary& s) {
  if (s.completed > 0) return {};
  return unavailable("all {} requests failed{}{}", s.requests, s.first_errors.empty() ? "" : ": ",
                     s.first_errors.empty() ? "" : s.first_errors.front());
}

// The server's speculative-decoding counters before a run (none before its first verify
// step; nullopt from a server without a readable /metrics, e.g. some peer engines).
std::optional<SpecCounters> spec_before(const RunnerOptions& ro) {
  auto c = fetch_spec_counters(ro.url, ro.api_key);
  if (!c.ok()) return std::nullopt;
  return *c;
}

// Their difference over the run, when the server speculated: a line, and root["speculative"].
void report_spec(const std::optional<SpecCounters>& before, const RunnerOptions& ro, json& root) {
  if (!before) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the groups' next report
  auto after = fetch_spec_counters(ro.url, ro.api_key);
  if (!after.ok() || !after->present()) return;
  const SpecCounters d = spec_difference(*after, *before);
  std::printf("%s", spec_line(d).c_str());
  root["speculative"] = spec_json(d);
}

Status run_single(const BenchArgs& a, RunnerOptions ro, json& root) {
  XDS_ASSIGN_OR_RETURN(WorkloadSpec w, build_workload(a, a.rate_given ? a.request_rate : 0));
  const std::optional<SpecCounters> spec = spec_before(ro);
  XDS_ASSIGN_OR_RETURN(RunResult r, run_workload(w, ro));
  const RunSummary s = summarize_run(r.records, r.duration_s);
  std::printf(
      "%s",
      summary_table(s, ro.label.empty() ? std::string("bench") : "bench " + ro.label).c_str());
  print_client_line(r);
  report_spec(spec, ro, root);
  root["summary"] = run_json(r, s);
  if (w.classes.size() > 1) {
    const std::vector<RunSummary> per =
        summarize_classes(r.records, static_cast<int>(w.classes.size()), r.duration_s);
    json classes = json::array();
    for (size_t i = 0; i < per.size(); ++i) {
      const RequestClass& c = w.classes[i];
      std::printf("%s", summary_table(per[i], fmt::format("class {} (in {}, out {})", i,
                                                          length_dist_string(c.input),
                                                          length_dist_string(c.output)))
                            .c_str());
      json cj = summary_json(per[i]);
      cj["input_len"] = length_dist_string(c.input);
      cj["output_len"] = length_dist_string(c.output);
      if (c.arrival == ArrivalKind::kPoisson) cj["rate"] = c.rate;
      if (c.arrival == ArrivalKind::kPeriodic) cj["period_s"] = c.period_s;
      classes.push_back(cj);
    }
    root["classes"] = classes;
  }
  if (a.goodput_given) {
    const SloLimits lim{a.goodput_ttft_ms * 1e-3, a.goodput_tpot_ms * 1e-3};
    const double att = slo_attainment(r.records, lim);
    std::printf("SLO          %.1f%% of requests within TTFT <= %g ms and TPOT <= %g ms\n",
                att * 100, a.goodput_ttft_ms, a.goodput_tpot_ms);
    root["slo_attainment"] = att;
  }
  return all_failed(s);
}

Status run_sweep(const BenchArgs& a, RunnerOptions ro, json& root) {
  XDS_ASSIGN_OR_RETURN(std::vector<double> rates, parse_rates(a.sweep_rates));
  const SloLimits lim{a.goodput_ttft_ms * 1e-3, a.goodput_tpot_ms * 1e-3};
  std::vector<SweepPoint> points;
  json runs = json::array();
  const std::string label = ro.label;
  for (double rate : rates) {
    XDS_ASSIGN_OR_RETURN(WorkloadSpec w, build_workload(a, rate));
    ro.label = fmt::format("{}rate {:g}/s", label.empty() ? "" : label + " ", rate);
    XDS_ASSIGN_OR_RETURN(RunResult r, run_workload(w, ro));
    const RunSummary s = summarize_run(r.records, r.duration_s);
    std::printf("%s", summary_table(s, ro.label).c_str());
    print_client_line(r);
    SweepPoint p{rate, slo_attainment(r.records, lim), s.ttft_ms.p99 * 1e-3, s.tpot_ms.p99 * 1e-3};
    points.push_back(p);
    json j = run_json(r, s);
    j["rate"] = rate;
    j["slo_attainment"] = p.attainment;
    runs.push_back(j);
  }
  std::printf("\n%-12s %10s %12s %12s %12s %12s\n", "rate (req/s)", "attained", "TTFT P99 ms",
              "TPOT P99 ms", "req/s", "out tok/s");
  for (size_t i = 0; i < points.size(); ++i) {
    std::printf("%-12g %9.1f%% %12.1f %12.1f %12.3f %12.1f\n", points[i].rate,
                points[i].attainment * 100, points[i].ttft_p99_s * 1e3, points[i].tpot_p99_s * 1e3,
                runs[i]["request_throughput"].get<double>(),
                runs[i]["output_token_throughput"].get<double>());
  }
  const std::optional<double> g = goodput_rate(points, a.goodput_fraction);
  const std::optional<double> g99 = goodput_rate_p99(points, lim);
  std::printf("goodput      %s (>= %.0f%% of requests within TTFT <= %g ms and TPOT <= %g ms)\n",
              g ? fmt::format("{:g} req/s", *g).c_str() : "none of the swept rates",
              a.goodput_fraction * 100, a.goodput_ttft_ms, a.goodput_tpot_ms);
  std::printf("goodput P99  %s (TTFT P99 <= %g ms and TPOT P99 <= %g ms)\n",
              g99 ? fmt::format("{:g} req/s", *g99).c_str() : "none of the swept rates",
              a.goodput_ttft_ms, a.goodput_tpot_ms);
  root["sweep"] = runs;
  root["goodput"] = {{"ttft_ms", a.goodput_ttft_ms},
                     {"tpot_ms", a.goodput_tpot_ms},
                     {"fraction", a.goodput_fraction},
                     {"rate", g ? json(*g) : json(nullptr)},
                     {"rate_p99", g99 ? json(*g99) : json(nullptr)}};
  return {};
}

Status run_peak_decode(const BenchArgs& a, RunnerOptions ro, json& root) {
  XDS_ASSIGN_OR_RETURN(WorkloadSpec w, build_workload(a, 0));
  ro.ignore_eos = true;
  ro.temperature = 0.0;
  const std::optional<SpecCounters> spec = spec_before(ro);
  XDS_ASSIGN_OR_RETURN(RunResult r, run_workload(w, ro));
  const RunSummary s = summarize_run(r.records, r.duration_s);
  std::printf("%s", summary_table(s, fmt::format("peak decode, {} streams", a.streams)).c_str());
  print_client_line(r);
  report_spec(spec, ro, root);
  root["summary"] = run_json(r, s);
  XDS_RETURN_IF_ERROR(all_failed(s));
  if (s.failed > 0) {
    return unavailable("peak decode: {} of {} streams failed; the window needs all of them",
                       s.failed, s.requests);
  }
  const DecodeWindow win = decode_window(r.records);
  json pd = {{"streams", a.streams},       {"input_len", a.input_len},
             {"output_len", a.output_len}, {"devices", a.devices},
             {"valid", win.valid},         {"window_start_s", win.start_s},
             {"window_end_s", win.end_s},  {"window_tokens", win.tokens}};
  if (!win.valid) {
    root["peak_decode"] = pd;
    return failed_precondition(
        "peak decode: the {} streams never all decoded at once (the last first token came at "
        "{:.3f} s, the first stream ended at {:.3f} s); raise --output-len, or the server's "
        "batch limit (--max-num-seqs) is below --streams",
        a.streams, win.start_s, win.end_s);
  }
  const double per_device = win.tokens_per_s / static_cast<double>(a.devices);
  pd["window_s"] = win.end_s - win.start_s;
  pd["tokens_per_s"] = win.tokens_per_s;
  pd["tokens_per_s_per_device"] = per_device;
  pd["tpot_ms"] = win.step_time_s * 1e3;
  root["peak_decode"] = pd;
  std::printf(
      "peak decode  %lld streams, window %.3f-%.3f s (%.3f s, %lld tokens): %.1f "
      "tokens/s, %.1f tokens/s per device (%lld devices), TPOT %.2f ms\n",
      static_cast<long long>(a.streams), win.start_s, win.end_s, win.end_s - win.start_s,
      static_cast<long long>(win.tokens), win.tokens_per_s, per_device,
      static_cast<long long>(a.devices), win.step_time_s * 1e3);
  return {};
}

Status run_bench(BenchArgs a) {
  XDS_ASSIGN_OR_RETURN(Url url, parse_url(a.url));
  RunnerOptions ro;
  ro.url = url;
  ro.api_key = a.api_key;
  if (a.endpoint == "completions") {
    ro.endpoint = Endpoint::kCompletions;
  } else if (a.endpoint == "chat") {
    ro.endpoint = Endpoint::kChat;
  } else {
    return invalid_argument("--endpoint must be completions or chat, got '{}'", a.endpoint);
  }
  ro.ignore_eos = a.ignore_eos;
  ro.temperature = a.temperature;
  ro.progress = !a.no_progress;
  ro.max_in_flight = a.max_in_flight;
  ro.http.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.request_timeout_s * 1e3));
  if (a.peak_decode) {
    if (a.streams < 1) return invalid_argument("--peak-decode needs --streams B >= 1");
    if (!a.mix.empty() || a.rate_given || !a.input_len_dist.empty() || !a.output_len_dist.empty() ||
        !a.sweep_rates.empty()) {
      return invalid_argument(
          "--peak-decode takes fixed --input-len and --output-len only (no --mix, --request-rate, "
          "length distributions or --sweep-rates)");
    }
    if (a.output_len < 2) return invalid_argument("--peak-decode needs --output-len >= 2");
  }
  if (!a.sweep_rates.empty()) {
    if (!a.goodput_given) {
      return invalid_argument("--sweep-rates needs --goodput-ttft-ms and --goodput-tpot-ms");
    }
    if (!a.mix.empty())
      return invalid_argument("--sweep-rates sweeps one request class (no --mix)");
  }
  if (a.model.empty()) {
    XDS_ASSIGN_OR_RETURN(a.model, first_model(url, a.api_key));
  }
  ro.model = a.model;

  json root;
  root["bench"] = "serve";
  root["url"] = a.url;
  root["model"] = a.model;
  root["endpoint"] = a.endpoint;
  root["mode"] = a.peak_decode ? "peak_decode" : !a.sweep_rates.empty() ? "sweep" : "run";
  root["config"] = {
      {"concurrency", a.concurrency},
      {"request_rate", a.rate_given ? json(a.request_rate) : json(nullptr)},
      {"num_requests", a.num_requests},
      {"duration_s", a.duration_s},
      {"input_len", a.input_len_dist.empty() ? json(a.input_len) : json(a.input_len_dist)},
      {"output_len", a.output_len_dist.empty() ? json(a.output_len) : json(a.output_len_dist)},
      {"mix", a.mix},
      {"token_ids", a.token_ids},
      {"prompts", a.prompts_file},
      {"seed", a.seed},
      {"ignore_eos", a.ignore_eos || a.peak_decode},
      {"temperature", a.peak_decode ? 0.0 : a.temperature},
      {"streams", a.streams},
      {"devices", a.devices}};
  Status st;
  if (a.peak_decode) {
    st = run_peak_decode(a, ro, root);
  } else if (!a.sweep_rates.empty()) {
    st = run_sweep(a, ro, root);
  } else {
    st = run_single(a, ro, root);
  }
  if (!st.ok()) root["error"] = st.to_string();
  const Status written = write_json(a.json_path, root);
  XDS_RETURN_IF_ERROR(st);
  return written;
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark an OpenAI-compatible server over HTTP");
  cmd->add_option("--url", a->url, "Server, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option("--model", a->model, "The request's model (default: the first of /v1/models)");
  cmd->add_option("--endpoint", a->endpoint, "completions or chat");
  auto* conc = cmd->add_option("--concurrency", a->concurrency,
                               "Closed loop: requests in flight (default 1)")
                   ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  auto* rate = cmd->add_option("--request-rate", a->request_rate, "Poisson arrivals, requests/s")
                   ->check(finite_range(1e-6, 1e6));
  conc->excludes(rate);
  cmd->add_option("--num-requests", a->num_requests,
                  "Requests to send (default 100 when --duration is not given)")
      ->check(CLI::Range(int64_t{0}, int64_t{100'000'000}));
  cmd->add_option("--duration", a->duration_s, "Send no request after S seconds")
      ->check(finite_range(0, 1e7));
  auto* in = cmd->add_option("--input-len", a->input_len, "Prompt tokens (default 128)")
                 ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  auto* in_d = cmd->add_option("--input-len-dist", a->input_len_dist,
                               "Prompt lengths: N, LO-HI (uniform) or N:W/N:W (weighted)");
  in->excludes(in_d);
  auto* out = cmd->add_option("--output-len", a->output_len, "max_tokens (default 128)")
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  auto* out_d = cmd->add_option("--output-len-dist", a->output_len_dist,
                                "max_tokens: N, LO-HI (uniform) or N:W/N:W (weighted)");
  out->excludes(out_d);
  auto* mix = cmd->add_option(
      "--mix", a->mix,
      "Open-loop request classes, ';'-separated: rate=R|period=P[,start=S],in=LENGTHS,out=LENGTHS "
      "(e.g. \"rate=1,in=128,out=64;period=60,in=3900,out=32\")");
  mix->excludes(conc)->excludes(rate)->excludes(in)->excludes(in_d)->excludes(out)->excludes(out_d);
  cmd->add_option("--token-ids", a->token_ids,
                  "Prompts of random token ids in [LO, HI) (\"LO,HI\"); default: text prompts");
  cmd->add_option("--prompts", a->prompts_file,
                  "Prompts from a text file, one per line, used in turn (excludes --token-ids)")
      ->excludes("--token-ids");
  cmd->add_option("--seed", a->seed, "Seed of arrivals, lengths and prompts");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Ask for exactly max_tokens tokens");
  cmd->add_option("--temperature", a->temperature, "Sampling temperature (default 0: greedy)")
      ->check(finite_range(0, 100));
  cmd->add_option("--api-key", a->api_key, "Sent as Authorization: Bearer KEY");
  cmd->add_option("--json", a->json_path, "Write the results as JSON");
  auto* ttft = cmd->add_option("--goodput-ttft-ms", a->goodput_ttft_ms, "TTFT limit (ms)")
                   ->check(finite_range(1e-3, 1e9));
  auto* tpot = cmd->add_option("--goodput-tpot-ms", a->goodput_tpot_ms, "TPOT limit (ms)")
                   ->check(finite_range(1e-3, 1e9));
  ttft->needs(tpot);
  tpot->needs(ttft);
  cmd->add_option("--goodput-fraction", a->goodput_fraction,
                  "Share of requests that must meet both limits (default 0.9)")
      ->check(finite_range(0.01, 1));
  cmd->add_option("--sweep-rates", a->sweep_rates, "Poisson rates to sweep, e.g. 0.5,1,2,4");
  cmd->add_flag("--peak-decode", a->peak_decode,
                "Aggregate decode tokens/s of --streams B streams decoding together");
  cmd->add_option("--streams", a->streams, "--peak-decode: streams")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  cmd->add_option("--devices", a->devices, "--peak-decode: devices the tokens/s is divided by")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--request-timeout", a->request_timeout_s,
                  "Seconds of silence before a request fails (default 600)")
      ->check(finite_range(0.001, 1e6));
  cmd->add_option("--max-in-flight", a->max_in_flight,
                  "Open loop: most requests in flight; later arrivals wait (default 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_flag("--no-progress", a->no_progress, "No progress line on stderr");
  cmd->callback([a, exit_code, rate, ttft] {
    a->rate_given = rate->count() > 0;
    a->goodput_given = ttft->count() > 0;
    const Status s = run_bench(*a);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      *exit_code = s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace xds::cli
