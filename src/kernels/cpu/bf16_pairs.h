// bf16 pairs for vdpbf16ps (internal to the kernels, AVX512_BF16 builds): the instruction
// multiplies 32-bit lanes that each hold two bf16 values, so two 16-element vectors (two
// panel columns, two cached rows, two rows of probabilities) are interleaved word by word.
#pragma once

#include <immintrin.h>

namespace xds::kernels {

#if defined(__AVX512BF16__)
// v's two halves a = words 0-15 and b = words 16-31 as 16 pairs: word 2i <- a[i],
// word 2i + 1 <- b[i] (one vpermw).
inline __m512i interleave_halves(__m512i v) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, v);
}

// Panel h (0 or 1) of a pair's columns c and c + 1, the lines l0 and l1 (tensor/matrix.h:
// each line is a column of panel 0 in words 0-15, then of panel 1 in words 16-31), as 16
// pairs: word 2i <- l0[16h + i], word 2i + 1 <- l1[16h + i] (one vpermt2w).
template <int h>
inline __m512i interleave_pair_columns(__m512i l0, __m512i l1) {
  static_assert(h == 0 || h == 1);
  constexpr short o = 16 * h, b = 32 + 16 * h;  // index bit 5 picks l1
  const __m512i idx = _mm512_set_epi16(b + 15, o + 15, b + 14, o + 14, b + 13, o + 13, b + 12,
                                       o + 12, b + 11, o + 11, b + 10, o + 10, b + 9, o + 9, b + 8,
                                       o + 8, b + 7, o + 7, b + 6, o + 6, b + 5, o + 5, b + 4,
                                       o + 4, b + 3, o + 3, b + 2, o + 2, b + 1, o + 1, b, o);
  return _mm512_permutex2var_epi16(l0, idx, l1);
}
#endif

}  // namespace xds::kernels
