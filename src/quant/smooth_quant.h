// SmoothQuant (Xiao et al., 2022): move activation outliers into the weights before W8A8.
//
// For linears that read the same normed input x [cols] (one RMSNorm with weight γ [cols]):
//   raw_j = max_t |x_tj|^α / max_{r, linear} |W_rj|^(1−α)     (α = --smooth-alpha)
//   s_j   = 2^round(log2(raw_j))      (1 where either maximum is 0 or raw_j is not finite)
//   γ_j  ← γ_j / s_j,   W_rj ← W_rj · s_j  for every linear reading x (router gate too)
// The power of two keeps the fold exact in any float storage dtype (BF16 γ and router gate
// included, barring underflow), so the float model computes the same logits; the quantized
// linears then see x_j / s_j, whose per-channel range is flattened.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace xds {

// s [cols] from the activation maxima act_max [cols] and the weights' column maxima
// weight_max [cols] (over every quantized linear sharing the input), by the rule above.
std::vector<float> smooth_scales(std::span<const float> act_max, std::span<const float> weight_max,
                                 double alpha);

// weight_max[c] = max(weight_max[c], max_r |w[r, c]|) for w [rows, cols].
void accumulate_column_max(std::span<const float> w, int64_t rows, int64_t cols,
                           std::span<float> weight_max);

// w [rows, cols] ← w · diag(s);  gamma [cols] ← gamma / s.
void scale_columns(std::span<float> w, int64_t rows, int64_t cols, std::span<const float> s);
void divide_by(std::span<float> gamma, std::span<const float> s);

}  // namespace xds
