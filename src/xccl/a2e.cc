#include "xccl/a2e.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "xccl/rowops.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kMore = 1, kInt8 = 2;

size_t max_domain(const A2eTopology& t) {
  size_t m = 0;
  for (const auto& d : t.domains) m = std::max(m, d.size());
  return m;
}

}  // namespace

Status validate(const A2eTopology& t, int world_size) {
  if (t.domains.empty() || t.experts.empty())
    return invalid_argument("a2e topology: need at least one domain and one expert device");
  if (t.domains.size() > 16)
    return invalid_argument("a2e topology: {} domains > 16", t.domains.size());
  std::set<int> seen;
  auto add = [&](int r) -> Status {
    if (r < 0 || r >= world_size)
      return invalid_argument("a2e topology: rank {} outside the fabric's {} devices", r,
                              world_size);
    if (!seen.insert(r).second) return invalid_argument("a2e topology: rank {} appears twice", r);
    return Status::ok_status();
  };
  for (size_t d = 0; d < t.domains.size(); ++d) {
    if (t.domains[d].empty() || t.domains[d].size() > t.experts.size())
      return invalid_argument(
          "a2e topology: domain {} has {} attention devices; it needs 1..{} "
          "(one trampoline expert device each)",
          d, t.domains[d].size(), t.experts.size());
    for (int r : t.domains[d]) XDS_RETURN_IF_ERROR(add(r));
  }
  for (int r : t.experts) XDS_RETURN_IF_ERROR(add(r));
  return Status::ok_status();
}

AttentionPos attention_pos(const A2eTopology& t, int rank) {
  for (size_t d = 0; d < t.domains.size(); ++d)
    for (size_t i = 0; i < t.domains[d].size(); ++i)
      if (t.domains[d][i] == rank) return {int(d), int(i)};
  return {};
}

A2eLayout a2e_layout(const MoeConfig& c, const A2eTopology& t, uint64_t staging) {
  A2eLayout l;
  l.exchange = exchange_layout(c, int(max_domain(t)), int(t.experts.size()), staging);
  if (!t.trampoline) {
    l.domain_stride = align_line(l.exchange.end - l.exchange.routes);
    const uint64_t areas = l.domain_stride * uint64_t(t.domains.size());
    l.exchange.end = align_line(l.exchange.routes + areas);
  }
  const uint64_t T = uint64_t(c.max_tokens), H = uint64_t(c.hidden), K = uint64_t(c.topk);
  const uint64_t RB = row_dtype_bytes(c.row_dtype), VB = row_dtype_bytes(c.vector_dtype);
  l.att_input = l.exchange.end;
  l.att_q = align_line(l.att_input + T * H * RB);
  l.att_ids = align_line(l.att_q + (c.int8 ? T * int8_row_stride(c.hidden) : 0));
  l.att_w = align_line(l.att_ids + T * K * 4);
  l.e2a_out = align_line(l.att_w + T * K * 4);
  l.end = align_line(l.e2a_out + T * H * VB);
  return l;
}

A2e::A2e(Mailbox& mb, const MoeConfig& cfg, A2eTopology topo, ThreadPool* pool)
    : mb_(mb), f_(mb.fabric()), t_(mb.transport()), cfg_(cfg), topo_(std::move(topo)), pool_(pool) {
  lay_ = a2e_layout(cfg_, topo_, f_.layout().staging);
  pos_ = attention_pos(topo_, f_.rank());
  auto it = std::find(topo_.experts.begin(), topo_.experts.end(), f_.rank());
  if (it != topo_.experts.end()) expert_index_ = int(it - topo_.experts.begin());
}

Result<std::unique_ptr<A2e>> A2e::create(Mailbox& mb, const MoeConfig& cfg, A2eTopology topo,
                                         ThreadPool* pool) {
  XDS_RETURN_IF_ERROR(validate(topo, mb.fabric().world_size()));
  const bool bf16 = cfg.row_dtype == RowDType::kBf16 && cfg.vector_dtype == RowDType::kBf16;
  const bool f32 = cfg.row_dtype == RowDType::kF32 && cfg.vector_dtype == RowDType::kF32;
  if (!bf16 && !f32)
    return unimplemented(
        "a2e carries bf16 rows and vectors, or f32 rows and vectors; the config asks for {} / {}",
        row_dtype_name(cfg.row_dtype), row_dtype_name(cfg.vector_dtype));
  if (cfg.int8 && !bf16)
    return unimplemented("a2e quantizes INT8 rows from bf16 rows only; the rows are {}",
                         row_dtype_name(cfg.row_dtype));
  const ArenaLayout& al = mb.fabric().layout();
  const A2eLayout l = a2e_layout(cfg, topo, al.staging);
  if (l.end > al.staging + al.cfg.staging_bytes)
    return resource_exhausted("a2e needs {} staging bytes, the arena has {}", l.end - al.staging,
                              al.cfg.staging_bytes);
  std::unique_ptr<A2e> a(new A2e(mb, cfg, topo, pool));
  if (!topo.trampoline) {
    // One Exchange per domain: its attention devices send, every expert device receives.
    for (size_t d = 0; d < topo.domains.size(); ++d) {
      if (a->expert_index_ < 0 && a->pos_.domain != int(d)) continue;
      ExchangeRoles roles;
      roles.senders = topo.domains[d];
      roles.receivers = topo.experts;
      roles.staging_base = l.exchange.routes + uint64_t(d) * l.domain_stride;
      XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, cfg, std::move(roles), pool));
      a->direct_.push_back(std::move(ex));
    }
    if (a->expert_index_ < 0 && a->pos_.domain < 0)
      return invalid_argument("a2e: rank {} is neither an attention nor an expert device",
                              mb.fabric().rank());
    return a;
  }
  if (a->expert_index_ >= 0) {
    ExchangeRoles roles;
    roles.senders.assign(topo.experts.begin(), topo.experts.begin() + long(max_domain(topo)));
    roles.receivers = topo.experts;
    roles.staging_base = al.staging;
    roles.meta = Channel::kA2eForward;
    roles.done = Channel::kA2eForwardDone;
    roles.ready = Channel::kE2aToTrampoline;
    roles.cdone = Channel::kE2aTrampolineDone;
    roles.tokens_op = OpKind::kA2e;
    roles.vectors_op = OpKind::kE2a;
    XDS_ASSIGN_OR_RETURN(a->ex_, Exchange::create(mb, cfg, std::move(roles), pool));
  } else if (a->pos_.domain < 0) {
    return invalid_argument("a2e: rank {} is neither an attention nor an expert device",
                            mb.fabric().rank());
  }
  return a;
}

WaitCtx A2e::ctx(OpKind op) const {
  return WaitCtx{op, deadline_after_ms(cfg_.timeout_ms), cfg_.backoff};
}

uint64_t A2e::bytes_pulled() const {
  uint64_t b = stage1_pulled_ +
               (ex_ ? ex_->stats().bytes_pulled_tokens + ex_->stats().bytes_pulled_vectors : 0);
  for (const auto& d : direct_) b += d->stats().bytes_pulled_tokens + d->stats().bytes_pulled_vectors;
  return b;
}

// ---------------------------------------------------------------- attention side

Result<uint16_t*> A2e::input_rows() {
  if (cfg_.row_dtype != RowDType::kBf16)
    return failed_precondition("a2e: input_rows() gives bf16 rows, the rows are {}",
                               row_dtype_name(cfg_.row_dtype));
  XDS_ASSIGN_OR_RETURN(std::byte * p, input_data());
  return reinterpret_cast<uint16_t*>(p);
}

Result<std::byte*> A2e::input_data() {
  if (!is_attention())
    return failed_precondition("a2e: rank {} is not an attention device", f_.rank());
  if (!direct_.empty()) return direct_[0]->input_data();
  if (att_pending_release_) {
    const int tramp = topo_.experts[size_t(pos_.index)];
    XDS_RETURN_IF_ERROR(mb_.wait_all(std::span<const int>(&tramp, 1), Channel::kA2eTrampolineDone,
                                     att_key_, ctx(OpKind::kA2e)));
    att_pending_release_ = false;
  }
  return f_.local() + lay_.att_input;
}

Status A2e::a2e_send(int n, std::span<const int32_t> ids, std::span<const float> w, uint64_t key,
                     bool more, const ExpertMap* map) {
  if (n < 0 || n > cfg_.max_tokens)
    return invalid_argument("a2e send: {} tokens outside [0, max_tokens={}]", n, cfg_.max_tokens);
  const size_t K = size_t(cfg_.topk);
  if (ids.size() < size_t(n) * K || w.size() < size_t(n) * K)
    return invalid_argument("a2e send: {} tokens need {} ids/weights, got {}/{}", n, size_t(n) * K,
                            ids.size(), w.size());
  if (!direct_.empty()) {  // no trampoline: this device routes and sends itself
    if (map == nullptr)
      return invalid_argument("a2e send without trampoline: no expert map given");
    XDS_RETURN_IF_ERROR(input_data().status());  // waits for the release
    XDS_ASSIGN_OR_RETURN(RoutePlan plan, plan_routes(*map, ids.first(size_t(n) * K),
                                                     w.first(size_t(n) * K), n, cfg_.topk));
    XDS_RETURN_IF_ERROR(direct_[0]->send_tokens(plan, map->version, n, key, more,
                                                SenderRows::kBf16));
    att_sent_.emplace_back(key, n);
    return Status::ok_status();
  }
  XDS_ASSIGN_OR_RETURN(std::byte * data, input_data());  // waits for the release
  const uint16_t* in = reinterpret_cast<const uint16_t*>(data);  // bf16 (read only with int8)
  copy_bytes(f_.local() + lay_.att_ids, ids.data(), size_t(n) * K * 4);
  copy_bytes(f_.local() + lay_.att_w, w.data(), size_t(n) * K * 4);
  if (cfg_.int8) {
    const uint64_t qs = int8_row_stride(cfg_.hidden);
    for (int t = 0; t < n; ++t)
      quantize_row_int8(in + size_t(t) * size_t(cfg_.hidden), cfg_.hidden,
                        f_.local() + lay_.att_q + uint64_t(t) * qs);
  }
  mb_.post(topo_.experts[size_t(pos_.index)], Channel::kA2eToTrampoline, key,
           MailWords{uint64_t(n), (more ? kMore : 0) | (cfg_.int8 ? kInt8 : 0), 0, 0, 0, 0});
  att_pending_release_ = true;
  att_sent_.emplace_back(key, n);
  att_key_ = key;
  return Status::ok_status();
}

Status A2e::e2a_recv(uint16_t* out, uint64_t key) {
  return e2a_recv_bytes(reinterpret_cast<std::byte*>(out), RowDType::kBf16, key);
}

Status A2e::e2a_recv(float* out, uint64_t key) {
  return e2a_recv_bytes(reinterpret_cast<std::byte*>(out), RowDType::kF32, key);
}

Status A2e::e2a_recv_bytes(std::byte* out, RowDType out_dtype, uint64_t key) {
  if (out_dtype != cfg_.vector_dtype)
    return invalid_argument("e2a recv: output given as {}, the vectors are {}",
                            row_dtype_name(out_dtype), row_dtype_name(cfg_.vector_dtype));
  if (!is_attention())
    return failed_precondition("a2e: rank {} is not an attention device", f_.rank());
  if (!direct_.empty()) {
    auto sent = std::find_if(att_sent_.begin(), att_sent_.end(),
                             [key](const auto& s) { return s.first == key; });
    if (sent == att_sent_.end())
      return failed_precondition("e2a recv: nothing was sent under key {:#x}", key);
    att_sent_.erase(sent);
    return out_dtype == RowDType::kF32
               ? direct_[0]->gather_vectors(reinterpret_cast<float*>(out), key)
               : direct_[0]->gather_vectors(reinterpret_cast<uint16_t*>(out), key);
  }
  const int tramp = topo_.experts[size_t(pos_.index)];
  MailWords m{};
  XDS_RETURN_IF_ERROR(mb_.wait_all(std::span<const int>(&tramp, 1), Channel::kE2aToAttention, key,
                                   ctx(OpKind::kE2a), std::span<MailWords>(&m, 1)));
  auto sent = std::find_if(att_sent_.begin(), att_sent_.end(),
                           [key](const auto& s) { return s.first == key; });
  if (sent == att_sent_.end() || m[0] != uint64_t(sent->second))
    return f_.poison({f_.epoch(), tramp, PoisonReason::kProtocol, OpKind::kE2a, f_.rank()});
  const int tokens = sent->second;
  att_sent_.erase(sent);
  const uint64_t bytes =
      uint64_t(tokens) * uint64_t(cfg_.hidden) * row_dtype_bytes(cfg_.vector_dtype);
  t_.get(out, MemDesc{tramp, lay_.e2a_out, bytes}, 0, bytes);
  mb_.post(tramp, Channel::kE2aAttentionDone, key, MailWords{});
  return Status::ok_status();
}

// ---------------------------------------------------------------- expert side

Status A2e::a2e_recv(int domain, const ExpertMap& map, uint64_t key) {
  if (expert_index_ < 0)
    return failed_precondition("a2e: rank {} is not an expert device", f_.rank());
  if (domain < 0 || domain >= int(topo_.domains.size()))
    return invalid_argument("a2e recv: domain {} outside [0, {})", domain, topo_.domains.size());
  if (map.n_devices != int(topo_.experts.size()) || map.slots_per_device != cfg_.slots_per_device)
    return invalid_argument("a2e recv: expert map v{} has {} devices x {} slots, expected {} x {}",
                            map.version, map.n_devices, map.slots_per_device, topo_.experts.size(),
                            cfg_.slots_per_device);
  domain_ = domain;
  partner_ = -1;
  if (!direct_.empty()) return direct_[size_t(domain)]->recv_tokens(key);
  const auto& dom = topo_.domains[size_t(domain)];
  if (ex_->sender_pos() >= 0) {
    // Trampoline: pull the partner's whole batch, then forward it as a dispatch sender.
    const size_t i = size_t(ex_->sender_pos());
    int n = 0;
    bool more = false;
    RoutePlan plan;
    plan.per_device.resize(topo_.experts.size());
    if (i < dom.size()) {
      partner_ = dom[i];
      MailWords m{};
      XDS_RETURN_IF_ERROR(mb_.wait_all(std::span<const int>(&partner_, 1),
                                       Channel::kA2eToTrampoline, key, ctx(OpKind::kA2e),
                                       std::span<MailWords>(&m, 1)));
      n = int(m[0]);
      more = (m[1] & kMore) != 0;
      if (n > cfg_.max_tokens || ((m[1] & kInt8) != 0) != cfg_.int8)
        return f_.poison({f_.epoch(), partner_, PoisonReason::kProtocol, OpKind::kA2e, f_.rank()});
      const size_t K = size_t(cfg_.topk), H = size_t(cfg_.hidden);
      std::vector<int32_t> ids(size_t(n) * K);
      std::vector<float> w(size_t(n) * K);
      t_.get(ids.data(), MemDesc{partner_, lay_.att_ids, ids.size() * 4}, 0, ids.size() * 4);
      t_.get(w.data(), MemDesc{partner_, lay_.att_w, w.size() * 4}, 0, w.size() * 4);
      if (cfg_.int8) {
        XDS_ASSIGN_OR_RETURN(std::byte * q, ex_->int8_rows());
        const uint64_t bytes = uint64_t(n) * int8_row_stride(cfg_.hidden);
        t_.get(q, MemDesc{partner_, lay_.att_q, bytes}, 0, bytes);
        stage1_pulled_ += bytes;
      } else {
        XDS_ASSIGN_OR_RETURN(std::byte * rows, ex_->input_data());
        const uint64_t bytes = uint64_t(n) * H * row_dtype_bytes(cfg_.row_dtype);
        t_.get(rows, MemDesc{partner_, lay_.att_input, bytes}, 0, bytes);
        stage1_pulled_ += bytes;
      }
      mb_.post(partner_, Channel::kA2eTrampolineDone, key, MailWords{});
      XDS_ASSIGN_OR_RETURN(plan, plan_routes(map, ids, w, n, cfg_.topk));
    } else {
      XDS_RETURN_IF_ERROR(ex_->input_data().status());  // previous round released
    }
    partner_tokens_ = n;
    XDS_RETURN_IF_ERROR(ex_->send_tokens(plan, map.version, n, key, more,
                                         cfg_.int8 ? SenderRows::kInt8 : SenderRows::kBf16));
  }
  return ex_->recv_tokens(key);
}

std::pair<int, uint32_t> A2e::row_source(int r) const {
  const RowOrigin& o = cur().received().rows[size_t(r)];
  return {topo_.domains[size_t(domain_)][size_t(o.src)], o.token};
}

Status A2e::e2a_send(uint64_t key) {
  if (expert_index_ < 0)
    return failed_precondition("a2e: rank {} is not an expert device", f_.rank());
  if (!direct_.empty()) return direct_[size_t(domain_)]->send_vectors(key);
  XDS_RETURN_IF_ERROR(ex_->send_vectors(key));
  if (ex_->sender_pos() < 0) return Status::ok_status();
  // Trampoline: its e2a_out must be free (the previous partner pulled it).
  if (last_partner_ >= 0) {
    XDS_RETURN_IF_ERROR(mb_.wait_all(std::span<const int>(&last_partner_, 1),
                                     Channel::kE2aAttentionDone, last_partner_key_,
                                     ctx(OpKind::kE2a)));
    last_partner_ = -1;
  }
  if (cfg_.vector_dtype == RowDType::kF32)
    XDS_RETURN_IF_ERROR(
        ex_->gather_vectors(reinterpret_cast<float*>(f_.local() + lay_.e2a_out), key));
  else
    XDS_RETURN_IF_ERROR(
        ex_->gather_vectors(reinterpret_cast<uint16_t*>(f_.local() + lay_.e2a_out), key));
  if (partner_ >= 0) {
    mb_.post(partner_, Channel::kE2aToAttention, key,
             MailWords{uint64_t(partner_tokens_), 0, 0, 0, 0, 0});
    last_partner_ = partner_;
    last_partner_key_ = key;
  }
  return Status::ok_status();
}

}  // namespace xds::xccl
