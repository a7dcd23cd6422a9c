// RepackBundle: the repack payloads of a group of matrices — one MoE layer's routed experts —
// in one file of the repack cache, mapped as one range that starts on a 2 MB boundary.
//
// Why: a file mapping gets a 2 MB page only for a 2 MB-aligned 2 MB piece of its file. A
// routed expert of bench-2.6b is 1 MB in int8 (0.5 MB in 4 bits); alone in its repack file it
// lies in 4 KB pages, one TLB miss every 64 lines, and the int8 expert kernels then stream
// about 4× slower than from 2 MB pages (docs/benchmarks.md, "Weights in 2 MB pages"). In a
// bundle the layer's experts are one range of 2 MB pages, still one shared copy in the page
// cache for every process that maps it.
//
// File layout (dir/<hash>.xrb, little endian):
//   [0, P)          payloads, each at a 64-byte aligned offset, in the order they were bound
//   [P, P+I)        index, per payload: u64 offset, u64 bytes, u64 key length K, the key
//                   (verified on reuse), zero padding to 8 bytes
//   [P+I, P+I+32)   footer: magic "XDSRPB01", u64 P, u64 I, u64 payload count
// Payloads come first so that the file's offset 0 is the mapping's 2 MB-aligned start.
//
// Reuse: the index must list the same (key, bytes) in the order this run binds them. The
// first difference turns the bundle into a rebuild that keeps the matching prefix; a rebuilt
// bundle is written under a temporary name `<hash>.xrb.tmp.<pid>.XXXXXX` and renamed into
// place at finish(), as single repack files are.
//
// Thread-safety: none; one binding thread (fill callbacks may use a pool themselves).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace xds {

class RepackBundle {
 public:
  using Fill = std::function<Status(std::byte*)>;

  // Reserves address space for the bundle at `path` (nothing is committed) and maps the
  // existing file there if it is a valid bundle.
  static Result<std::unique_ptr<RepackBundle>> open(std::string path);
  ~RepackBundle();  // unmaps the range unless finish() handed it over
  RepackBundle(const RepackBundle&) = delete;
  RepackBundle& operator=(const RepackBundle&) = delete;

  // The next payload: the existing file's if its next index entry is (key, nbytes)
  // (*reused = true), else fill() on 64-byte aligned writable memory of nbytes. The pointer
  // stays valid, with the same bytes, for as long as the range is mapped.
  Result<const std::byte*> get_or_create(const std::string& key, size_t nbytes, const Fill& fill,
                                         bool* reused);

  // The mapped range [base, base + bytes), to be unmapped by its new owner with munmap.
  struct Range {
    std::byte* base = nullptr;
    size_t bytes = 0;
  };
  // Writes the bundle file if anything was filled (resource_exhausted on a full disk; the
  // payloads stay valid in anonymous memory either way), maps it over the range, and
  // returns the range (trimmed to the payloads, in 2 MB pages).
  Result<Range> finish();

  const std::string& path() const { return path_; }
  // Bytes finish() will write: the whole file when this run filled anything, else 0.
  size_t bytes_to_write() const;

 private:
  struct Entry {
    std::string key;
    size_t offset = 0, bytes = 0;
  };
  explicit RepackBundle(std::string path) : path_(std::move(path)) {}
  void map_existing();
  Status start_building();
  Status write_file() const;

  std::string path_;
  std::byte* base_ = nullptr;  // 2 MB aligned, reserved_ bytes of address space
  std::byte* reservation_ = nullptr;
  size_t reservation_bytes_ = 0, reserved_ = 0;
  std::vector<Entry> existing_;  // the index of the file mapped at base_ (if any)
  size_t existing_bytes_ = 0;    // its payload bytes P
  std::vector<Entry> bound_;     // this run's payloads, in order
  size_t used_ = 0;              // end of the last bound payload
  bool building_ = false;        // base_ holds anonymous memory filled by this run
};

}  // namespace xds
