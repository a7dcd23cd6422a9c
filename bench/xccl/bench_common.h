// Shared by the XCCL bench and the Open MPI bench, so both move the same bytes with the same
// routing: message sizes, cold-buffer pools, the random top-8 routing, JSON lines.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace xbench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// 8 B .. 64 MB, powers of 4 plus 1 MB and 9 MB (the paper's Figure 5 mentions 9 MB).
inline std::vector<size_t> p2p_sizes(bool quick) {
  std::vector<size_t> s;
  for (size_t n = 8; n <= (64u << 20); n *= 4) s.push_back(n);
  s.push_back(1u << 20);
  s.push_back(9u << 20);
  s.push_back(64u << 20);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  if (quick)
    s.erase(std::remove_if(s.begin(), s.end(), [](size_t n) { return n > (4u << 20); }), s.end());
  return s;
}

inline int iterations_for(size_t bytes, bool quick) {
  const double budget = quick ? 64e6 : 512e6;  // bytes moved per size
  int it = int(budget / double(std::max<size_t>(bytes, 1)));
  return std::clamp(it, 5, quick ? 2000 : 20000);
}

// Buffers rotated over >= 192 MB so that every copy of >= 64 KB reads cold (DRAM) memory, as the
// memcpy baseline does; small messages reuse one (warm) buffer, as latency tests do.
struct ColdPool {
  std::vector<unsigned char> mem;
  size_t slot = 0, n_slots = 1, next = 0;
  ColdPool(size_t bytes, size_t total = size_t(192) << 20) {
    slot = (std::max<size_t>(bytes, 64) + 4095) / 4096 * 4096;
    n_slots = bytes >= (64u << 10) ? std::max<size_t>(2, total / slot) : 1;
    mem.assign(slot * n_slots, 1);
  }
  unsigned char* get() {
    unsigned char* p = mem.data() + slot * next;
    next = (next + 1) % n_slots;
    return p;
  }
};

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Top-k distinct experts out of n_experts, weights in (0, 1]. ids/w: [n_tokens, k].
inline void make_routing(int rank, int n_tokens, int k, int n_experts, std::vector<int32_t>& ids,
                         std::vector<float>& w) {
  ids.resize(size_t(n_tokens) * size_t(k));
  w.resize(ids.size());
  for (int t = 0; t < n_tokens; ++t)
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      uint64_t salt = 0;
      do {
        e = int32_t(
            mix((uint64_t(rank) << 40) ^ (uint64_t(t) << 16) ^ uint64_t(j) ^ (salt++ << 56)) %
            uint64_t(n_experts));
        dup = false;
        for (int i = 0; i < j; ++i) dup |= ids[size_t(t * k + i)] == e;
      } while (dup);
      ids[size_t(t * k + j)] = e;
      w[size_t(t * k + j)] = float(1 + mix(uint64_t(t * k + j)) % 1000) / 1000.f;
    }
}

inline std::vector<int> moe_token_counts() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

inline double min_of(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

// Appends one JSON object per line.
inline void jsonl(const char* path, const std::string& line) {
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", line.c_str());
    std::fclose(f);
  }
}

}  // namespace xbench
