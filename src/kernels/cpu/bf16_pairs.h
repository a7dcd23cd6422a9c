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
#endif

}  // namespace xds::kernels
