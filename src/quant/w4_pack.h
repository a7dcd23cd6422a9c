// One linear's 4-bit weights in memory and their compressed-tensors pack-quantized tensors
// (the layout model/int4_weights.h loads), written by mkmodel --weights-int4 (round to
// nearest, quant/w4_rtn.h) and by `quantize --scheme w4a16|w4a8` (GPTQ, quant/gptq.h).
//
// For module <m> [rows, cols], G = group:
//   <m>.weight_packed     I32 [rows, cols/8]: nibble j of word [r][i] is q[r][8i + j]
//   <m>.weight_scale      [rows, cols/G] in scale_dtype (BF16, F16 or F32)
//   <m>.weight_shape      I64 [2] = {rows, cols}
//   <m>.weight_zero_point I32 [ceil(rows/8), cols/G], asymmetric only: nibble j of word
//                         [i][g] is zero[8i + j][g]
// and W[r][c] = scale[r][c/G] · (q[r][c] − zero[r][c/G]) (zero 8 when symmetric).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quant/checkpoint_writer.h"
#include "tensor/dtype.h"

namespace xds {

struct W4Linear {
  int64_t rows = 0, cols = 0, group = 0;  // cols a multiple of group
  std::vector<uint8_t> q;                 // [rows, cols], 0..15
  std::vector<uint8_t> zero;              // [rows, cols / group], 0..15 (8: symmetric)
  std::vector<float> scale;               // [rows, cols / group], exact in the scale dtype

  W4Linear() = default;
  W4Linear(int64_t r, int64_t c, int64_t g);  // sized, zero-filled
  int64_t groups() const { return cols / group; }
  // scale · (q − zero) at [r][c], in double (exact: a 5-bit integer times the scale).
  double dequantized(int64_t r, int64_t c) const {
    const int64_t g = r * groups() + c / group;
    return double(scale[g]) * (int(q[r * cols + c]) - int(zero[g]));
  }
};

// Appends <m>.weight_packed, .weight_scale, .weight_shape and (asymmetric) .weight_zero_point.
void append_pack_quantized(const std::string& module, const W4Linear& w, bool symmetric,
                           DType scale_dtype, std::vector<OutTensor>& out);

}  // namespace xds
