// GroupedExperts: the routed experts of one MoE layer over rows already grouped by expert.
// Used by LocalMoeExchange (every expert in this process) and by an expert-parallel
// exchange (the rows a device received for its own expert slots).
//
// Shapes: D = hidden_size (each expert's gate_proj.cols), I = its gate_proj.rows.
//   slots:   [n_slots] the device's expert slots; slot s holds the weights of one logical
//            expert (bind_expert_slots), or nothing (nullptr: a spare slot, no rows)
//   offsets: [n_slots + 1] ascending, offsets[0] = 0: slot s's rows are grouped rows
//            [offsets[s], offsets[s + 1]); n_rows = offsets[n_slots]
//   rows:    grouped row i's input x_i is row gather[i] (i when gather is null) of `rows`,
//            `row_stride` elements apart, D elements of row_dtype (kF32, or kBF16 as an
//            exchange may carry them); or kI8 (W8A8 experts only): D int8 values quantized
//            per token (kernels/cpu/int8_quant.h's rule) and one f32 scale at byte
//            int8_scale_offset of the row, row_stride bytes apart: the W8A8 GEMM takes
//            them as they are (no dequantizing, no second quantization)
//   out:     [n_rows, D] f32, grouped order:
//              out[i] = scale[i] · down(silu(gate(x_i)) ⊙ up(x_i))   (scale null: 1)
// Each slot runs one batched MLP over its rows, [m, D] -> [m, I] (gate, up) -> [m, D]
// (down), in the compute dtype: kF32 widens bf16 rows exactly; kBF16 rounds the inputs of
// each product to bf16 (bf16 rows are taken as they are: the same values). Slots run in
// parallel, one per pool thread at a time, largest first (W8A8 experts: int8_mlp.h, each row
// quantized per token from its own values in either compute mode); each writes only its own rows,
// so the result does not depend on the thread count, the other slots or the batch.
//
// Thread-safety: one run() at a time; it uses the whole pool. Scratch grows to the largest
// slot seen and is reused (no allocation once grown).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/compute_dtype.h"
#include "model/moe_weights.h"
#include "model/int8_mlp.h"
#include "model/moe_exchange.h"
#include "tensor/dtype.h"

namespace xds {

struct GroupedExpertsInput {
  std::span<const MlpWeights* const> slots;  // [n_slots]
  std::span<const int32_t> offsets;          // [n_slots + 1]
  const void* rows = nullptr;                // see above
  DType row_dtype = DType::kF32;             // kF32, kBF16 or kI8
  int64_t row_stride = 0;                    // elements from one input row to the next
  int64_t int8_scale_offset = 0;             // kI8: bytes from a row to its f32 scale (>= D)
  const int32_t* gather = nullptr;           // [n_rows] or nullptr
  const float* scale = nullptr;              // [n_rows] or nullptr
  float* out = nullptr;                      // [n_rows, D]
  // Optional: the caller's work run in slices between the slots (MoeExchangeInput::overlap);
  // when run() returns, every slice has run.
  OverlapWork* overlap = nullptr;
};

class GroupedExperts {
 public:
  GroupedExperts(ComputeDType compute, ThreadPool& pool) : compute_(compute), pool_(pool) {}

  // InvalidArgument, naming the field, for inconsistent input (offsets not ascending or of
  // the wrong length, rows in an empty slot, slots of different shapes, a bad row dtype).
  Status run(const GroupedExpertsInput& in);

 private:
  struct ThreadScratch {
    std::vector<float> xe, gate, up;  // [m, D], [m, I], [m, I]
    std::vector<uint16_t> bf16;       // [m, max(D, I)] rounded inputs (bf16 compute)
    Int8MlpScratch int8;              // W8A8 experts: x [m, D], h [m, I] (int8_mlp.h)
  };
  void run_slot(const GroupedExpertsInput& in, const MlpWeights& mlp, int64_t begin, int64_t m,
                ThreadScratch& s);

  ComputeDType compute_;
  ThreadPool& pool_;
  ThreadPool inline_pool_{1};           // the products inside a slot run on its thread
  std::vector<int32_t> active_;         // slots with rows, largest first
  std::vector<ThreadScratch> scratch_;  // one per pool thread
};

// slot_weights[s] = &layer.experts[logical[s]] for each slot s (nullptr where logical[s] is
// -1: a spare slot). The identity map (logical[s] = s over every expert) is a device that
// holds all of them. InvalidArgument naming the slot for an id outside [-1, n_experts).
Status bind_expert_slots(const MoeWeights& layer, std::span<const int32_t> logical,
                         std::vector<const MlpWeights*>& slot_weights);

}  // namespace xds
