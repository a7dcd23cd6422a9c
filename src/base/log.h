// Minimal leveled logging to stderr. The level is read once from XDS_LOG_LEVEL (base/env.h)
// (debug|info|warn|error; default info) by log_level() below.
//
// Rate-limited per call site (base/log_rate_limit.h): beyond kLogLinesPerSecond lines of one
// format in a second the rest are dropped (never formatted) and a line
// "(suppressed K similar messages: <format>)" follows once that second is over, with the
// next line logged. A loop that fails the same way a million times logs ~20 lines a second.
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <cstdio>
#include <string_view>

#include <fmt/format.h>

namespace xds {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Environment setting XDS_LOG_LEVEL, read once.
LogLevel log_level();
void log_write(LogLevel level, const std::string& msg);

inline constexpr int kLogLinesPerSecond = 20;  // per call site (format string)
// Whether a line of the call site `format` is printed now (writes pending summaries first).
bool log_admit(LogLevel level, std::string_view format);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  const fmt::string_view site = f;  // the call site's literal
  if (!log_admit(level, std::string_view(site.data(), site.size()))) return;
  log_write(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace xds

#define XDS_LOG_DEBUG(...) ::xds::log(::xds::LogLevel::kDebug, __VA_ARGS__)
#define XDS_LOG_INFO(...) ::xds::log(::xds::LogLevel::kInfo, __VA_ARGS__)
#define XDS_LOG_WARN(...) ::xds::log(::xds::LogLevel::kWarn, __VA_ARGS__)
#define XDS_LOG_ERROR(...) ::xds::log(::xds::LogLevel::kError, __VA_ARGS__)
