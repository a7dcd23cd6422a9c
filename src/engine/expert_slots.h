// ExpertSlotStore: the memory of one device's redundant expert slots (EPLB, P066–P079), and
// the loaders that fill it.
//
// Every MoE layer (rows in the exchange's moe_layers() order) has S redundant slots; each
// holds one routed expert of that layer: gate_proj [I, D], up_proj [I, D], down_proj [D, I]
// in the checkpoint's dtype and layout (the same MatrixRef shape as the model's own copy,
// with every array it points to: FP8 scales, int8 scales and corrections, int4 scales, zero
// points and column order; tensor/matrix_parts.h). Two banks of the same shape are reserved (and every page written) at
// creation, so running out of memory is an error at start, not during a rebalance:
//
//   bank b ∈ {slots, staging}, piece (row, s):  base_b + (row · S + s) · slot_bytes(row)…
//   (precisely: offsets are prefix sums of slot_bytes over (row, s) in row-major order)
//   inside a piece, 64-byte aligned:  gate payload | gate scales | gate zero | gate correction
//                                     | the same for up | the same for down   (those it has)
//
// Phase 1 of a reconfiguration ("prefetch") copies an expert's weights from the loaded model
// into the staging piece (ReplicaLoader::load); phase 3 ("load") copies staging into the slot
// piece (commit), which is a plain copy that cannot fail, done while no map in force uses the
// slot.
//
// Thread-safety: not thread-safe; the device's main thread owns it. MlpWeights handed out
// stay valid while the store lives (their bytes change only through commit()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/huge_page_buffer.h"
#include "base/status.h"
#include "model/moe_weights.h"

namespace xds::engine {

class ExpertSlotStore {
 public:
  // layers: [moe layers] the model's routed experts of each MoE layer (expert 0 gives the
  // shape); slots: S >= 0. InvalidArgument for a layer without experts.
  static Result<std::unique_ptr<ExpertSlotStore>> create(std::vector<const MoeWeights*> layers,
                                                         int slots);

  int slots() const { return slots_; }
  int64_t rows() const { return static_cast<int64_t>(pieces_.size()) / std::max(slots_, 1); }
  int64_t bytes() const { return 2 * bank_bytes_; }  // both banks
  int64_t slot_bytes(int64_t row) const;

  // Phase 1: expert `logical` (weights `src`, of the layer's shape) into staging (row, s).
  // InvalidArgument for an out-of-range piece or a matrix of another size.
  Status stage(int64_t row, int s, int logical, const MlpWeights& src);
  // Phase 3: staging (row, s) into slot (row, s); the slot's weights. FailedPrecondition when
  // nothing was staged there.
  Result<const MlpWeights*> commit(int64_t row, int s, int* logical);
  void clear_staging();
  // The expert slot (row, s) holds (-1: none) and its weights (nullptr: none).
  int held(int64_t row, int s) const;
  const MlpWeights* weights(int64_t row, int s) const;

 private:
  struct Piece {
    int64_t offset = 0;          // in a bank
    MlpWeights shape;            // the layer's expert shape (data: the model's expert 0)
    int staged = -1, held = -1;  // expert in staging / in the slot
    MlpWeights slot;             // views into the slots bank (when held >= 0)
  };
  ExpertSlotStore() = default;
  Piece* piece(int64_t row, int s);

  int slots_ = 0;
  int64_t bank_bytes_ = 0;
  std::vector<Piece> pieces_;  // [rows, S]
  HugePageBuffer slots_bank_, staging_bank_;
};

// Phase 1's source: puts an expert's weights into staging. The real one copies from the loaded
// model; a test wraps it to fail (fault-injecting decorator, not a mock).
class ReplicaLoader {
 public:
  virtual ~ReplicaLoader() = default;
  virtual Status load(ExpertSlotStore& store, int64_t row, int s, int logical,
                      const MlpWeights& src) = 0;
};

// Copies the model's weights (ExpertSlotStore::stage).
class CopyReplicaLoader final : public ReplicaLoader {
 public:
  Status load(ExpertSlotStore& store, int64_t row, int s, int logical,
              const MlpWeights& src) override {
    return store.stage(row, s, logical, src);
  }
};

// Forwards to `inner` and fails every load with Unavailable after the inner one ran (the
// staging then holds the copy, and the failure must still abort the reconfiguration).
class FailingReplicaLoader final : public ReplicaLoader {
 public:
  explicit FailingReplicaLoader(std::unique_ptr<ReplicaLoader> inner) : inner_(std::move(inner)) {}
  Status load(ExpertSlotStore& store, int64_t row, int s, int logical,
              const MlpWeights& src) override;

 private:
  std::unique_ptr<ReplicaLoader> inner_;
};

}  // namespace xds::engine
