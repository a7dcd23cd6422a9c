#include "engine/engine_core.h"

#include <algorithm>
#include <iterator>

#include "base/clock.h"
#include "base/log.h"
#include "engine/distflow.h"
#include "engine/speculative_stage.h"
#include "model/registry.h"

namespace xds::engine {

Result<std::unique_ptr<EngineCore>> EngineCore::create(const EngineCoreOptions& options) {
  std::unique_ptr<EngineCore> core(new EngineCore(options));
  XDS_RETURN_IF_ERROR(core->init());
  return core;
}

EngineCore::EngineCore(const EngineCoreOptions& options) : o_(options) {}
EngineCore::~EngineCore() = default;

Status EngineCore::init() {
  XDS_ASSIGN_OR_RETURN(model_, load_causal_lm(o_.model_dir, o_.model));
  const ModelInfo& info = model_->info();
  max_model_len_ = o_.max_model_len > 0
                       ? std::min<int64_t>(o_.max_model_len, info.max_position_embeddings)
                       : info.max_position_embeddings;
  valid_vocab_ = o_.valid_vocab > 0 ? std::min(o_.valid_vocab, info.vocab_size) : info.vocab_size;
  if (o_.speculative_tokens > 0) {
    XDS_ASSIGN_OR_RETURN(spec_, SpeculativeStage::create(*model_, o_.speculative_tokens,
                                                         o_.speculative_mtp_layers, valid_vocab_));
  } else if (o_.speculative_mtp_layers > 0) {
    return invalid_argument("--speculative-mtp-layers {} needs --speculative-tokens k > 0",
                            o_.speculative_mtp_layers);
  }

  KvStorageShape shape;
  shape.layout = model_->kv_layout();
  shape.block_size = o_.block_size;
  shape.num_blocks = 1;
  block_bytes_ = KvStorage::bytes_for(shape);
  if (block_bytes_ <= 0) return internal_error("engine: the model's KV layout is invalid");
  const int64_t blocks = o_.kv_tokens > 0 ? (o_.kv_tokens + o_.block_size - 1) / o_.block_size
                                          : o_.kv_memory_bytes / block_bytes_;
  if (blocks < 1) {
    return invalid_argument("--kv-memory {} bytes holds no KV block ({} bytes for {} tokens)",
                            o_.kv_memory_bytes, block_bytes_, o_.block_size);
  }
  shape.num_blocks = blocks;
  kv_format_ = engine::kv_format(info, shape);
  if (o_.kv_storage) {
    XDS_ASSIGN_OR_RETURN(auto storage, o_.kv_storage(shape, kv_format_));
    storage_ = std::make_unique<KvStorage>(std::move(storage));
  } else {
    XDS_ASSIGN_OR_RETURN(auto storage, KvStorage::create(shape));
    storage_ = std::make_unique<KvStorage>(std::move(storage));
  }
  KvManagerOptions ko;
  ko.num_blocks = static_cast<int32_t>(blocks);
  ko.block_size = o_.block_size;
  ko.prefix_cache = o_.prefix_cache;
  // A cached block's last MTP row depends on the token after it (prefix_cache.h).
  ko.mtp_drop_last_hit = spec_ != nullptr;
  XDS_ASSIGN_OR_RETURN(KvManager kv, KvManager::create(ko));
  kv_ = std::make_unique<KvManager>(std::move(kv));

  RequestTableOptions to;
  to.max_num_seqs = o_.max_num_seqs;
  to.max_num_batched_tokens = o_.max_num_batched_tokens;
  to.chunked_prefill = o_.chunked_prefill;
  to.block_size = o_.block_size;
  to.max_model_len = max_model_len_;
  to.valid_vocab = valid_vocab_;
  for (int64_t id : info.eos_token_ids) to.eos_ids.push_back(static_cast<int32_t>(id));
  to.park_prefill_only = o_.park_prefill_only;
  to.all_logits = o_.all_logits;
  table_ = std::make_unique<RequestTable>(to, *kv_, storage_.get());
  table_->set_speculative(spec_.get());
  return {};
}

Status EngineCore::add_request(EngineRequest r) {
  return table_->add(std::move(r));
}

void EngineCore::set_heartbeat(std::function<void()> fn) {
  heartbeat_ = std::move(fn);
  if (!heartbeat_) {
    model_->set_layer_callback(nullptr, nullptr);
    return;
  }
  model_->set_layer_callback(
      [](void* context, int64_t /*layer*/) {
        auto* self = static_cast<EngineCore*>(context);
        const int64_t now = now_ns();
        if (now - self->heartbeat_last_ns_ < kHeartbeatPeriodNs) return;
        self->heartbeat_last_ns_ = now;
        self->heartbeat_();
      },
      this);
}

void EngineCore::cancel(const std::string& id, int32_t index) {
  table_->cancel(id, index);
}

Status EngineCore::plan() {
  return table_->plan(plan_);
}

Status EngineCore::execute(bool lockstep) {
  if (!table_->has_work()) {
    plan_.chunks.clear();
    plan_.admitted.clear();
    plan_.preempted.clear();
    plan_.unfittable.clear();
    plan_.handoffs.clear();
    plan_.handoffs_unfittable.clear();
  }
  Status st = table_->apply(plan_);
  if (st.ok()) st = model_->forward(table_->chunks(), *storage_, out_);
  if (st.ok() && heartbeat_) heartbeat_();
  if (st.ok() && o_.after_forward) st = o_.after_forward(table_->chunks(), out_);
  if (st.ok()) {
    st = table_->commit(out_, info().vocab_size, info().hidden_size, sampler_, lockstep);
  }
  if (st.ok() && agree_) st = agree_();
  if (!st.ok()) {
    Status undone = table_->rollback();
    if (!undone.ok()) XDS_LOG_WARN("engine: rolling the failed step back: {}", undone.message());
    return st;
  }
  table_->end_step();
  ++steps_;
  return {};
}

Status EngineCore::step(std::vector<TokenDelta>* deltas) {
  table_->release_finished();
  if (table_->has_work()) {
    XDS_RETURN_IF_ERROR(plan());
    XDS_RETURN_IF_ERROR(execute(/*lockstep=*/false));
  }
  std::vector<TokenDelta>& d = table_->deltas();
  if (deltas != nullptr) {
    deltas->insert(deltas->end(), std::make_move_iterator(d.begin()),
                   std::make_move_iterator(d.end()));
  }
  d.clear();
  return {};
}

}  // namespace xds::engine
