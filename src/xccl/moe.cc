#include "xccl/moe.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/check.h"
#include "xccl/rowops.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kFlagMore = 1, kFlagInt8 = 2;

// Grow-only heap buffer without zero-filling (it is written before it is read every round);
// 64-byte aligned, so that rows pulled into it start on a line (copy_bytes stores whole lines).
void grow(RowBuffer& p, size_t& cap, size_t bytes) {
  if (bytes <= cap && p) return;
  cap = std::max<size_t>(bytes, 64);
  p.reset(static_cast<std::byte*>(::operator new[](cap, std::align_val_t(64))));
}

// out[h] = sum_j w[j] * rows[j][h] over rows of type t, rounded once to t.
void weighted_sum(RowDType t, const std::byte* const* rows, const float* w, int n, int hidden,
                  std::byte* out) {
  if (t == RowDType::kF32)
    weighted_sum_f32(reinterpret_cast<const float* const*>(rows), w, n, hidden,
                     reinterpret_cast<float*>(out));
  else
    weighted_sum_bf16(reinterpret_cast<const uint16_t* const*>(rows), w, n, hidden,
                      reinterpret_cast<uint16_t*>(out));
}

// A transport operation towards `peer` failed: the step attempt is given up, not the epoch
// (Exchange::abandon).
Status op_error(const Fabric& f, OpKind op, std::string_view what, int peer) {
  return abandoned("xccl rank {}: {} rank {} failed during {}", f.rank(), what, peer,
                   op_kind_name(op));
}

// Notes the first failing peer of a parallel section (any thread).
void note_failure(std::atomic<int>& failed, int peer) {
  int none = -1;
  failed.compare_exchange_strong(none, peer, std::memory_order_relaxed);
}

int position(const std::vector<int>& v, int rank) {
  auto it = std::find(v.begin(), v.end(), rank);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

}  // namespace

const char* row_dtype_name(RowDType t) {
  return t == RowDType::kF32 ? "f32" : "bf16";
}

ExchangeLayout exchange_layout(const MoeConfig& c, int n_senders, int n_receivers, uint64_t base) {
  ExchangeLayout l;
  const uint64_t T = uint64_t(c.max_tokens), H = uint64_t(c.hidden);
  const uint64_t R = row_dtype_bytes(c.row_dtype), V = row_dtype_bytes(c.vector_dtype);
  l.routes = align_line(base);
  l.input = align_line(l.routes + uint64_t(n_receivers) * T * sizeof(RouteEntry));
  l.qrows = align_line(l.input + T * H * R);
  l.presum = align_line(l.qrows + (c.int8 ? T * int8_row_stride(c.hidden) : 0));
  l.end = align_line(l.presum + uint64_t(n_senders) * T * H * V);
  return l;
}

Exchange::Exchange(Mailbox& mb, const MoeConfig& cfg, ExchangeRoles roles, ThreadPool* pool)
    : mb_(mb),
      f_(mb.fabric()),
      t_(mb.transport()),
      cfg_(cfg),
      roles_(std::move(roles)),
      pool_(pool) {
  lay_ = exchange_layout(cfg_, int(roles_.senders.size()), int(roles_.receivers.size()),
                         roles_.staging_base);
  my_sender_ = position(roles_.senders, f_.rank());
  my_receiver_ = position(roles_.receivers, f_.rank());
  for (int r : roles_.receivers)
    if (r != f_.rank()) remote_receivers_.push_back(r);
  for (int s : roles_.senders)
    if (s != f_.rank()) remote_senders_.push_back(s);
  rows_stride_ = uint64_t(cfg_.hidden) * row_dtype_bytes(cfg_.row_dtype);
  vec_stride_ = uint64_t(cfg_.hidden) * row_dtype_bytes(cfg_.vector_dtype);
  unit_stride_ = cfg_.int8_to_experts ? int8_row_stride(cfg_.hidden) : rows_stride_;
  from_.resize(roles_.senders.size());
  from_flags_.assign(roles_.senders.size(), 0);
}

Result<std::unique_ptr<Exchange>> Exchange::create(Mailbox& mb, const MoeConfig& cfg,
                                                   ExchangeRoles roles, ThreadPool* pool) {
  if (cfg.hidden < 1 || cfg.max_tokens < 1 || cfg.topk < 1 || cfg.topk > kMaxTopk ||
      cfg.slots_per_device < 1)
    return invalid_argument(
        "moe config: hidden {}, max_tokens {}, slots_per_device {} must be >= 1 "
        "and topk {} in [1, {}]",
        cfg.hidden, cfg.max_tokens, cfg.slots_per_device, cfg.topk, kMaxTopk);
  if (cfg.int8_to_experts && !cfg.int8)
    return invalid_argument("moe config: int8_to_experts keeps INT8 rows but int8 is false");
  if (cfg.int8 && !cfg.int8_to_experts && cfg.row_dtype != RowDType::kBf16)
    return invalid_argument("moe config: INT8 dispatch quantizes bf16 rows; token rows are {}",
                            row_dtype_name(cfg.row_dtype));
  const Fabric& f = mb.fabric();
  for (const auto* v : {&roles.senders, &roles.receivers}) {
    if (v->empty()) return invalid_argument("moe exchange: empty sender or receiver list");
    for (int r : *v)
      if (r < 0 || r >= f.world_size())
        return invalid_argument("moe exchange: rank {} outside the fabric's {} devices", r,
                                f.world_size());
  }
  const ExchangeLayout l = exchange_layout(cfg, int(roles.senders.size()),
                                           int(roles.receivers.size()), roles.staging_base);
  const uint64_t have = f.layout().staging + f.layout().cfg.staging_bytes;
  if (l.routes < f.layout().staging || l.end > have)
    return resource_exhausted(
        "moe exchange needs staging [{}, {}) but the arena's staging area is "
        "[{}, {}); raise ArenaConfig::staging_bytes to at least {}",
        l.routes, l.end, f.layout().staging, have, l.end - f.layout().staging);
  return std::unique_ptr<Exchange>(new Exchange(mb, cfg, std::move(roles), pool));
}

WaitCtx Exchange::ctx(OpKind op) const {
  return WaitCtx{op, deadline_after_ms(cfg_.timeout_ms), cfg_.backoff};
}

void Exchange::parallel(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (pool_ != nullptr && pool_->num_threads() > 1 && n > 1)
    pool_->parallel_for(n, fn);
  else
    fn(0, n, 0);
}

Status Exchange::wait_released(bool tokens) {
  uint64_t& rounds = tokens ? token_rounds_ : vector_rounds_;
  uint64_t& released = tokens ? token_released_ : vector_released_;
  if (released == rounds) return Status::ok_status();
  const auto& peers = tokens ? remote_receivers_ : remote_senders_;
  const Channel ch = tokens ? roles_.done : roles_.cdone;
  XDS_RETURN_IF_ERROR(mb_.wait_all(peers, ch, key_released_[tokens ? 0 : 1],
                                   ctx(tokens ? roles_.tokens_op : roles_.vectors_op)));
  released = rounds;
  return Status::ok_status();
}

Status Exchange::abandon(uint64_t tag) {
  XDS_RETURN_IF_ERROR(mb_.abandon(tag, ctx(roles_.tokens_op)));
  // Every device stopped: nobody pulls this device's rows or pre-sums any more.
  token_released_ = token_rounds_;
  vector_released_ = vector_rounds_;
  return Status::ok_status();
}

Status Exchange::finish() {
  if (my_sender_ >= 0) XDS_RETURN_IF_ERROR(wait_released(true));
  if (my_receiver_ >= 0) XDS_RETURN_IF_ERROR(wait_released(false));
  return Status::ok_status();
}

Result<std::byte*> Exchange::input_data() {
  if (my_sender_ < 0)
    return failed_precondition("rank {} is not a sender of this exchange", f_.rank());
  XDS_RETURN_IF_ERROR(wait_released(true));
  return f_.local() + lay_.input;
}

Result<uint16_t*> Exchange::input_rows() {
  if (cfg_.row_dtype != RowDType::kBf16)
    return failed_precondition("input_rows(): this exchange's token rows are {}, not bf16",
                               row_dtype_name(cfg_.row_dtype));
  XDS_ASSIGN_OR_RETURN(std::byte * p, input_data());
  return reinterpret_cast<uint16_t*>(p);
}

Result<float*> Exchange::input_rows_f32() {
  if (cfg_.row_dtype != RowDType::kF32)
    return failed_precondition("input_rows_f32(): this exchange's token rows are {}, not f32",
                               row_dtype_name(cfg_.row_dtype));
  XDS_ASSIGN_OR_RETURN(std::byte * p, input_data());
  return reinterpret_cast<float*>(p);
}

Result<std::byte*> Exchange::int8_rows() {
  if (my_sender_ < 0 || !cfg_.int8)
    return failed_precondition("rank {}: INT8 rows need a sender with MoeConfig::int8", f_.rank());
  XDS_RETURN_IF_ERROR(wait_released(true));
  return f_.local() + lay_.qrows;
}

Status Exchange::send_tokens(const RoutePlan& plan, uint64_t map_version, int n_tokens,
                             uint64_t key, bool more, SenderRows rows) {
  if (my_sender_ < 0)
    return failed_precondition("rank {} is not a sender of this exchange", f_.rank());
  if (n_tokens < 0 || n_tokens > cfg_.max_tokens)
    return invalid_argument("moe send: {} tokens outside [0, max_tokens={}]; split into rounds",
                            n_tokens, cfg_.max_tokens);
  if (plan.per_device.size() != roles_.receivers.size())
    return invalid_argument("moe send: route plan has {} devices, the exchange {} receivers",
                            plan.per_device.size(), roles_.receivers.size());
  if (rows != SenderRows::kBf16 && !cfg_.int8)
    return invalid_argument("moe send: INT8 rows given but the exchange has no INT8 staging "
                            "(MoeConfig::int8 is false)");
  if (cfg_.int8_to_experts && rows != SenderRows::kInt8)
    return invalid_argument("moe send: MoeConfig::int8_to_experts takes INT8 rows only "
                            "(SenderRows::kInt8)");
  XDS_RETURN_IF_ERROR(wait_released(true));
  if (&plan != &plan_) plan_ = plan;  // dispatch() plans straight into plan_
  n_tokens_ = n_tokens;
  more_ = more;
  rows_ = rows;
  map_version_ = map_version;
  // Route lists for every remote receiver, and which tokens some remote receiver needs.
  std::vector<uint8_t> remote(size_t(n_tokens), 0);
  const uint64_t list_bytes = uint64_t(cfg_.max_tokens) * sizeof(RouteEntry);
  for (size_t d = 0; d < plan.per_device.size(); ++d) {
    const auto& list = plan.per_device[d];
    for (const RouteEntry& e : list)
      if (e.token >= uint32_t(n_tokens))
        return invalid_argument("moe send: route entry token {} >= n_tokens {}", e.token, n_tokens);
    if (roles_.receivers[d] == f_.rank()) continue;
    for (const RouteEntry& e : list) remote[e.token] = 1;
    if (op_failed(t_.put(MemDesc{f_.rank(), lay_.routes + d * list_bytes, list_bytes}, 0,
                         list.data(), list.size() * sizeof(RouteEntry))))
      return op_error(f_, roles_.tokens_op, "the route list put for", roles_.receivers[d]);
  }
  const bool int8 = cfg_.int8;
  if (cfg_.int8 && rows == SenderRows::kBf16) {
    const auto* in = reinterpret_cast<const uint16_t*>(f_.local() + lay_.input);
    std::byte* q = f_.local() + lay_.qrows;
    parallel(n_tokens, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t)
        if (remote[size_t(t)])
          quantize_row_int8(in + t * cfg_.hidden, cfg_.hidden,
                            q + uint64_t(t) * int8_row_stride(cfg_.hidden));
    });
  }
  // token -> (receiver, entry) references, receivers ascending (combine sums in this order).
  ref_offset_.assign(size_t(n_tokens) + 1, 0);
  for (const auto& list : plan.per_device)
    for (const RouteEntry& e : list) ++ref_offset_[e.token + 1];
  for (int t = 0; t < n_tokens; ++t) ref_offset_[size_t(t) + 1] += ref_offset_[size_t(t)];
  refs_.resize(ref_offset_.back());
  std::vector<uint32_t> cur(ref_offset_.begin(), ref_offset_.end() - 1);
  for (size_t d = 0; d < plan.per_device.size(); ++d)
    for (size_t i = 0; i < plan.per_device[d].size(); ++i)
      refs_[cur[plan.per_device[d][i].token]++] = {int32_t(d), uint32_t(i)};
  for (size_t d = 0; d < roles_.receivers.size(); ++d) {
    if (roles_.receivers[d] == f_.rank()) continue;
    if (op_failed(mb_.post(roles_.receivers[d], roles_.meta, key,
                           MailWords{plan.per_device[d].size(), map_version, uint64_t(n_tokens),
                                     (more ? kFlagMore : 0) | (int8 ? kFlagInt8 : 0), 0, 0})))
      return op_error(f_, roles_.tokens_op, "the counts to", roles_.receivers[d]);
  }
  ++token_rounds_;
  key_released_[0] = key;
  return Status::ok_status();
}

Status Exchange::recv_tokens(uint64_t key) {
  if (my_receiver_ < 0)
    return failed_precondition("rank {} is not a receiver of this exchange", f_.rank());
  const WaitCtx c = ctx(roles_.tokens_op);
  std::vector<MailWords> w(remote_senders_.size());
  XDS_RETURN_IF_ERROR(mb_.wait_all(remote_senders_, roles_.meta, key, c, w));
  any_more_ = my_sender_ >= 0 && more_;
  uint64_t version = my_sender_ >= 0 ? map_version_ : (w.empty() ? 0 : w[0][1]);
  const uint64_t list_bytes = uint64_t(cfg_.max_tokens) * sizeof(RouteEntry);
  size_t wi = 0;
  for (size_t s = 0; s < roles_.senders.size(); ++s) {
    const int rank = roles_.senders[s];
    if (rank == f_.rank()) {
      from_[s] = plan_.per_device[size_t(my_receiver_)];
      from_flags_[s] = rows_ == SenderRows::kInt8 ? int(kFlagInt8) : 0;
      continue;
    }
    const MailWords& m = w[wi++];
    if (m[1] != version || m[0] > uint64_t(cfg_.max_tokens))
      return f_.poison({f_.epoch(), rank, PoisonReason::kProtocol, c.op, f_.rank()});
    any_more_ |= (m[3] & kFlagMore) != 0;
    from_flags_[s] = int(m[3] & kFlagInt8);
    from_[s].resize(m[0]);
    if (op_failed(
            t_.get(from_[s].data(),
                   MemDesc{rank, lay_.routes + uint64_t(my_receiver_) * list_bytes, list_bytes}, 0,
                   m[0] * sizeof(RouteEntry))))
      return op_error(f_, c.op, "the route list get from", rank);
  }
  std::vector<std::span<const RouteEntry>> spans(from_.begin(), from_.end());
  group_by_expert_into(spans, cfg_.slots_per_device, layout_);
  for (const auto& list : from_)
    for (const RouteEntry& e : list)
      for (int j = 0; j < e.n_local; ++j)
        if (e.local_expert[j] >= cfg_.slots_per_device)
          return f_.poison({f_.epoch(), roles_.senders[size_t(&list - from_.data())],
                            PoisonReason::kProtocol, c.op, f_.rank()});
  const size_t RS = size_t(unit_stride_);
  unit_start_.assign(from_.size() + 1, 0);
  for (size_t s = 0; s < from_.size(); ++s)
    unit_start_[s + 1] = unit_start_[s] + uint32_t(from_[s].size());
  const size_t n_units = unit_start_.back(), n_rows = size_t(layout_.n_rows());
  grow(tokens_, tokens_cap_, n_units * RS);
  grow(out_, out_cap_, n_rows * size_t(vec_stride_));
  // Where each unit's token row lives: own uncompressed tokens stay in the input staging (no
  // copy).
  std::vector<const std::byte*> unit_row(n_units);
  // With int8_to_experts own INT8 rows stay in the qrows staging.
  const bool keep_int8 = cfg_.int8_to_experts;
  const std::byte* own_input = f_.local() + (keep_int8 ? lay_.qrows : lay_.input);
  for (size_t s = 0; s < from_.size(); ++s)
    for (size_t i = 0; i < from_[s].size(); ++i) {
      const size_t u = unit_start_[s] + i;
      const bool in_place = roles_.senders[s] == f_.rank() &&
                            (keep_int8 || !(from_flags_[s] & kFlagInt8)) &&
                            !cfg_.contiguous_rows;
      unit_row[u] = in_place ? own_input + size_t(from_[s][i].token) * RS : tokens_.get() + u * RS;
    }
  row_ptr_.resize(n_rows);
  row_unit_.resize(n_rows);
  for (size_t r = 0; r < n_rows; ++r) {
    const RowOrigin& o = layout_.rows[r];
    row_unit_[r] = int32_t(unit_start_[size_t(o.src)] + o.entry);
    row_ptr_[r] = unit_row[row_unit_[r]];
  }
  // Units = (sender, entry): each pulls its token row once; runs of consecutive tokens of one
  // sender are one copy (bf16 / f32). INT8 rows are dequantized row by row on arrival (into
  // bf16 token rows: INT8 needs them).
  std::atomic<uint64_t> pulled{0};
  const uint64_t qbytes = int8_row_bytes(cfg_.hidden);
  // Load/store transports: INT8 rows are dequantized while they are read from the peer (one
  // pass); others pull each row into a bounce buffer first.
  const bool direct = t_.caps().load_store;
  std::atomic<int> failed{-1};  // the first sender whose rows could not be pulled
  parallel(int64_t(n_units), [&](int64_t b, int64_t e, int) {
    std::vector<std::byte> tmp(direct ? 0 : qbytes);
    uint64_t my_pulled = 0;
    size_t s = size_t(std::upper_bound(unit_start_.begin(), unit_start_.end(), uint32_t(b)) -
                      unit_start_.begin()) -
               1;
    for (int64_t u = b; u < e;) {
      while (uint32_t(u) >= unit_start_[s + 1]) ++s;
      const size_t i = size_t(u) - unit_start_[s];
      const RouteEntry& r = from_[s][i];
      const int rank = roles_.senders[s];
      std::byte* dst = tokens_.get() + size_t(u) * RS;
      if (keep_int8) {  // INT8 rows as they are: one copy of values and scale
        const uint64_t off = lay_.qrows + r.token * int8_row_stride(cfg_.hidden);
        if (rank == f_.rank()) {
          if (cfg_.contiguous_rows) copy_bytes(dst, f_.local() + off, qbytes);
        } else if (direct) {
          copy_bytes(dst, f_.arena(rank) + off, qbytes);
          my_pulled += qbytes;
        } else {
          if (op_failed(t_.get(dst, MemDesc{rank, off, qbytes}, 0, qbytes)))
            note_failure(failed, rank);
          my_pulled += qbytes;
        }
        ++u;
      } else if (from_flags_[s] & kFlagInt8) {
        const uint64_t off = lay_.qrows + r.token * int8_row_stride(cfg_.hidden);
        auto* dst16 = reinterpret_cast<uint16_t*>(dst);
        if (direct) {  // dequantize straight out of the peer's staging: the pull is the read
          dequantize_row_int8(f_.arena(rank) + off, cfg_.hidden, dst16);
        } else {
          if (op_failed(t_.get(tmp.data(), MemDesc{rank, off, qbytes}, 0, qbytes)))
            note_failure(failed, rank);
          dequantize_row_int8(tmp.data(), cfg_.hidden, dst16);
        }
        if (rank != f_.rank()) my_pulled += qbytes;
        ++u;
      } else if (rank == f_.rank() && !cfg_.contiguous_rows) {
        ++u;  // read in place
      } else {
        size_t n = 1;  // run of consecutive tokens inside [b, e) and this sender's list
        while (u + int64_t(n) < e && i + n < from_[s].size() &&
               from_[s][i + n].token == r.token + n)
          ++n;
        const uint64_t bytes = n * rows_stride_;
        if (rank == f_.rank()) {  // contiguous_rows: own rows copied beside the pulled ones
          copy_bytes(dst, f_.local() + lay_.input + r.token * rows_stride_, bytes);
        } else {
          if (op_failed(
                  t_.get(dst, MemDesc{rank, lay_.input + r.token * rows_stride_, bytes}, 0, bytes)))
            note_failure(failed, rank);
          my_pulled += bytes;
        }
        u += int64_t(n);
      }
    }
    pulled.fetch_add(my_pulled, std::memory_order_relaxed);
  });
  stats_.bytes_pulled_tokens += pulled.load();
  if (const int rank = failed.load(); rank >= 0) return op_error(f_, c.op, "a row get from", rank);
  for (int rank : remote_senders_)
    if (op_failed(mb_.post(rank, roles_.done, key, MailWords{})))
      return op_error(f_, c.op, "the release to", rank);
  return Status::ok_status();
}

Status Exchange::send_vectors(uint64_t key) {
  if (my_receiver_ < 0)
    return failed_precondition("rank {} is not a receiver of this exchange", f_.rank());
  XDS_RETURN_IF_ERROR(wait_released(false));
  presummed_ = false;
  const size_t VS = size_t(vec_stride_);
  // Units of remote senders only: the own share is pre-summed inside gather_vectors.
  const int64_t own = my_sender_;
  std::byte* presum = f_.local() + lay_.presum;
  parallel(unit_start_.back(), [&](int64_t b, int64_t e, int) {
    const std::byte* rows[kMaxTopk];
    float w[kMaxTopk];
    size_t s = size_t(std::upper_bound(unit_start_.begin(), unit_start_.end(), uint32_t(b)) -
                      unit_start_.begin()) -
               1;
    for (int64_t u = b; u < e; ++u) {
      while (uint32_t(u) >= unit_start_[s + 1]) ++s;
      if (int64_t(s) == own) {
        u = int64_t(unit_start_[s + 1]) - 1;
        continue;
      }
      const size_t i = size_t(u) - unit_start_[s];
      const int n = entry_rows(s, i, rows, w);
      weighted_sum(cfg_.vector_dtype, rows, w, n, cfg_.hidden,
                   presum + (s * size_t(cfg_.max_tokens) + i) * VS);
    }
  });
  return publish_vectors(key);
}

Status Exchange::publish_vectors(uint64_t key) {
  ++vector_rounds_;
  key_released_[1] = key;
  for (size_t s = 0; s < roles_.senders.size(); ++s)
    if (roles_.senders[s] != f_.rank() &&
        op_failed(mb_.post(roles_.senders[s], roles_.ready, key,
                           MailWords{from_[s].size(), 0, 0, 0, 0, 0})))
      return op_error(f_, roles_.vectors_op, "the pre-sums' ready flag to", roles_.senders[s]);
  return Status::ok_status();
}

Status Exchange::wait_vectors_free() {
  if (my_receiver_ < 0)
    return failed_precondition("rank {} is not a receiver of this exchange", f_.rank());
  return wait_released(false);
}

std::byte* Exchange::presum_vector_data(uint32_t unit) {
  XDS_CHECK(unit < uint32_t(n_units()), "presum_vector: unit {} of {}", unit, n_units());
  const size_t s = size_t(std::upper_bound(unit_start_.begin(), unit_start_.end(), unit) -
                          unit_start_.begin()) -
                   1;
  const size_t i = unit - unit_start_[s];
  return f_.local() + lay_.presum + (s * size_t(cfg_.max_tokens) + i) * size_t(vec_stride_);
}

Status Exchange::send_presummed(uint64_t key) {
  XDS_RETURN_IF_ERROR(wait_vectors_free());
  presummed_ = true;
  return publish_vectors(key);
}

Status Exchange::combine_presummed(uint16_t* out, uint64_t key) {
  XDS_RETURN_IF_ERROR(send_presummed(key));
  return gather_vectors(out, key);
}

Status Exchange::combine_presummed(float* out, uint64_t key) {
  XDS_RETURN_IF_ERROR(send_presummed(key));
  return gather_vectors(out, key);
}

int Exchange::entry_rows(size_t s, size_t i, const std::byte** rows, float* w) const {
  const RouteEntry& r = from_[s][i];
  const uint32_t* idx = layout_.entry_row[s].data() + i * kMaxTopk;
  for (int j = 0; j < r.n_local; ++j) {
    rows[j] = out_.get() + size_t(idx[j]) * size_t(vec_stride_);
    w[j] = r.weight[j];
  }
  return r.n_local;
}

Status Exchange::gather_vectors(uint16_t* out, uint64_t key) {
  return gather_into(reinterpret_cast<std::byte*>(out), RowDType::kBf16, key);
}

Status Exchange::gather_vectors(float* out, uint64_t key) {
  return gather_into(reinterpret_cast<std::byte*>(out), RowDType::kF32, key);
}

Status Exchange::gather_into(std::byte* out, RowDType out_dtype, uint64_t key) {
  if (my_sender_ < 0)
    return failed_precondition("rank {} is not a sender of this exchange", f_.rank());
  if (out_dtype != cfg_.vector_dtype)
    return invalid_argument("combine: output given as {}, the exchange's vectors are {}",
                            row_dtype_name(out_dtype), row_dtype_name(cfg_.vector_dtype));
  XDS_RETURN_IF_ERROR(mb_.wait_all(remote_receivers_, roles_.ready, key, ctx(roles_.vectors_op)));
  const size_t VS = size_t(vec_stride_);
  const size_t max_terms = roles_.receivers.size() + kMaxTopk;
  std::atomic<uint64_t> pulled{0};
  std::atomic<int> failed{-1};  // the first receiver whose pre-sums could not be pulled
  parallel(n_tokens_, [&](int64_t b, int64_t e, int) {
    // Pulled pre-sums of one token; on load/store transports the sum reads them in place.
    const bool direct = t_.caps().load_store;
    std::vector<std::byte> tmp(direct ? 0 : remote_receivers_.size() * VS);
    std::vector<const std::byte*> rows(max_terms);
    std::vector<float> w(max_terms);
    uint64_t my_pulled = 0;
    for (int64_t t = b; t < e; ++t) {
      // Terms in ascending receiver order: a pulled pre-sum (weight 1) per remote device, the
      // own experts' outputs (their gate weights) for this device: one pass, f32, bf16 once.
      int n = 0;
      size_t n_tmp = 0;
      for (uint32_t k = ref_offset_[size_t(t)]; k < ref_offset_[size_t(t) + 1]; ++k) {
        const auto [d, i] = refs_[k];
        const int rank = roles_.receivers[size_t(d)];
        if (rank == f_.rank() && presummed_) {  // the engine's own pre-sum, in place
          rows[size_t(n)] =
              f_.local() + lay_.presum + (size_t(my_sender_) * size_t(cfg_.max_tokens) + i) * VS;
          w[size_t(n++)] = 1.f;
          continue;
        }
        if (rank == f_.rank()) {
          n += entry_rows(size_t(my_sender_), i, rows.data() + n, w.data() + n);
          continue;
        }
        const uint64_t off =
            lay_.presum + (uint64_t(my_sender_) * uint64_t(cfg_.max_tokens) + i) * VS;
        if (direct) {
          rows[size_t(n)] = f_.arena(rank) + off;
        } else {
          std::byte* dst = tmp.data() + n_tmp++ * VS;
          if (op_failed(t_.get(dst, MemDesc{rank, off, VS}, 0, VS))) note_failure(failed, rank);
          rows[size_t(n)] = dst;
        }
        my_pulled += VS;
        w[size_t(n++)] = 1.f;
      }
      weighted_sum(cfg_.vector_dtype, rows.data(), w.data(), n, cfg_.hidden, out + size_t(t) * VS);
    }
    pulled.fetch_add(my_pulled, std::memory_order_relaxed);
  });
  stats_.bytes_pulled_vectors += pulled.load();
  if (const int rank = failed.load(); rank >= 0)
    return op_error(f_, roles_.vectors_op, "a pre-sum get from", rank);
  for (int rank : remote_receivers_)
    if (op_failed(mb_.post(rank, roles_.cdone, key, MailWords{})))
      return op_error(f_, roles_.vectors_op, "the release to", rank);
  return Status::ok_status();
}

Status Exchange::dispatch(int n_tokens, std::span<const int32_t> topk_ids,
                          std::span<const float> weights, const ExpertMap& map, uint64_t key,
                          bool more, SenderRows rows, std::span<const uint32_t> spread) {
  if (map.n_devices != int(roles_.receivers.size()) ||
      map.slots_per_device != cfg_.slots_per_device)
    return invalid_argument(
        "dispatch: expert map v{} has {} devices x {} slots, the exchange {} x {}", map.version,
        map.n_devices, map.slots_per_device, roles_.receivers.size(), cfg_.slots_per_device);
  // Planned straight into plan_ (its lists' storage is reused from step to step); nothing of
  // the previous round reads plan_ any more (combine uses refs_ / from_).
  XDS_RETURN_IF_ERROR(plan_routes_into(map, topk_ids, weights, n_tokens, cfg_.topk, plan_,
                                       spread));
  XDS_RETURN_IF_ERROR(send_tokens(plan_, map.version, n_tokens, key, more, rows));
  return recv_tokens(key);
}

Status Exchange::combine(uint16_t* out, uint64_t key) {
  if (cfg_.vector_dtype != RowDType::kBf16)  // checked before anything is posted
    return gather_into(reinterpret_cast<std::byte*>(out), RowDType::kBf16, key);
  XDS_RETURN_IF_ERROR(send_vectors(key));
  return gather_vectors(out, key);
}

Status Exchange::combine(float* out, uint64_t key) {
  if (cfg_.vector_dtype != RowDType::kF32)
    return gather_into(reinterpret_cast<std::byte*>(out), RowDType::kF32, key);
  XDS_RETURN_IF_ERROR(send_vectors(key));
  return gather_vectors(out, key);
}

}  // namespace xds::xccl

namespace xds::xccl {

namespace {

template <typename T, typename Fn>
Status moe_rounds(Exchange& ex, const T* x, std::span<const int32_t> topk_ids,
                  std::span<const float> weights, int n_tokens, const ExpertMap& map, uint64_t key,
                  const Fn& expert_fn, T* out) {
  const MoeConfig& c = ex.config();
  const RowDType want = sizeof(T) == 4 ? RowDType::kF32 : RowDType::kBf16;
  if (c.row_dtype != want || c.vector_dtype != want)
    return invalid_argument("run_moe_rounds: {} rows and vectors given, the exchange has {} / {}",
                            row_dtype_name(want), row_dtype_name(c.row_dtype),
                            row_dtype_name(c.vector_dtype));
  const size_t H = size_t(c.hidden), K = size_t(c.topk);
  for (int round = 0;; ++round) {
    const int begin = std::min(n_tokens, round * c.max_tokens);
    const int n = std::min(n_tokens - begin, c.max_tokens);
    const bool more = begin + n < n_tokens;
    XDS_ASSIGN_OR_RETURN(std::byte * in, ex.input_data());
    if (n > 0) std::memcpy(in, x + size_t(begin) * H, size_t(n) * H * sizeof(T));
    XDS_RETURN_IF_ERROR(ex.dispatch(n, topk_ids.subspan(size_t(begin) * K, size_t(n) * K),
                                    weights.subspan(size_t(begin) * K, size_t(n) * K), map,
                                    key + uint64_t(round), more));
    expert_fn(ex, reinterpret_cast<T*>(ex.expert_out_data()));
    XDS_RETURN_IF_ERROR(ex.combine(out + size_t(begin) * H, key + uint64_t(round)));
    if (!ex.any_more()) return Status::ok_status();
  }
}

}  // namespace

Status run_moe_rounds(Exchange& ex, const uint16_t* x, std::span<const int32_t> topk_ids,
                      std::span<const float> weights, int n_tokens, const ExpertMap& map,
                      uint64_t key, const ExpertFn& expert_fn, uint16_t* out) {
  return moe_rounds(ex, x, topk_ids, weights, n_tokens, map, key, expert_fn, out);
}

Status run_moe_rounds(Exchange& ex, const float* x, std::span<const int32_t> topk_ids,
                      std::span<const float> weights, int n_tokens, const ExpertMap& map,
                      uint64_t key, const ExpertFnF32& expert_fn, float* out) {
  return moe_rounds(ex, x, topk_ids, weights, n_tokens, map, key, expert_fn, out);
}

}  // namespace xds::xccl
