// A 16 × 16 block of floats transposed in AVX-512 registers (internal to the kernels).
//
//   transpose_16x16(r, out): out[c][j] = r[j][c] for j, c < 16
//   transpose_row_tiles: a [rows][cols] matrix as tiles of 16 rows, each [cols][16]
//
// Three stages of shuffles, 64 in all for 256 elements (an element at a time costs a load
// and a store each): pairs of rows interleaved by 32 bits, then by 64 bits (each 128-bit
// lane then holds four rows' element 4L + j), then the 128-bit lanes regrouped.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
namespace xds::kernels {

inline void transpose_16x16(const __m512 (&r)[16], __m512 (&out)[16]) {
  // Zero-masking forms with full masks: the plain instructions, without GCC 12's
  // -Wmaybe-uninitialized on the plain intrinsics' undefined start register.
  constexpr __mmask16 kAll = 0xffff;
  constexpr __mmask8 kAll8 = 0xff;
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // lane L of t[i]: r_i[4L], r_i+1[4L], r_i[4L+1], r_i+1[4L+1]
    t[i] = _mm512_maskz_unpacklo_ps(kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // lane L of u[g + j]: element 4L + j of rows g .. g + 3
    const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
    const __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
    u[g] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, a, c));
    u[g + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, a, c));
    u[g + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, b, d));
    u[g + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, b, d));
  }
  for (int j = 0; j < 4; ++j) {  // column 4L + j: lane L of u[j], u[4 + j], u[8 + j], u[12 + j]
    const __m512 x0 = _mm512_maskz_shuffle_f32x4(kAll, u[j], u[4 + j], 0x44);  // a0 a1 b0 b1
    const __m512 x1 = _mm512_maskz_shuffle_f32x4(kAll, u[j], u[4 + j], 0xee);  // a2 a3 b2 b3
    const __m512 y0 = _mm512_maskz_shuffle_f32x4(kAll, u[8 + j], u[12 + j], 0x44);
    const __m512 y1 = _mm512_maskz_shuffle_f32x4(kAll, u[8 + j], u[12 + j], 0xee);
    out[j] = _mm512_maskz_shuffle_f32x4(kAll, x0, y0, 0x88);       // lanes 0 of the four groups
    out[4 + j] = _mm512_maskz_shuffle_f32x4(kAll, x0, y0, 0xdd);   // lanes 1
    out[8 + j] = _mm512_maskz_shuffle_f32x4(kAll, x1, y1, 0x88);   // lanes 2
    out[12 + j] = _mm512_maskz_shuffle_f32x4(kAll, x1, y1, 0xdd);  // lanes 3
  }
}

// dst[t][col0 + c][j] = src[16t + j][c] for every tile t of 16 rows (row i at src + i·ld;
// rows past `rows` zero) and columns c < cols; tile t at dst + t·tile_floats.
inline void transpose_row_tiles(const float* src, int64_t ld, int64_t rows, int64_t cols,
                                int64_t col0, float* dst, int64_t tile_floats) {
  for (int64_t t = 0; t * 16 < rows; ++t) {
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int64_t w = std::min<int64_t>(16, cols - c0);
      const __mmask16 lanes = static_cast<__mmask16>(w == 16 ? 0xffff : (1u << w) - 1);
      __m512 r[16], out[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t row = t * 16 + j;
        r[j] = row < rows ? _mm512_maskz_loadu_ps(lanes, src + row * ld + c0) : _mm512_setzero_ps();
      }
      transpose_16x16(r, out);
      float* d = dst + t * tile_floats + (col0 + c0) * 16;
      for (int64_t c = 0; c < w; ++c) _mm512_storeu_ps(d + c * 16, out[c]);
    }
  }
}

}  // namespace xds::kernels
#endif
