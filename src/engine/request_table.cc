#include "engine/request_table.h"

#include <algorithm>

#include "base/check.h"
#include "base/log.h"
#include "engine/sampler.h"
#include "engine/speculative_stage.h"

namespace xds::engine {

uint64_t choice_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  // splitmix64 of (seed, index): distinct, well-mixed streams per choice.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string finish_reason_after(const Sequence& s, int32_t token,
                                const std::vector<int32_t>& eos_ids, int64_t max_model_len) {
  const SamplingOptions& o = s.request->req.sampling;
  const bool eos = std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  if (eos && !o.ignore_eos) return "stop";
  if (std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(), token) !=
      o.stop_token_ids.end()) {
    return "stop";
  }
  if (s.output_len() >= o.max_tokens) return "length";
  if (max_model_len > 0 && static_cast<int64_t>(s.tokens.size()) >= max_model_len) return "length";
  return "";
}

namespace {

bool arrived_before(const Sequence* a, const Sequence* b) {
  return a->arrival < b->arrival;
}

}  // namespace

RequestTable::RequestTable(const RequestTableOptions& options, KvManager& kv, KvStorage* storage)
    : o_(options), kv_(kv), storage_(storage) {}

RequestTable::~RequestTable() = default;

void RequestTable::remove_from(std::vector<Sequence*>& list, const Sequence* s) {
  list.erase(std::remove(list.begin(), list.end(), s), list.end());
}

void RequestTable::insert_sorted(std::vector<Sequence*>& list, Sequence* s) {
  list.insert(std::upper_bound(list.begin(), list.end(), s, arrived_before), s);
}

Sequence* RequestTable::find(int64_t seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : it->second.get();
}

Status RequestTable::add(EngineRequest r) {
  if (requests_.count(r.id)) return invalid_argument("duplicate request id {}", r.id);
  if (!r.resume.empty()) return add_resumed(std::move(r));
  const RequestPhase phase = r.phase;
  auto req = std::make_unique<Request>();
  req->req = std::move(r);
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_++;
  seq->arrival = next_arrival_;
  next_arrival_ += 1 + req->req.sampling.n;
  seq->request = req.get();
  seq->sampling = req->req.sampling;
  seq->tokens = req->req.prompt;
  seq->target = static_cast<int64_t>(seq->tokens.size());
  req->choices.push_back(seq.get());
  if (phase == RequestPhase::kDecode) {
    // Prompt + the tokens the prefill side generated; the KV of [0, rows) arrives by DistFlow.
    const KvHandoff& h = req->req.handoff;
    seq->tokens.insert(seq->tokens.end(), h.output.begin(), h.output.end());
    seq->target = h.rows;
    seq->state = SeqState::kAwaitingKv;
    awaiting_.push_back(seq.get());
  } else {
    waiting_.push_back(seq.get());
  }
  seqs_[seq->id] = std::move(seq);
  requests_[req->req.id] = std::move(req);
  return {};
}

Status RequestTable::add_resumed(EngineRequest r) {
  const int32_t n = std::max<int32_t>(1, r.sampling.n);
  if (static_cast<int32_t>(r.resume.size()) != n ||
      (!r.resume_finished.empty() && static_cast<int32_t>(r.resume_finished.size()) != n)) {
    return invalid_argument("request {}: resumes {} choices ({} finish flags), n is {}", r.id,
                            r.resume.size(), r.resume_finished.size(), n);
  }
  if (r.phase == RequestPhase::kDecode) {
    return invalid_argument("request {}: a decode phase cannot be resumed", r.id);
  }
  auto req = std::make_unique<Request>();
  req->req = std::move(r);
  req->resumed = true;
  const EngineRequest& er = req->req;
  const int64_t arrival = next_arrival_;
  next_arrival_ += 1 + n;
  for (int32_t i = 0; i < n; ++i) {
    const std::vector<int32_t>& done = er.resume[static_cast<size_t>(i)];
    const int64_t total = static_cast<int64_t>(er.prompt.size() + done.size());
    if (o_.max_model_len > 0 && total > o_.max_model_len) {
      return invalid_argument("request {}: choice {} resumes {} tokens, the context holds {}",
                              er.id, i, total, o_.max_model_len);
    }
    auto seq = std::make_unique<Sequence>();
    seq->id = next_seq_++;
    seq->arrival = arrival + i;
    seq->request = req.get();
    seq->index = i;
    seq->sampling = er.sampling;
    seq->sampling.seed = choice_seed(er.sampling.seed, i);
    seq->tokens = er.prompt;
    seq->tokens.insert(seq->tokens.end(), done.begin(), done.end());
    seq->target = total;
    if (!er.resume_finished.empty() && er.resume_finished[static_cast<size_t>(i)] != 0) {
      seq->state = SeqState::kFinished;
      req->finished += 1;
    } else if (done.empty()) {
      waiting_.push_back(seq.get());
    } else {
      // As preempt(): everything before the last streamed token is prefilled, then that token
      // is decoded, sampling the next position.
      seq->target = total - 1;
      seq->state = SeqState::kPreempted;
      insert_sorted(preempted_, seq.get());
    }
    req->choices.push_back(seq.get());
    seqs_[seq->id] = std::move(seq);
  }
  req->choices[0]->forked = n > 1;
  requests_[req->req.id] = std::move(req);
  return {};
}

void RequestTable::cancel(const std::string& id, int32_t index) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (index < 0) it->second->cancelled = true;
  for (Sequence* s : it->second->choices) {
    if (s->state == SeqState::kPullingKv) {  // its blocks are being written: end it after
      s->cancel_after_pull = true;
      continue;
    }
    if (s->state != SeqState::kFinished && (index < 0 || s->index == index)) finish(*s, "abort");
  }
}

void RequestTable::finish(Sequence& s, const std::string& reason, bool emit) {
  s.finish_reason = reason;
  if (emit) {
    TokenDelta d;
    d.request_id = s.request->req.id;
    d.index = s.index;
    d.finish_reason = reason;
    d.prompt_tokens = static_cast<int32_t>(s.prompt_len());
    d.cached_tokens = s.cached_tokens;
    deltas_.push_back(std::move(d));
  }
  if (s.kv >= 0) {
    kv_.free(s.kv);
    s.kv = -1;
  }
  remove_from(running_, &s);
  remove_from(waiting_, &s);
  remove_from(preempted_, &s);
  remove_from(awaiting_, &s);
  if (s.state == SeqState::kParked && on_finish_parked_) on_finish_parked_(s);
  s.state = SeqState::kFinished;
  s.request->finished += 1;
}

void RequestTable::preempt(Sequence& s) {
  ++stats_.preemptions;
  if (s.kv >= 0) kv_.free(s.kv);
  s.kv = -1;
  s.computed = 0;
  s.cached_tokens = 0;
  s.spec = {};
  s.target = static_cast<int64_t>(s.tokens.size());
  // The last sampled token is an input of the next decode, not part of the prefill target:
  // recompute everything before it, then decode it as usual.
  if (s.output_len() > 0) s.target -= 1;
  s.state = SeqState::kPreempted;
  remove_from(running_, &s);
  insert_sorted(preempted_, &s);
}

int64_t RequestTable::retire_kv_blocks(int64_t count) {
  std::vector<int32_t> blocks;
  for (const Sequence* s : running_) {
    const std::span<const int32_t> table = kv_.table(s->kv);
    const auto committed = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(table.size()),
                          (kv_.length(s->kv) + o_.block_size - 1) / o_.block_size));
    for (size_t i = 0; i < committed && static_cast<int64_t>(blocks.size()) < count; ++i) {
      if (std::find(blocks.begin(), blocks.end(), table[i]) == blocks.end() &&
          !kv_.allocator().retired(table[i])) {
        blocks.push_back(table[i]);
      }
    }
  }
  kv_.retire(blocks);
  stats_.kv_blocks_retired += static_cast<int64_t>(blocks.size());
  std::vector<Sequence*> hit;
  for (Sequence* s : running_) {
    if (s->kv >= 0 && kv_.holds_retired(s->kv)) hit.push_back(s);
  }
  for (Sequence* s : hit) {
    preempt(*s);
    ++stats_.retired_recomputes;
  }
  return static_cast<int64_t>(blocks.size());
}

void RequestTable::release_finished(std::vector<std::string>* released) {
  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& r = *it->second;
    const int32_t n = r.req.sampling.n;
    const bool all = r.finished >= static_cast<int32_t>(r.choices.size()) &&
                     (static_cast<int32_t>(r.choices.size()) == n || r.cancelled ||
                      r.choices[0]->state == SeqState::kFinished);
    if (!all) {
      ++it;
      continue;
    }
    for (Sequence* s : r.choices) seqs_.erase(s->id);
    if (released != nullptr) released->push_back(it->first);
    it = requests_.erase(it);
  }
}

void RequestTable::start_pull(Sequence& s) {
  remove_from(awaiting_, &s);
  s.state = SeqState::kPullingKv;
  pulling_.push_back(&s);
}

void RequestTable::end_pull(Sequence& s) {
  remove_from(pulling_, &s);
  s.state = SeqState::kAwaitingKv;  // for finish(): nothing writes its blocks any more
}

void RequestTable::retire_bad_blocks(std::span<const int32_t> bad) {
  std::vector<int32_t> fresh;
  for (const int32_t b : bad) {
    if (!kv_.allocator().retired(b) && std::find(fresh.begin(), fresh.end(), b) == fresh.end())
      fresh.push_back(b);
  }
  kv_.retire(fresh);
  stats_.kv_blocks_retired += static_cast<int64_t>(fresh.size());
}

void RequestTable::recompute_handoff(Sequence& s, std::span<const int32_t> bad) {
  XDS_CHECK(s.state == SeqState::kAwaitingKv && s.output_len() > 0,
            "recompute_handoff: seq {} is not an awaiting handoff", s.id);
  retire_bad_blocks(bad);
  remove_from(awaiting_, &s);
  if (s.kv >= 0) kv_.free(s.kv);
  s.kv = -1;
  s.computed = 0;
  s.cached_tokens = 0;
  s.spec = {};
  // As preempt(): the last sampled token is the next decode's input, not prefilled.
  s.target = static_cast<int64_t>(s.tokens.size()) - 1;
  s.state = SeqState::kPreempted;
  insert_sorted(preempted_, &s);
}

void RequestTable::start_running(Sequence& s) {
  s.state = SeqState::kRunning;
  insert_sorted(running_, &s);
}

void RequestTable::park(Sequence& s) {
  s.state = SeqState::kParked;
  remove_from(running_, &s);
}

Status RequestTable::plan(StepPlan& plan) {
  auto fill = [&](const std::vector<Sequence*>& from, std::vector<SchedSeq>& to) {
    to.clear();
    for (const Sequence* s : from) {
      SchedSeq q;
      q.id = s->id;
      q.arrival = s->arrival;
      q.target = s->target;
      q.computed = s->computed;
      q.blocks_held = s->kv >= 0 ? static_cast<int64_t>(kv_.table(s->kv).size()) : 0;
      if (s->state != SeqState::kRunning) {
        const auto hit = kv_.match_prefix(
            std::span<const int32_t>(s->tokens).first(static_cast<size_t>(s->target)),
            (s->target - 1) / o_.block_size);
        q.hit_blocks = hit.blocks;
        q.hit_evictable = hit.evictable;
      }
      to.push_back(q);
    }
  };
  fill(running_, sched_in_.running);
  fill(preempted_, sched_in_.preempted);
  fill(waiting_, sched_in_.waiting);
  sched_in_.awaiting.clear();
  for (const Sequence* s : awaiting_)
    sched_in_.awaiting.push_back({.id = s->id, .rows = s->request->req.handoff.rows});
  SchedulerLimits lim;
  lim.max_num_seqs = o_.max_num_seqs;
  lim.max_num_batched_tokens = o_.max_num_batched_tokens;
  lim.free_blocks = kv_.available();
  lim.total_blocks = kv_.allocator().num_blocks();
  lim.block_size = o_.block_size;
  lim.chunked_prefill = o_.chunked_prefill;
  lim.lookahead = spec_ ? spec_->draft_tokens() : 0;
  lim.max_model_len = o_.max_model_len;
  return schedule(sched_in_, lim, &plan);
}

Status RequestTable::apply(const StepPlan& plan) {
  plan_ = &plan;
  saved_.clear();
  forked_.clear();
  handoffs_.clear();
  for (int64_t id : plan.preempted) preempt(*seqs_.at(id));
  for (int64_t id : plan.unfittable) {
    Sequence& s = *seqs_.at(id);
    finish(s, "abort");
    XDS_LOG_WARN("request {} needs more KV than the whole cache holds", s.request->req.id);
  }
  for (const StepAdmission& a : plan.admitted) {
    Sequence& s = *seqs_.at(a.seq);
    s.kv = kv_.add_sequence();
    kv_.expect(s.kv, s.prompt_len() + s.sampling.max_tokens);
    const int64_t attached = kv_.attach_prefix(
        s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.target)),
        a.hit_blocks);
    stats_.prefix_hits += attached / o_.block_size;
    stats_.prefix_queries += (s.target - 1) / o_.block_size;
    s.computed = attached;
    // The attached blocks' MTP rows are final (the hit stops a block short: prefix_cache.h).
    s.spec = {};
    s.spec.length = s.spec.mtp_length = attached;
    if (s.output_len() == 0 || s.state == SeqState::kWaiting) {
      s.cached_tokens = static_cast<int32_t>(std::min(s.computed, s.prompt_len()));
    }
    remove_from(waiting_, &s);
    remove_from(preempted_, &s);
    s.state = SeqState::kRunning;
    running_.push_back(&s);
  }
  std::sort(running_.begin(), running_.end(), arrived_before);
  deltas_before_ = deltas_.size();
  chunks_.clear();
  chunk_seqs_.clear();
  for (const StepChunk& c : plan.chunks) {
    Sequence& s = *seqs_.at(c.seq);
    XDS_CHECK(c.start == s.computed, "chunk of seq {} starts at {}, computed {}", c.seq, c.start,
              s.computed);
    saved_.push_back({.seq = &s,
                      .tokens = static_cast<int64_t>(s.tokens.size()),
                      .computed = s.computed,
                      .target = s.target,
                      .kv = s.kv,
                      .finished = s.request->finished,
                      .spec = s.spec,
                      .forked = s.forked});
    TokenChunk tc;
    tc.start_pos = c.start;
    if (spec_ && c.decode) {  // verify [x_L, drafts] (the budget counted k drafts)
      spec_->verify_tokens(s);
      tc.tokens = s.verify;
      tc.all_logits = true;
    } else {
      tc.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(c.start),
                                                             static_cast<size_t>(c.count));
      tc.all_logits = o_.all_logits;
    }
    XDS_RETURN_IF_ERROR(kv_.reserve(s.kv, c.start + static_cast<int64_t>(tc.tokens.size())));
    tc.blocks = kv_.table(s.kv);
    chunks_.push_back(tc);
    chunk_seqs_.push_back(&s);
  }
  return {};
}

Status RequestTable::commit(const StepOutput& out, int64_t vocab, int64_t hidden_size,
                            Sampler& sampler, bool run_empty_passes) {
  // out.logits: per chunk one row (its last token), or one per token for a verify chunk and,
  // with RequestTableOptions::all_logits, for a prefill chunk (TokenChunk::all_logits);
  // out.hidden: every token's final-normed hidden, in chunk order.
  int64_t logit_row = 0, token_row = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const int64_t count = static_cast<int64_t>(chunks_[i].tokens.size());
    const int64_t rows = chunks_[i].all_logits ? count : 1;
    const float* logits = out.logits.data() + logit_row * vocab;
    const float* hidden = spec_ ? out.hidden.data() + token_row * hidden_size : nullptr;
    logit_row += rows;
    token_row += count;
    if (chunk_seqs_[i]->state != SeqState::kRunning) continue;  // cancelled during the step
    if (spec_ && plan_->chunks[i].decode) {
      XDS_RETURN_IF_ERROR(commit_verify(i, logits, hidden, vocab, hidden_size, sampler));
    } else {
      XDS_RETURN_IF_ERROR(
          commit_prefill(i, logits + (rows - 1) * vocab, hidden, hidden_size, sampler));
    }
  }
  if (!spec_) return {};
  return spec_->propose(running_, kv_, *storage_, o_.max_model_len, run_empty_passes);
}

bool RequestTable::emit_token(Sequence& t, int32_t token, TokenDelta& d) {
  t.tokens.push_back(token);
  d.tokens.push_back(token);
  d.finish_reason = finish_reason_after(t, token, o_.eos_ids, o_.max_model_len);
  return d.finish_reason.empty();
}

Status RequestTable::commit_prefill(size_t i, const float* row, const float* hidden,
                                    int64_t hidden_size, Sampler& sampler) {
  const StepChunk& c = plan_->chunks[i];
  Sequence& s = *chunk_seqs_[i];
  s.computed = c.start + c.count;
  XDS_RETURN_IF_ERROR(
      kv_.commit(s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed))));
  if (spec_) spec_->commit_rows(s, hidden, c.count, hidden_size);
  // Sample only once every known token has KV: a recomputed (preempted) sequence's last
  // prefill chunk stops before its last sampled token, which its next decode feeds.
  if (s.computed < static_cast<int64_t>(s.tokens.size())) return {};
  if (s.computed == s.target && s.output_len() == 0 && s.index == 0 &&
      s.request->req.sampling.n > 1 && !s.forked) {
    XDS_RETURN_IF_ERROR(fork_choices(s));
  }
  // Every choice that shares this prefill samples its first token from the same row.
  samplers_.assign(1, &s);
  if (s.forked && s.output_len() == 0 && !s.request->resumed) {
    for (size_t k = 1; k < s.request->choices.size(); ++k) {
      if (s.request->choices[k]->output_len() == 0) samplers_.push_back(s.request->choices[k]);
    }
  }
  for (Sequence* t : samplers_) {
    SampleInput in;
    in.logits = row;
    in.valid_vocab = o_.valid_vocab;
    const SamplingOptions& opts = t->sampling;
    in.options = &opts;
    in.prompt = t->request->req.prompt;
    in.output = std::span<const int32_t>(t->tokens).subspan(static_cast<size_t>(t->prompt_len()));
    in.position = static_cast<int64_t>(t->tokens.size());
    in.draw = 0;
    TokenLogprob lp;
    XDS_ASSIGN_OR_RETURN(int32_t token, sampler.sample(in, opts.logprobs >= 0 ? &lp : nullptr));
    TokenDelta d;
    d.request_id = t->request->req.id;
    d.index = t->index;
    if (opts.logprobs >= 0) d.logprobs.push_back(std::move(lp));
    d.prompt_tokens = static_cast<int32_t>(t->prompt_len());
    d.cached_tokens = t->cached_tokens;
    emit_token(*t, token, d);
    const std::string reason = d.finish_reason;
    deltas_.push_back(std::move(d));
    if (!reason.empty()) {
      finish(*t, reason, /*emit=*/false);
    } else if (o_.park_prefill_only && t->request->req.phase == RequestPhase::kPrefillOnly &&
               t->request->req.sampling.n == 1) {
      t->handoff_delta = static_cast<int64_t>(deltas_.size()) - 1;
      handoffs_.push_back(t);
    }
  }
  return {};
}

Status RequestTable::commit_verify(size_t i, const float* rows, const float* hidden, int64_t vocab,
                                   int64_t hidden_size, Sampler& sampler) {
  const StepChunk& c = plan_->chunks[i];
  Sequence& s = *chunk_seqs_[i];
  const SamplingOptions& opts = s.sampling;
  XDS_ASSIGN_OR_RETURN(const SpecVerifyResult* verdict,
                       spec_->verify(sampler, s, rows, vocab, o_.valid_vocab));
  const int64_t accepted = verdict->accepted;
  // Rows [x_L, d_1 .. d_accepted] are final; the run's tokens go out one by one, up to a stop.
  s.computed = c.start + accepted + 1;
  TokenDelta d;
  d.request_id = s.request->req.id;
  d.index = s.index;
  d.prompt_tokens = static_cast<int32_t>(s.prompt_len());
  d.cached_tokens = s.cached_tokens;
  for (size_t r = 0; r < verdict->tokens.size(); ++r) {
    const int32_t token = verdict->tokens[r];
    if (opts.logprobs >= 0) {
      TokenLogprob lp;
      XDS_RETURN_IF_ERROR(sampler.raw_logprobs(rows + static_cast<int64_t>(r) * vocab,
                                               o_.valid_vocab, token, opts.logprobs, &lp));
      d.logprobs.push_back(std::move(lp));
    }
    if (!emit_token(s, token, d)) break;
  }
  const std::string reason = d.finish_reason;
  deltas_.push_back(std::move(d));
  if (!reason.empty()) {
    finish(s, reason, /*emit=*/false);
    return {};
  }
  XDS_RETURN_IF_ERROR(
      kv_.commit(s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed))));
  XDS_RETURN_IF_ERROR(kv_.truncate(s.kv, s.computed));  // the rejected drafts' rows
  spec_->commit_rows(s, hidden, accepted + 1, hidden_size);
  return {};
}

Status RequestTable::fork_choices(Sequence& parent) {
  Request& r = *parent.request;
  parent.forked = true;
  for (int32_t k = 1; k < r.req.sampling.n; ++k) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_++;
    child->arrival = parent.arrival + k;
    child->request = &r;
    child->index = k;
    child->sampling = r.req.sampling;
    child->sampling.seed = choice_seed(r.req.sampling.seed, k);
    child->tokens = parent.tokens;
    child->computed = parent.computed;
    child->target = parent.target;
    child->cached_tokens = parent.cached_tokens;
    child->spec = parent.spec;
    child->spec_committed = parent.spec_committed;
    copies_.clear();
    XDS_ASSIGN_OR_RETURN(child->kv, kv_.fork(parent.kv, copies_));
    XDS_CHECK(copies_.empty() || storage_ != nullptr, "fork of seq {} needs the KV storage",
              parent.id);
    for (const BlockCopy& c : copies_) storage_->copy_block(c.src, c.dst);
    kv_.expect(child->kv, child->prompt_len() + child->sampling.max_tokens);
    child->state = SeqState::kRunning;
    running_.push_back(child.get());
    r.choices.push_back(child.get());
    forked_.push_back(child.get());
    seqs_[child->id] = std::move(child);
  }
  std::sort(running_.begin(), running_.end(), arrived_before);
  return {};
}

void RequestTable::end_step() {
  plan_ = nullptr;
  saved_.clear();
  forked_.clear();
}

Status RequestTable::rollback() {
  Status first;
  for (Sequence* c : forked_) {  // the choices forked in the step
    if (c->kv >= 0) kv_.free(c->kv);
    remove_from(running_, c);
    Request& r = *c->request;
    if (c->state == SeqState::kFinished) r.finished -= 1;
    r.choices.erase(std::remove(r.choices.begin(), r.choices.end(), c), r.choices.end());
    seqs_.erase(c->id);
  }
  forked_.clear();
  for (const Saved& v : saved_) {
    Sequence& s = *v.seq;
    s.tokens.resize(static_cast<size_t>(v.tokens));
    s.spec = v.spec;
    s.spec_committed = false;
    s.forked = v.forked;
    s.handoff_delta = -1;
    s.finish_reason.clear();
    if (s.state == SeqState::kFinished) {
      // Finished in the step: its KV went back. Recomputed from its tokens.
      s.request->finished = v.finished;
      s.kv = -1;
      s.state = SeqState::kRunning;
      preempt(s);
      --stats_.preemptions;
      continue;
    }
    s.computed = v.computed;
    s.target = v.target;
    copies_.clear();
    Status st = kv_.rewind(
        s.kv, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.computed)), copies_);
    if (!st.ok() && first.ok()) first = st;
    for (const BlockCopy& c : copies_) storage_->copy_block(c.src, c.dst);
  }
  saved_.clear();
  deltas_.resize(std::min(deltas_.size(), deltas_before_));
  handoffs_.clear();
  plan_ = nullptr;
  return first;
}

}  // namespace xds::engine
