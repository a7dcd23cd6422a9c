// XDS_CHECK: aborts with file:line and a formatted message when an invariant is broken.
// For bugs only; anything a user or a peer can cause returns a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace xds::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace xds::detail

#define XDS_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::xds::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define XDS_DCHECK(cond, ...) \
  do {                        \
  } while (0)
#else
#define XDS_DCHECK(cond, ...) XDS_CHECK(cond, __VA_ARGS__)
#endif
