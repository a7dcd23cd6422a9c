// The pair kernels of the int4 linear layers (internal to int4_linear*.cc): for one pair of
// 16-row panels (int4_linear.h's layout) and every token of a call, the fp32 sums
// f[t][r] = Σ_g sw[r][g] · s[t][r][g] (W4A8) or Σ_g sw[r][g] · p[t][r][g] (W4A16), each in
// the order int4_linear.h documents. One set per instruction set; the caller applies sx
// and stores.
#pragma once

#include <algorithm>
#include <cstdint>

namespace xds::kernels::int4_detail {

inline constexpr int64_t kPairRows = 32;
inline constexpr int64_t kQuadCols = 4;    // k columns per line
inline constexpr int64_t kLineBytes = 64;  // a quad of a pair: 32 rows × 4 nibbles
// A pass over a k block of a pair keeps it in L1 for the next pass: 16 KB of nibbles.
inline constexpr int64_t kBlockBytes = 16384;
// Software prefetch distance along a pair's stream.
inline constexpr int64_t kAheadBytes = 4096;

// One pair's share of the packed weights.
struct PairView {
  const uint8_t* data;  // [cols / 4][64], 64-byte aligned
  const float* scale;   // [groups][32]
  const uint8_t* zero;  // [groups][32], or null: symmetric (8)
  int64_t groups;
  int64_t group_cols;  // G
};

// W4A8 activations: xq [m][ld] int8 and xsum [m][groups] = Σ_{c in g} xq[t][c].
struct A8Tokens {
  const int8_t* q;
  int64_t ld;
  const int32_t* xsum;
  int64_t m;
};

// W4A16 activations: x [m][ld] fp32 and xsum [m][groups] (Σ_{c in g} x[t][c] in double,
// rounded; null for symmetric weights, which do not use it).
struct A16Tokens {
  const float* x;
  int64_t ld;
  const float* xsum;
  int64_t m;
};

// acc [m][32] = f of every token against the pair (the padding rows' f is 0).
void a8_pair_avx512(const A8Tokens& x, const PairView& w, float* acc);
void a8_pair_avx2(const A8Tokens& x, const PairView& w, float* acc);
void a8_pair_scalar(const A8Tokens& x, const PairView& w, float* acc);
void a16_pair_avx512(const A16Tokens& x, const PairView& w, float* acc);
void a16_pair_avx2(const A16Tokens& x, const PairView& w, float* acc);
void a16_pair_scalar(const A16Tokens& x, const PairView& w, float* acc);

// Groups per k block.
inline int64_t block_groups(int64_t group_cols) {
  return std::max<int64_t>(1, kBlockBytes / (group_cols / kQuadCols * kLineBytes));
}

// Calls tile(t0, tokens, gb, ge) over the pair's groups in k blocks and, in each block,
// its m tokens in balanced passes of at most max_tokens (13 as 7 + 6): every pass of a
// block before the next block, so the block stays in L1 across the passes. A tile on the
// first block (gb == 0) starts its fp32 sums at 0, later ones at acc.
template <class Tile>
void for_each_pass(int64_t m, int max_tokens, const PairView& w, Tile&& tile) {
  const int64_t passes = (m + max_tokens - 1) / max_tokens;
  const int64_t block = block_groups(w.group_cols);
  for (int64_t gb = 0; gb < w.groups; gb += block) {
    const int64_t ge = std::min(w.groups, gb + block);
    int64_t t = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const int tokens = static_cast<int>((m - t + passes - i - 1) / (passes - i));
      tile(t, tokens, gb, ge);
      t += tokens;
    }
  }
}

}  // namespace xds::kernels::int4_detail
