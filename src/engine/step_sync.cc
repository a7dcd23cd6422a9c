#include "engine/step_sync.h"

#include <algorithm>
#include <limits>

namespace xds::engine {
namespace {

constexpr uint64_t kFlagAbort = 1, kFlagBusy = 2, kFlagStop = 4;
constexpr uint64_t kKnownFlags = kFlagAbort | kFlagBusy | kFlagStop;

}  // namespace

xccl::MailWords pack_step_header(const StepHeader& h) {
  const uint64_t flags =
      (h.abort ? kFlagAbort : 0) | (h.busy ? kFlagBusy : 0) | (h.stop ? kFlagStop : 0);
  return xccl::MailWords{
      (kStepHeaderMagic << 48) | (kStepHeaderVersion << 40) | (flags << 32) | uint64_t(h.epoch),
      h.step,
      uint64_t(h.tokens) | (uint64_t(h.moe_passes) << 32) | (uint64_t(h.attempt & 0xFF) << 48),
      h.map_version,
      uint64_t(h.requests) | (uint64_t(h.abort_code) << 32),
      h.wake_seq};
}

Result<StepHeader> unpack_step_header(const xccl::MailWords& w) {
  const uint64_t magic = w[0] >> 48, version = (w[0] >> 40) & 0xFF, flags = (w[0] >> 32) & 0xFF;
  if (magic != kStepHeaderMagic)
    return data_loss("step header: word 0 carries magic {:#x}, expected {:#x}", magic,
                     kStepHeaderMagic);
  if (version != kStepHeaderVersion)
    return data_loss("step header: format version {}, this build reads {}", version,
                     kStepHeaderVersion);
  if ((flags & ~kKnownFlags) != 0)
    return data_loss("step header: unknown flag bits {:#x}", flags & ~kKnownFlags);
  if ((w[2] >> 56) != 0)
    return data_loss("step header: reserved bits set (word 2 {:#x})", w[2]);
  StepHeader h;
  h.epoch = uint32_t(w[0]);
  h.abort = (flags & kFlagAbort) != 0;
  h.busy = (flags & kFlagBusy) != 0;
  h.stop = (flags & kFlagStop) != 0;
  h.step = w[1];
  h.tokens = uint32_t(w[2]);
  h.moe_passes = uint16_t(w[2] >> 32);
  h.attempt = uint32_t((w[2] >> 48) & 0xFF);
  h.map_version = w[3];
  h.requests = uint32_t(w[4]);
  h.abort_code = uint32_t(w[4] >> 32);
  h.wake_seq = w[5];
  return h;
}

const char* step_action_name(StepAction a) {
  switch (a) {
    case StepAction::kRun:
      return "run";
    case StepAction::kSkip:
      return "skip";
    case StepAction::kSleep:
      return "sleep";
    case StepAction::kStop:
      return "stop";
    case StepAction::kAbort:
      return "abort";
  }
  return "?";
}

Result<StepDecision> merge_step_headers(std::span<const StepHeader> headers) {
  if (headers.empty()) return invalid_argument("merge_step_headers: no headers");
  StepDecision d;
  const StepHeader& first = headers[0];
  d.epoch = first.epoch;
  d.step = first.step;
  d.attempt = first.attempt;
  d.next_step = first.step;
  d.map_version = std::numeric_limits<uint64_t>::max();
  bool busy = false, all_stop = true;
  int passes = 0;
  for (size_t r = 0; r < headers.size(); ++r) {
    const StepHeader& h = headers[r];
    // A requested abort outranks a mismatch: the lowest requesting rank is named.
    if (h.abort && d.cause != AbortCause::kRequested) {
      d.cause = AbortCause::kRequested;
      d.abort_rank = int(r);
      d.abort_code = h.abort_code;
    } else if (d.cause == AbortCause::kNone && h.epoch != first.epoch) {
      d.cause = AbortCause::kEpochMismatch;
      d.abort_rank = int(r);
    } else if (d.cause == AbortCause::kNone && h.step != first.step) {
      d.cause = AbortCause::kStepMismatch;
      d.abort_rank = int(r);
    } else if (d.cause == AbortCause::kNone && h.attempt != first.attempt) {
      d.cause = AbortCause::kAttemptMismatch;
      d.abort_rank = int(r);
    }
    d.total_tokens += h.tokens;
    d.max_tokens = std::max(d.max_tokens, h.tokens);
    if (h.tokens == 0) ++d.idle_devices;
    d.requests += h.requests;
    d.wake_seq = std::max(d.wake_seq, h.wake_seq);
    d.map_version = std::min(d.map_version, h.map_version);
    passes = std::max(passes, int(h.moe_passes));
    busy |= h.busy;
    all_stop &= h.stop;
  }
  if (d.cause != AbortCause::kNone) {
    d.action = StepAction::kAbort;
  } else if (d.total_tokens > 0) {
    d.action = StepAction::kRun;
    d.moe_passes = std::max(passes, 1);
    d.next_step = d.step + 1;
  } else if (busy) {
    d.action = StepAction::kSkip;
  } else if (all_stop) {
    d.action = StepAction::kStop;
  } else {
    d.action = StepAction::kSleep;
  }
  return d;
}

bool retry_step(const Status& st, uint32_t attempt) {
  return st.code() == StatusCode::kAbandoned && attempt + 1 < kMaxStepAttempts;
}

bool StepAttempts::after_execute(const Status& executed) {
  if (executed.ok()) {
    attempt_ = 0;
    return true;
  }
  if (!retry_step(executed, attempt_)) return false;
  ++attempt_;
  ++rollbacks_;
  return true;
}

StepSync::StepSync(xccl::Mailbox& mb, std::vector<int> ranks, int64_t timeout_ms)
    : mb_(mb), ranks_(std::move(ranks)), timeout_ms_(timeout_ms) {
  const int self = mb_.fabric().rank();
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == self)
      me_ = int(i);
    else
      peers_.push_back(ranks_[i]);
  }
  XDS_CHECK(me_ >= 0, "StepSync: rank {} is not among the instance's {} devices", self,
            ranks_.size());
  words_.resize(peers_.size());
  headers_.resize(ranks_.size());
}

Result<StepDecision> StepSync::exchange(const StepHeader& mine) {
  const xccl::WaitCtx ctx{xccl::OpKind::kBarrier, xccl::deadline_after_ms(timeout_ms_), {}};
  // One key for every header exchange of the epoch: a device that is a step ahead or behind
  // still gets its header through, and the merge names it (out of step) on every device.
  const uint64_t key = xccl::collective_key(mb_.fabric().epoch(), 0, kStepHeaderLayer, 0);
  XDS_RETURN_IF_ERROR(
      xccl::allgather_words(mb_, peers_, key, pack_step_header(mine), ctx, words_));
  size_t wi = 0;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (int(r) == me_) {
      headers_[r] = mine;
      continue;
    }
    auto h = unpack_step_header(words_[wi++]);
    if (!h.ok()) return h.status().with_context(fmt::format("from rank {}", ranks_[r]));
    headers_[r] = *h;
  }
  return merge_step_headers(headers_);
}

Result<std::span<const xccl::MailWords>> StepSync::exchange_words(uint16_t phase,
                                                                  const xccl::MailWords& mine) {
  const xccl::WaitCtx ctx{xccl::OpKind::kBarrier, xccl::deadline_after_ms(timeout_ms_), {}};
  const uint64_t key = xccl::collective_key(mb_.fabric().epoch(), 0, kStepHeaderLayer, phase);
  XDS_RETURN_IF_ERROR(xccl::allgather_words(mb_, peers_, key, mine, ctx, words_));
  all_words_.resize(ranks_.size());
  size_t wi = 0;
  for (size_t r = 0; r < ranks_.size(); ++r)
    all_words_[r] = int(r) == me_ ? mine : words_[wi++];
  return std::span<const xccl::MailWords>(all_words_);
}

}  // namespace xds::engine
