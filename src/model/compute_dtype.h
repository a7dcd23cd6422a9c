// The compute dtype of a model's forward pass (--compute-dtype).
#pragma once

namespace xds {

enum class ComputeDType {
  kF32,   // reference: fp32 activations, weights widened on the fly
  kBF16,  // fast: linear-layer inputs rounded to bf16 (AVX512-BF16 dot products)
};

}  // namespace xds
