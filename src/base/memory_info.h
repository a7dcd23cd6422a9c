// How much memory the machine can still give this process: for refusing, with a clear
// error, an allocation that would otherwise end in std::bad_alloc or, with Linux's
// overcommit, in the OOM killer once the pages are touched.
#pragma once

#include <cstdint>
#include <string_view>

namespace xds {

// MemAvailable of /proc/meminfo in bytes (free memory plus what the kernel can reclaim
// without swapping), or -1 where it cannot be read.
int64_t available_memory_bytes();

// The MemAvailable line of a /proc/meminfo text ("MemAvailable:   123456 kB"), in bytes; -1
// when the line is missing or malformed. Pure: the parser behind available_memory_bytes.
int64_t parse_mem_available(std::string_view meminfo);

}  // namespace xds
