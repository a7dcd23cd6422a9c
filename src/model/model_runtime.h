// What every family's load starts with: the thread pool, the checkpoint and the repack cache
// that binds its weights on that pool.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/causal_lm.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace xds {

struct ModelRuntime {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<RepackCache> store;  // binds on `pool`
};

// options.threads threads (0: one per core); ResourceExhausted naming `dir` when the OS refuses
// a thread; the checkpoint's errors as Checkpoint::open reports them.
Result<ModelRuntime> open_model_runtime(const std::string& dir, const ModelOptions& options);

}  // namespace xds
