// MatrixRef: a read-only row-major matrix in the kernels' layout.
//
// Linear weights are stored as Hugging Face does, [out_features, in_features] row-major,
// so row r holds the weights of output r. `data` usually points into a read-only mmap of
// the checkpoint (BF16/F32 used in place) or into a shared repack file (F16/FP8 checkpoints
// dequantized once to F32). Not owning; the Checkpoint / repack mapping outlives it.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace xds {

struct MatrixRef {
  DType dtype = DType::kF32;  // kBF16 or kF32
  const void* data = nullptr;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features

  int64_t row_bytes() const { return cols * dtype_size(dtype); }
  int64_t bytes() const { return rows * row_bytes(); }
  // A view of rows [begin, begin + count).
  MatrixRef row_slice(int64_t begin, int64_t count) const {
    return {dtype, static_cast<const char*>(data) + begin * row_bytes(), count, cols};
  }
};

}  // namespace xds
