#include "engine/expert_slots.h"

#include "tensor/matrix_parts.h"

#include <algorithm>
#include <cstring>

namespace xds::engine {
namespace {

constexpr int64_t kAlign = 64;

int64_t align_up(int64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

// A matrix's arrays (tensor/matrix_parts.h) one after the other, each 64-byte aligned:
// payload | scales | zero points | correction (the ones it has).
int64_t matrix_bytes(const MatrixRef& m) {
  const MatrixParts p = matrix_parts(m);
  return align_up(p.data) + align_up(p.scales) + align_up(p.zero) + align_up(p.correction);
}

int64_t mlp_bytes(const MlpWeights& w) {
  return matrix_bytes(w.gate_proj) + matrix_bytes(w.up_proj) + matrix_bytes(w.down_proj);
}

// The matrix `shape` with its arrays at `at` in the order matrix_bytes() lays them out;
// advances `at` past them. With `src`, copies src's arrays there first.
MatrixRef place_matrix(const MatrixRef& shape, std::byte*& at, const MatrixRef* src) {
  const MatrixParts p = matrix_parts(shape);
  auto place = [&](const void* from, int64_t bytes) -> const std::byte* {
    if (bytes == 0) return nullptr;
    std::byte* here = at;
    if (src != nullptr) std::memcpy(here, from, size_t(bytes));
    at += align_up(bytes);
    return here;
  };
  MatrixRef m = shape;
  m.data = place(src ? src->data : nullptr, p.data);
  m.scales = reinterpret_cast<const float*>(place(src ? src->scales : nullptr, p.scales));
  m.zero = reinterpret_cast<const uint8_t*>(place(src ? src->zero : nullptr, p.zero));
  m.correction =
      reinterpret_cast<const int32_t*>(place(src ? src->correction : nullptr, p.correction));
  return m;
}

bool same_shape(const MatrixRef& a, const MatrixRef& b) {
  return a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols && a.layout == b.layout &&
         (a.scales != nullptr) == (b.scales != nullptr) && a.scale_shift == b.scale_shift &&
         (a.zero != nullptr) == (b.zero != nullptr) &&
         (a.correction != nullptr) == (b.correction != nullptr) &&
         a.group_cols == b.group_cols && a.int8_activations == b.int8_activations;
}

}  // namespace

Result<std::unique_ptr<ExpertSlotStore>> ExpertSlotStore::create(
    std::vector<const MoeWeights*> layers, int slots) {
  if (slots < 0) return invalid_argument("redundant slots {} < 0", slots);
  std::unique_ptr<ExpertSlotStore> st(new ExpertSlotStore());
  st->slots_ = slots;
  int64_t off = 0;
  for (size_t row = 0; row < layers.size(); ++row) {
    if (layers[row] == nullptr || layers[row]->experts.empty())
      return invalid_argument("expert slots: MoE layer row {} has no routed experts", row);
    const MlpWeights& shape = layers[row]->experts[0];
    for (int s = 0; s < slots; ++s) {
      Piece p;
      p.offset = off;
      p.shape = shape;
      off += mlp_bytes(shape);
      st->pieces_.push_back(p);
    }
  }
  st->bank_bytes_ = off;
  if (off > 0) {
    try {
      st->slots_bank_ = HugePageBuffer(size_t(off));
      st->staging_bank_ = HugePageBuffer(size_t(off));
    } catch (const std::bad_alloc&) {
      return resource_exhausted("expert slots: cannot reserve 2 x {} bytes", off);
    }
  }
  return st;
}

ExpertSlotStore::Piece* ExpertSlotStore::piece(int64_t row, int s) {
  if (row < 0 || row >= rows() || s < 0 || s >= slots_) return nullptr;
  return &pieces_[size_t(row * slots_ + s)];
}

int64_t ExpertSlotStore::slot_bytes(int64_t row) const {
  if (row < 0 || row >= rows() || slots_ == 0) return 0;
  return mlp_bytes(pieces_[size_t(row * slots_)].shape);
}

Status ExpertSlotStore::stage(int64_t row, int s, int logical, const MlpWeights& src) {
  Piece* p = piece(row, s);
  if (p == nullptr)
    return invalid_argument("expert slots: piece (row {}, slot {}) outside {} x {}", row, s, rows(),
                            slots_);
  if (!same_shape(src.gate_proj, p->shape.gate_proj) ||
      !same_shape(src.up_proj, p->shape.up_proj) || !same_shape(src.down_proj, p->shape.down_proj))
    return invalid_argument("expert slots: expert {} of row {} differs in shape from expert 0",
                            logical, row);
  std::byte* at = staging_bank_.as<std::byte>() + p->offset;
  (void)place_matrix(src.gate_proj, at, &src.gate_proj);
  (void)place_matrix(src.up_proj, at, &src.up_proj);
  (void)place_matrix(src.down_proj, at, &src.down_proj);
  p->staged = logical;
  return Status::ok_status();
}

Result<const MlpWeights*> ExpertSlotStore::commit(int64_t row, int s, int* logical) {
  Piece* p = piece(row, s);
  if (p == nullptr || p->staged < 0)
    return failed_precondition("expert slots: nothing staged for (row {}, slot {})", row, s);
  const int64_t n = mlp_bytes(p->shape);
  std::memcpy(slots_bank_.as<std::byte>() + p->offset, staging_bank_.as<std::byte>() + p->offset,
              size_t(n));
  // Views into the slot bank: the layout stage() wrote.
  std::byte* at = slots_bank_.as<std::byte>() + p->offset;
  p->slot.gate_proj = place_matrix(p->shape.gate_proj, at, nullptr);
  p->slot.up_proj = place_matrix(p->shape.up_proj, at, nullptr);
  p->slot.down_proj = place_matrix(p->shape.down_proj, at, nullptr);
  p->held = p->staged;
  p->staged = -1;
  if (logical != nullptr) *logical = p->held;
  return &p->slot;
}

void ExpertSlotStore::clear_staging() {
  for (Piece& p : pieces_) p.staged = -1;
}

int ExpertSlotStore::held(int64_t row, int s) const {
  if (row < 0 || row >= rows() || s < 0 || s >= slots_) return -1;
  return pieces_[size_t(row * slots_ + s)].held;
}

const MlpWeights* ExpertSlotStore::weights(int64_t row, int s) const {
  if (row < 0 || row >= rows() || s < 0 || s >= slots_) return nullptr;
  const Piece& p = pieces_[size_t(row * slots_ + s)];
  return p.held >= 0 ? &p.slot : nullptr;
}

Status FailingReplicaLoader::load(ExpertSlotStore& store, int64_t row, int s, int logical,
                                  const MlpWeights& src) {
  XDS_RETURN_IF_ERROR(inner_->load(store, row, s, logical, src));
  return unavailable("injected failure loading expert {} into redundant slot {} of MoE row {}",
                     logical, s, row);
}

}  // namespace xds::engine
