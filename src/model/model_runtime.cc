#include "model/model_runtime.h"

#include <algorithm>
#include <system_error>
#include <thread>

namespace xds {

Result<ModelRuntime> open_model_runtime(const std::string& dir, const ModelOptions& options) {
  ModelRuntime rt;
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  try {
    rt.pool = std::make_unique<ThreadPool>(threads);
  } catch (const std::system_error& e) {
    return resource_exhausted("{}: could not start {} worker threads: {}", dir, threads, e.what());
  }
  XDS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  rt.checkpoint = std::make_unique<Checkpoint>(std::move(ckpt));
  RepackOptions repack;
  repack.pool = rt.pool.get();
  rt.store = std::make_unique<RepackCache>(repack);
  return rt;
}

}  // namespace xds
