// The arrays one MatrixRef points to and their sizes in bytes, per layout (tensor/matrix.h
// describes each): what a copy of the matrix must copy, and nothing beyond them.
//
//   layout        data                         scales                     zero             correction
//   kRows         rows · row_bytes()           -                          -                -
//   kPanels16     bytes()                      FP8: stored_panels() ·     -                -
//                                              scale_blocks() fp32
//   kInt8Panels   bytes()                      stored rows fp32           -                stored rows int32
//   kInt4Panels   bytes()                      stored rows · groups fp32  same, u8 (asym)  cols int32 (a g_idx
//                                                                                           order) or null
// stored rows: rows rounded up to 32 (the int8 and int4 panel pairs).
#pragma once

#include <array>
#include <cstdint>

#include "tensor/matrix.h"

namespace xds {

struct MatrixParts {
  int64_t data = 0, scales = 0, zero = 0, correction = 0;  // bytes; 0 where the pointer is null
};

inline MatrixParts matrix_parts(const MatrixRef& m) {
  MatrixParts p;
  p.data = m.data != nullptr ? m.bytes() : 0;
  const int64_t stored_rows = (m.rows + 31) / 32 * 32;
  switch (m.layout) {
    case MatrixLayout::kRows:
      break;
    case MatrixLayout::kPanels16:
      if (m.scales != nullptr) p.scales = m.stored_panels() * m.scale_blocks() * 4;
      break;
    case MatrixLayout::kInt8Panels:
      if (m.scales != nullptr) p.scales = stored_rows * 4;
      if (m.correction != nullptr) p.correction = stored_rows * 4;
      break;
    case MatrixLayout::kInt4Panels: {
      const int64_t groups = m.group_cols > 0 ? m.cols / m.group_cols : 0;
      if (m.scales != nullptr) p.scales = stored_rows * groups * 4;
      if (m.zero != nullptr) p.zero = stored_rows * groups;
      if (m.correction != nullptr) p.correction = m.cols * 4;
      break;
    }
  }
  return p;
}

}  // namespace xds
