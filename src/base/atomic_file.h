// AtomicFile: an output file that appears whole or not at all.
//
// Bytes go to a temporary file beside the destination (same directory, so the final rename
// stays on one file system); commit() flushes, closes and renames it onto the destination.
// An AtomicFile destroyed without a successful commit() removes its temporary, and whatever
// was at the destination before stays as it was: a failed or interrupted run leaves no
// half-written output that a later reader could take for a whole one.
//
// Writes are buffered (flushed every kFlushBytes); the first failure (a full disk, an I/O
// error) is kept, returned by that write() and again by commit().
//
// Thread-safety: none; one writer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace xds {

class AtomicFile {
 public:
  static constexpr size_t kFlushBytes = size_t{1} << 20;

  // The temporary "<path>.tmp.<pid>.XXXXXX" is created now; an error names `path`.
  static Result<AtomicFile> create(const std::string& path);

  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&& o) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // not committed: the temporary is removed

  Status write(const void* data, size_t n);
  Status write(std::string_view text) { return write(text.data(), text.size()); }

  // Flush, close, rename onto the destination. After it (either way) the object is spent.
  Status commit();

 private:
  AtomicFile() = default;
  Status flush();
  void discard();

  std::string path_, tmp_;
  int fd_ = -1;
  std::string buffer_;
  Status error_;
};

}  // namespace xds
