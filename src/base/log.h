// Minimal leveled logging to stderr. The level is read once from XDS_LOG_LEVEL (base/env.h)
// (debug|info|warn|error; default info) by log_level() below.
#pragma once

#include <cstdio>

#include <fmt/format.h>

namespace xds {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Environment setting XDS_LOG_LEVEL, read once.
LogLevel log_level();
void log_write(LogLevel level, const std::string& msg);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace xds

#define XDS_LOG_DEBUG(...) ::xds::log(::xds::LogLevel::kDebug, __VA_ARGS__)
#define XDS_LOG_INFO(...) ::xds::log(::xds::LogLevel::kInfo, __VA_ARGS__)
#define XDS_LOG_WARN(...) ::xds::log(::xds::LogLevel::kWarn, __VA_ARGS__)
#define XDS_LOG_ERROR(...) ::xds::log(::xds::LogLevel::kError, __VA_ARGS__)
