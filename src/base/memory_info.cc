#include "base/memory_info.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>

#include "base/read_file.h"

namespace xds {

int64_t parse_mem_available(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t at = 0;
  while (at < meminfo.size()) {  // the key only at the start of a line
    const size_t eol = std::min(meminfo.find('\n', at), meminfo.size());
    std::string_view line = meminfo.substr(at, eol - at);
    at = eol + 1;
    if (!line.starts_with(kKey)) continue;
    line.remove_prefix(kKey.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    int64_t kib = 0;
    const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), kib);
    if (ec != std::errc() || kib < 0 || kib > INT64_MAX / 1024) return -1;
    if (std::string_view(end, line.data() + line.size() - end) != " kB") return -1;
    return kib * 1024;
  }
  return -1;
}

int64_t available_memory_bytes() {
  Result<std::string> text = read_whole_file("/proc/meminfo");
  return text.ok() ? parse_mem_available(*text) : -1;
}

}  // namespace xds
