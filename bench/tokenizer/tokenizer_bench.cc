// Encode throughput on one core (MB/s of UTF-8 input) for the published Qwen3 and DeepSeek-V3
// tokenizers on three corpora, plus decode and streaming-decode throughput. Prints a table and
// writes it with the JSON to bench-out/tokenizer_bench.* (--json FILE elsewhere; --save also
// to bench/results/: run_output.h).
//
//   build/<dir>/bench/tokenizer/tokenizer_bench [--mb 4] [--fixtures DIR] [--json FILE] [--save]
//
// Corpora are generated deterministically: English prose (sentences drawn from a word list
// with punctuation and numbers), Chinese/Japanese mixed with English, and C++-like code with
// tabs and CRLF.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_output.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(s >> 33);
  }
};

std::string english(size_t bytes) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
      "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
      "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
      "if", "more", "when", "will", "would", "who", "so", "no", "system", "model", "serving", "token",
      "latency", "throughput", "memory", "expert", "request", "because", "between", "government",
      "international", "understanding", "beautiful", "morning", "children", "questions", "answered",
      "river", "mountain", "history", "science", "quickly", "slowly", "measurement", "Tuesday",
      "London", "Paris", "computer", "language", "written", "tokenizer", "anything", "everything"};
  Lcg r{42};
  std::string out;
  while (out.size() < bytes) {
    const int n = 6 + static_cast<int>(r.next() % 14);
    for (int k = 0; k < n; ++k) {
      std::string w = kWords[r.next() % (sizeof(kWords) / sizeof(kWords[0]))];
      if (k == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      out += w;
      if (r.next() % 23 == 0) out += std::to_string(r.next() % 5000);
      out += (k + 1 < n) ? (r.next() % 9 == 0 ? ", " : " ") : "";
    }
    out += (r.next() % 7 == 0) ? "?\n" : (r.next() % 5 == 0 ? ".\n\n" : ". ");
  }
  return out;
}

std::string cjk(size_t bytes) {
  static const char* kParts[] = {"我们今天去北京的天安门广场。", "人工智能正在改变世界，", "東京は日本の首都です。",
                                 "ひらがなとカタカナ、", "모델 서빙 시스템은 ", "The model said: ", "2024年12月", "！",
                                 "然后吃了烤鸭", "token 数量"};
  Lcg r{7};
  std::string out;
  while (out.size() < bytes) out += kParts[r.next() % (sizeof(kParts) / sizeof(kParts[0]))];
  return out;
}

std::string code(size_t bytes) {
  static const char* kLines[] = {"#include <vector>\r\n", "int main(int argc, char** argv) {\r\n",
                                 "\tfor (int i = 0; i < n; ++i) {\r\n", "\t\tsum += values[i] * 2;  // double\r\n",
                                 "\t}\r\n", "\treturn sum > 0 ? 0 : 1;\r\n", "}\r\n\r\n",
                                 "    def f(self, x):\n        return {\"key\": x, \"n\": 12345}\n"};
  Lcg r{3};
  std::string out;
  while (out.size() < bytes) out += kLines[r.next() % (sizeof(kLines) / sizeof(kLines[0]))];
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of this thread: "one core" even when other processes share the machine.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 4;
  std::string fixtures = XDS_TOKENIZER_FIXTURES;
  xds::bench::OutputOptions output;
  const char* usage = "usage: tokenizer_bench [--mb 4] [--fixtures DIR] [--json FILE] [--save]\n";
  for (int i = 1; i < argc;) {
    const int used = xds::bench::parse_output_flag(argc, argv, i, output);
    if (used > 0) {
      i += used;
      continue;
    }
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("%s", usage);
      return 0;
    }
    if (used == 0 && i + 1 < argc && !std::strcmp(argv[i], "--mb")) {
      mb = std::atof(argv[i + 1]);
    } else if (used == 0 && i + 1 < argc && !std::strcmp(argv[i], "--fixtures")) {
      fixtures = argv[i + 1];
    } else {
      std::fprintf(stderr, "error: unknown or incomplete argument '%s'\n%s", argv[i], usage);
      return 2;
    }
    i += 2;
  }
  if (!(mb > 0)) {
    std::fprintf(stderr, "error: --mb must be a positive number of megabytes\n");
    return 2;
  }
  xds::bench::RunOutput run_output;  // captures the printed table from here on
  const size_t bytes = static_cast<size_t>(mb * 1024 * 1024);
  const std::vector<std::pair<std::string, std::string>> corpora = {
      {"english", english(bytes)}, {"cjk_mixed", cjk(bytes)}, {"code_crlf", code(bytes)}};
  nlohmann::json results = nlohmann::json::array();
  std::printf("throughput = input MB / CPU time of the one encoding thread (wall time alongside)\n");
  std::printf("%-12s %-10s %8s %9s %12s %12s %12s %12s %8s\n", "tokenizer", "corpus", "MB", "tokens",
              "encode MB/s", "(wall MB/s)", "decode MB/s", "stream MB/s", "load s");
  for (const std::string fam : {"qwen3", "deepseek_v3"}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto tok = xds::Tokenizer::load(fixtures + "/" + fam);
    const double load_s = seconds_since(t0);
    if (!tok.ok()) {
      std::fprintf(stderr, "error: %s\n", tok.status().to_string().c_str());
      return 1;
    }
    for (const auto& [name, text] : corpora) {
      const auto t1 = std::chrono::steady_clock::now();
      const double c1 = thread_cpu_s();
      auto ids = tok->encode(text, false);
      const double enc_s = thread_cpu_s() - c1;
      const double enc_wall_s = seconds_since(t1);
      if (!ids.ok()) {
        std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
        return 1;
      }
      const double c2 = thread_cpu_s();
      const std::string back = tok->decode(*ids, false);
      const double dec_s = thread_cpu_s() - c2;
      const double c3 = thread_cpu_s();
      xds::IncrementalDetokenizer d(*tok, false);
      size_t streamed = 0;
      for (const int32_t id : *ids) streamed += d.push(id).size();
      streamed += d.flush().size();
      const double str_s = thread_cpu_s() - c3;
      if (back != text || streamed != text.size()) {
        std::fprintf(stderr, "error: %s/%s does not round-trip\n", fam.c_str(), name.c_str());
        return 1;
      }
      const double m = static_cast<double>(text.size()) / (1024.0 * 1024.0);
      std::printf("%-12s %-10s %8.2f %9zu %12.2f %12.2f %12.2f %12.2f %8.2f\n", fam.c_str(), name.c_str(), m,
                  ids->size(), m / enc_s, m / enc_wall_s, m / dec_s, m / str_s, load_s);
      results.push_back({{"tokenizer", fam}, {"corpus", name}, {"mb", m}, {"tokens", ids->size()},
                         {"encode_mb_per_s", m / enc_s}, {"encode_wall_mb_per_s", m / enc_wall_s},
                         {"decode_mb_per_s", m / dec_s},
                         {"stream_decode_mb_per_s", m / str_s}, {"load_s", load_s}});
    }
  }
  const nlohmann::json j = {{"bench", "tokenizer"}, {"threads", 1}, {"results", results}};
  return run_output.finish(output, "tokenizer_bench", j) ? 0 : 1;
}
