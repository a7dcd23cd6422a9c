#include "base/log.h"

#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/env.h"
#include "base/log_rate_limit.h"

namespace xds {

LogLevel log_level() {
  static const LogLevel level = [] {
    const std::string v = env::log_level();
    if (v == "debug") return LogLevel::kDebug;
    if (v == "warn") return LogLevel::kWarn;
    if (v == "error") return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

namespace {

constexpr const char* kTags[] = {"D", "I", "W", "E"};

std::mutex& log_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

bool log_admit(LogLevel level, std::string_view format) {
  static LogRateLimiter limiter(kLogLinesPerSecond);      // (log_mutex)
  static std::vector<LogRateLimiter::Summary> summaries;  // (log_mutex) reused
  std::lock_guard<std::mutex> lock(log_mutex());
  summaries.clear();
  const bool print = limiter.admit(format, static_cast<int>(level), now_ns(), summaries);
  for (const LogRateLimiter::Summary& s : summaries) {
    std::fprintf(stderr, "[%s] (suppressed %llu similar messages: %.*s)\n", kTags[s.tag],
                 static_cast<unsigned long long>(s.suppressed), static_cast<int>(s.format.size()),
                 s.format.data());
  }
  return print;
}

void log_write(LogLevel level, const std::string& msg) {
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(stderr, "[%s] %s\n", kTags[static_cast<int>(level)], msg.c_str());
}

}  // namespace xds
