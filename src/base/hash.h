// Small non-cryptographic hashes shared across the tree.
#pragma once

#include <cstdint>
#include <string_view>

namespace xds {

// 64-bit FNV-1a of the bytes of s (prime 1099511628211) from the offset basis
// 1469598103934665603: the published basis, 14695981039346656037, without its last digit.
// Kept so: it names the repack cache files and seeds every tensor
// of the random checkpoints, so changing it would change both. Stable across builds and
// machines.
constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) {
    h ^= static_cast<uint8_t>(ch);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace xds
