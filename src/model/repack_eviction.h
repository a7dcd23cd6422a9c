// Which repack files to remove to make room: the repack cache (model/weights.h) would
// otherwise grow by every checkpoint and format it has ever seen until the disk is full.
//
// Policy: least recently used first (a file's mtime, which the cache sets on every reuse),
// never a file this process maps, until the new bytes fit two limits: the folder under the
// user's XDS_CACHE_MAX_GB, and the disk keeping keep_free bytes free. Removing a file another
// process maps is safe (its mapping keeps the pages until it ends); that process's next
// start rebuilds the file.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace xds {

struct RepackFile {
  std::string name;      // in the cache folder
  uint64_t bytes = 0;
  int64_t last_use = 0;  // ns since the epoch (mtime)
};

struct RepackLimits {
  uint64_t folder_limit = std::numeric_limits<uint64_t>::max();  // bytes the folder may hold
  uint64_t disk_free = std::numeric_limits<uint64_t>::max();     // bytes free on the disk now
  uint64_t keep_free = 0;                                        // bytes to leave free
};

// The names to remove, oldest first, so that `incoming` more bytes fit both limits; when
// even removing every file not in `in_use` is not enough, all of those (the write then
// fails on its own, naming the full disk). Ties in age go by name, so the choice is stable.
std::vector<std::string> choose_repack_evictions(std::span<const RepackFile> files,
                                                 uint64_t incoming, const RepackLimits& limits,
                                                 const std::unordered_set<std::string>& in_use);

}  // namespace xds
