#include "base/log.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace xds {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* v = std::getenv("XDS_LOG_LEVEL");
    if (v == nullptr) return LogLevel::kInfo;
    if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
    if (std::strcmp(v, "warn") == 0) return LogLevel::kWarn;
    if (std::strcmp(v, "error") == 0) return LogLevel::kError;
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
