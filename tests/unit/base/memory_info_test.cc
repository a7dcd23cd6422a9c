#include "base/memory_info.h"

#include <gtest/gtest.h>

namespace xds {
namespace {

TEST(MemoryInfo, ParsesMemAvailableInKibibytes) {
  const char* text =
      "MemTotal:       24683748 kB\n"
      "MemFree:        16475348 kB\n"
      "MemAvailable:   23127744 kB\n"
      "Buffers:            3948 kB\n";
  EXPECT_EQ(parse_mem_available(text), int64_t{23127744} * 1024);
  EXPECT_EQ(parse_mem_available("MemAvailable: 1 kB"), 1024);  // last line, no newline
}

TEST(MemoryInfo, MissingOrMalformedLinesGiveMinusOne) {
  EXPECT_EQ(parse_mem_available(""), -1);
  EXPECT_EQ(parse_mem_available("MemTotal: 10 kB\nMemFree: 5 kB\n"), -1);
  EXPECT_EQ(parse_mem_available("MemAvailable: lots kB\n"), -1);
  EXPECT_EQ(parse_mem_available("MemAvailable: 12 MB\n"), -1);
  EXPECT_EQ(parse_mem_available("MemAvailable: 99999999999999999999 kB\n"), -1);
  // The key only counts at the start of a line.
  EXPECT_EQ(parse_mem_available("XMemAvailable: 3 kB\n"), -1);
}

TEST(MemoryInfo, ThisMachineReportsSomeMemory) {
  // Linux, as the project requires: /proc/meminfo exists and has the line.
  EXPECT_GT(available_memory_bytes(), 0);
}

}  // namespace
}  // namespace xds
