#include "base/log.h"

#include <mutex>
#include <string>

#include "base/env.h"

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

void log_write(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  static constexpr const char* kTags[] = {"D", "I", "W", "E"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[%s] %s\n", kTags[static_cast<int>(level)], msg.c_str());
}

}  // namespace xds
