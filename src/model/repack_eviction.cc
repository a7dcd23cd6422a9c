#include "model/repack_eviction.h"

#include <algorithm>

namespace xds {

std::vector<std::string> choose_repack_evictions(std::span<const RepackFile> files,
                                                 uint64_t incoming, const RepackLimits& limits,
                                                 const std::unordered_set<std::string>& in_use) {
  uint64_t folder = 0;
  for (const RepackFile& f : files) folder += f.bytes;
  // Bytes to free for each limit (0: it already holds).
  const uint64_t over_folder =
      folder + incoming > limits.folder_limit ? folder + incoming - limits.folder_limit : 0;
  const uint64_t over_disk = limits.keep_free + incoming > limits.disk_free
                                 ? limits.keep_free + incoming - limits.disk_free
                                 : 0;
  const uint64_t need = std::max(over_folder, over_disk);
  std::vector<std::string> out;
  if (need == 0) return out;
  std::vector<const RepackFile*> candidates;
  for (const RepackFile& f : files) {
    if (!in_use.contains(f.name)) candidates.push_back(&f);
  }
  std::sort(candidates.begin(), candidates.end(), [](const RepackFile* a, const RepackFile* b) {
    return a->last_use != b->last_use ? a->last_use < b->last_use : a->name < b->name;
  });
  uint64_t freed = 0;
  for (const RepackFile* f : candidates) {
    if (freed >= need) break;
    out.push_back(f->name);
    freed += f->bytes;
  }
  return out;
}

}  // namespace xds
