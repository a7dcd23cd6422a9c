// Symmetric per-row int8 quantization: activations per token (dynamic, at run time) and
// weights per output channel (once, at load) follow the same rule, row by row:
//
//   s    = absmax(row) / 127                 (one fp32 division)
//   q[i] = round_to_nearest_even(x[i] / s)   (one fp32 division, then the integer nearest;
//                                             always in [-127, 127], never -128)
//   a row of zeros: s = 0 and q = 0
//
// and dequantization is x'[i] = q[i] · s (one fp32 rounding). For a row whose s is a normal
// number, |x[i] - x'[i]| <= s / 2 up to the roundings of the division and the product
// (each within 2^-24 of a value <= 127 s: tested as <= (s / 2)(1 + 2^-14)).
// Inputs must be finite. The results do not depend on the instruction set (the vector and
// the scalar steps are the same IEEE operations), so every kernel path sees the same bits.
//
// The int8 kernels (int8_linear.h) take such rows as Int8RowsRef: the activations x [m, k]
// per token, and the weights [n, k] per output row for pack_int8_panels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace xds::kernels {

// Read-only int8 rows with one scale each (not owning).
struct Int8RowsRef {
  const int8_t* q = nullptr;     // [rows][ld], the first cols of each row used
  const float* scale = nullptr;  // [rows]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  // >= cols
};

// Where quantized rows are written (not owning): q [rows][ld], scale [rows].
struct Int8RowsOut {
  int8_t* q = nullptr;
  float* scale = nullptr;
  int64_t ld = 0;
};

// Owning int8 rows (tests, benchmarks, scratch): q [rows][cols], scale [rows]. Not
// thread-safe to resize while a kernel reads it.
struct Int8Rows {
  std::vector<int8_t> q;
  std::vector<float> scale;
  int64_t rows = 0, cols = 0;

  void resize(int64_t r, int64_t c) {
    rows = r, cols = c;
    q.resize(static_cast<size_t>(r * c));
    scale.resize(static_cast<size_t>(r));
  }
  Int8RowsRef ref() const { return {q.data(), scale.data(), rows, cols, cols}; }
  Int8RowsOut out() { return {q.data(), scale.data(), cols}; }
};

// Quantizes rows x [rows][ldx] (the first cols of each) into out (rule above), on the
// calling thread. The bf16 form widens each element exactly first: the same bits as the
// f32 form on the widened rows.
void quantize_rows_int8(const float* x, int64_t rows, int64_t cols, int64_t ldx,
                        const Int8RowsOut& out);
void quantize_rows_int8(const uint16_t* x_bf16, int64_t rows, int64_t cols, int64_t ldx,
                        const Int8RowsOut& out);

// One row of cols values: writes q[0..cols) and returns its scale.
float quantize_row_int8(const float* x, int64_t cols, int8_t* q);

// x'[r][i] = q[r][i] · scale[r] into x [rows][ldx].
void dequantize_rows_int8(const Int8RowsRef& in, float* x, int64_t ldx);

// Owning helpers: quantize rows [rows][cols] (row stride cols) into a new Int8Rows.
Int8Rows quantize_int8(const float* x, int64_t rows, int64_t cols);
Int8Rows quantize_int8(const uint16_t* x_bf16, int64_t rows, int64_t cols);

}  // namespace xds::kernels
