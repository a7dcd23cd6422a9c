// Helpers shared by the XCCL tests: deterministic payloads that a test can regenerate anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace xds::xccl::testing {

// splitmix64: a plain, independent generator for test data.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Bytes of the message (src -> dst, event): byte i = low byte of mix(seed ^ i/8 ...).
inline std::vector<std::byte> pattern(int src, int dst, uint64_t event, size_t n) {
  std::vector<std::byte> v(n);
  const uint64_t seed = mix((uint64_t(src) << 48) ^ (uint64_t(dst) << 32) ^ event);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = mix(seed + i);
    for (size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = std::byte(w >> (8 * j));
  }
  return v;
}

}  // namespace xds::xccl::testing
