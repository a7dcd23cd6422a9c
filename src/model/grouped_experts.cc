#include "model/grouped_experts.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/grow.h"
#include "kernels/cpu/int8_quant.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"

namespace xds {
namespace {

// Row-major (F32) expert matrices are 1-4 MB, so widening them for sgemm already pays from
// ~16 tokens on (docs/benchmarks.md, "Measurements behind choices in the code"). BF16 panels
// ignore the threshold: the panel kernel runs at every n (linear.h).
constexpr int64_t kExpertSgemmMinTokens = 16;

Status check_input(const GroupedExpertsInput& in, int64_t& d) {
  const size_t n_slots = in.slots.size();
  if (in.offsets.size() != n_slots + 1) {
    return invalid_argument("grouped experts: {} offsets for {} slots (want slots + 1)",
                            in.offsets.size(), n_slots);
  }
  if (in.offsets[0] != 0) {
    return invalid_argument("grouped experts: offsets[0] is {}, want 0", in.offsets[0]);
  }
  if (in.row_dtype != DType::kF32 && in.row_dtype != DType::kBF16 &&
      in.row_dtype != DType::kI8) {
    return invalid_argument("grouped experts: row dtype {}: must be F32, BF16 or I8",
                            dtype_name(in.row_dtype));
  }
  const bool int8_rows = in.row_dtype == DType::kI8;
  d = -1;
  int64_t inter = -1;
  for (size_t s = 0; s < n_slots; ++s) {
    const int32_t m = in.offsets[s + 1] - in.offsets[s];
    if (m < 0) {
      return invalid_argument("grouped experts: offsets[{}] = {} < offsets[{}] = {}", s + 1,
                              in.offsets[s + 1], s, in.offsets[s]);
    }
    const MlpWeights* w = in.slots[s];
    if (w == nullptr) {
      if (m > 0) return invalid_argument("grouped experts: {} rows in empty slot {}", m, s);
      continue;
    }
    if (int8_rows && !is_int8_mlp(*w)) {
      return invalid_argument(
          "grouped experts: INT8 rows need W8A8 experts; slot {} holds float weights", s);
    }
    if (d < 0) d = w->gate_proj.cols, inter = w->gate_proj.rows;
    if (w->gate_proj.cols != d || w->up_proj.cols != d || w->gate_proj.rows != inter ||
        w->up_proj.rows != inter || w->down_proj.rows != d || w->down_proj.cols != inter) {
      return invalid_argument(
          "grouped experts: slot {} has gate [{}, {}], up [{}, {}], down [{}, {}]; want [{}, {}], "
          "[{}, {}], [{}, {}]",
          s, w->gate_proj.rows, w->gate_proj.cols, w->up_proj.rows, w->up_proj.cols,
          w->down_proj.rows, w->down_proj.cols, inter, d, inter, d, d, inter);
    }
  }
  const int64_t n_rows = in.offsets[n_slots];
  if (n_rows > 0 && (in.rows == nullptr || in.out == nullptr || in.row_stride < d)) {
    return invalid_argument(
        "grouped experts: {} rows need rows, out and a row stride >= {} (got stride {})", n_rows, d,
        in.row_stride);
  }
  if (n_rows > 0 && int8_rows &&
      (in.int8_scale_offset < d || in.int8_scale_offset + 4 > in.row_stride)) {
    return invalid_argument(
        "grouped experts: INT8 rows of {} values need the scale at byte >= {} and within the "
        "row stride {} (scale at {})",
        d, d, in.row_stride, in.int8_scale_offset);
  }
  return {};
}

}  // namespace

Status GroupedExperts::run(const GroupedExpertsInput& in) {
  int64_t d = 0;
  XDS_RETURN_IF_ERROR(check_input(in, d));
  const int64_t n_slots = static_cast<int64_t>(in.slots.size());
  active_.clear();
  for (int64_t s = 0; s < n_slots; ++s) {
    if (in.offsets[s + 1] > in.offsets[s]) active_.push_back(static_cast<int32_t>(s));
  }
  scratch_.resize(static_cast<size_t>(pool_.num_threads()));
  // Slots differ in row counts by many times, so threads take them one at a time, largest
  // first (longest-processing-time order), instead of in fixed shares. Which thread runs a
  // slot does not change any result: each writes only its own rows.
  auto rows_of = [&](int32_t s) { return in.offsets[s + 1] - in.offsets[s]; };
  std::stable_sort(active_.begin(), active_.end(),
                   [&](int32_t a, int32_t b) { return rows_of(a) > rows_of(b); });
  if (active_.empty() && in.overlap == nullptr) return {};
  std::atomic<int64_t> next{0};
  pool_.run_on_available([&](int thread) {
    bool overlap_claimed = in.overlap == nullptr;
    for (int64_t a = next.fetch_add(1, std::memory_order_relaxed);
         a < static_cast<int64_t>(active_.size());
         a = next.fetch_add(1, std::memory_order_relaxed)) {
      const int32_t s = active_[a];
      // One slice of the caller's work before each slot: the slice is compute-bound, the
      // expert memory-bound at decode, so the two threads' mix keeps the bus busier.
      if (!overlap_claimed) overlap_claimed = in.overlap->run_slice() == OverlapWork::Slice::kDone;
      run_slot(in, *in.slots[s], in.offsets[s], rows_of(s), scratch_[thread]);
    }
    while (!overlap_claimed) {
      const OverlapWork::Slice r = in.overlap->run_slice();
      if (r == OverlapWork::Slice::kNotReady) _mm_pause();
      overlap_claimed = r == OverlapWork::Slice::kDone;
    }
  });
  return {};
}

void GroupedExperts::run_slot(const GroupedExpertsInput& in, const MlpWeights& mlp, int64_t begin,
                              int64_t m, ThreadScratch& s) {
  const int64_t d = mlp.gate_proj.cols, inter = mlp.gate_proj.rows;
  const bool bf16_rows = in.row_dtype == DType::kBF16;
  const bool int8_rows = in.row_dtype == DType::kI8;
  const int64_t element = int8_rows ? 1 : bf16_rows ? 2 : 4;
  const size_t row_bytes = static_cast<size_t>(d * element);
  auto input_row = [&](int64_t i) {  // grouped row begin + i
    const int64_t r = in.gather != nullptr ? in.gather[begin + i] : begin + i;
    return static_cast<const char*>(in.rows) + r * in.row_stride * element;
  };
  float* out = in.out + begin * d;  // [m, D]
  if (int8_rows) {
    // Rows quantized once by their producer: values and scale copied as they are.
    s.int8.x.resize(m, d);
    for (int64_t i = 0; i < m; ++i) {
      const char* row = input_row(i);
      std::memcpy(s.int8.x.q.data() + i * d, row, row_bytes);
      std::memcpy(s.int8.x.scale.data() + i, row + in.int8_scale_offset, sizeof(float));
    }
    int8_mlp(mlp, s.int8.x.ref(), out, d, s.int8, nullptr);
  } else if (is_int8_mlp(mlp)) {
    // W8A8 in either compute mode: each row quantized per token from its own values (bf16
    // rows widened exactly), then gate+up in one kernel and down on int8 (int8_mlp.h).
    s.int8.x.resize(m, d);
    for (int64_t i = 0; i < m; ++i) {
      const kernels::Int8RowsOut row{s.int8.x.q.data() + i * d, s.int8.x.scale.data() + i, d};
      if (bf16_rows) {
        kernels::quantize_rows_int8(reinterpret_cast<const uint16_t*>(input_row(i)), 1, d, d, row);
      } else {
        kernels::quantize_rows_int8(reinterpret_cast<const float*>(input_row(i)), 1, d, d, row);
      }
    }
    int8_mlp(mlp, s.int8.x.ref(), out, d, s.int8, nullptr);
  } else if (compute_ == ComputeDType::kF32) {
    float* gate = grow(s.gate, m * inter);
    float* up = grow(s.up, m * inter);
    float* xe = grow(s.xe, m * d);  // [m, D]
    for (int64_t i = 0; i < m; ++i) {
      if (bf16_rows) {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(input_row(i));
        for (int64_t j = 0; j < d; ++j) xe[i * d + j] = bf16_to_f32(src[j]);
      } else {
        std::memcpy(xe + i * d, input_row(i), row_bytes);
      }
    }
    kernels::linear_f32(xe, m, d, mlp.gate_proj, gate, inter, inline_pool_, kExpertSgemmMinTokens);
    kernels::linear_f32(xe, m, d, mlp.up_proj, up, inter, inline_pool_, kExpertSgemmMinTokens);
    kernels::silu_mul(gate, up, m * inter, gate);
    kernels::linear_f32(gate, m, inter, mlp.down_proj, out, d, inline_pool_, kExpertSgemmMinTokens);
  } else {
    float* gate = grow(s.gate, m * inter);
    float* up = grow(s.up, m * inter);
    uint16_t* xb = grow(s.bf16, m * std::max(d, inter));  // [m, D], then [m, I]
    for (int64_t i = 0; i < m; ++i) {
      if (bf16_rows) {
        std::memcpy(xb + i * d, input_row(i), row_bytes);
      } else {
        kernels::round_to_bf16(reinterpret_cast<const float*>(input_row(i)), d, xb + i * d);
      }
    }
    kernels::linear_bf16(xb, m, d, mlp.gate_proj, gate, inter, inline_pool_);
    kernels::linear_bf16(xb, m, d, mlp.up_proj, up, inter, inline_pool_);
    kernels::silu_mul(gate, up, m * inter, gate);
    kernels::round_to_bf16(gate, m * inter, xb);
    kernels::linear_bf16(xb, m, inter, mlp.down_proj, out, d, inline_pool_);
  }
  if (in.scale != nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      const float w = in.scale[begin + i];
      float* row = out + i * d;
      for (int64_t j = 0; j < d; ++j) row[j] = w * row[j];
    }
  }
}

Status bind_expert_slots(const MoeWeights& layer, std::span<const int32_t> logical,
                         std::vector<const MlpWeights*>& slot_weights) {
  const int64_t experts = static_cast<int64_t>(layer.experts.size());
  slot_weights.assign(logical.size(), nullptr);
  for (size_t s = 0; s < logical.size(); ++s) {
    const int32_t e = logical[s];
    if (e < -1 || e >= experts) {
      return invalid_argument("expert slot {}: logical expert {} outside [-1, {})", s, e, experts);
    }
    if (e >= 0) slot_weights[s] = &layer.experts[static_cast<size_t>(e)];
  }
  return {};
}

}  // namespace xds
