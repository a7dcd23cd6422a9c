// Read-only, mmap'd safetensors files and a checkpoint directory made of them.
//
// File layout (https://github.com/huggingface/safetensors, little endian):
//   [0, 8)              u64 N: length of the JSON header
//   [8, 8+N)            JSON: {"<tensor>": {"dtype": "BF16", "shape": [r, c],
//                              "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
//   [8+N, file_size)    tensor bytes; offsets are relative to 8+N, row-major, contiguous
//                       and non-overlapping, covering the data area exactly.
// Every offset, size and dtype is validated at open(); bad input gives a Status naming the
// file, the tensor, what was expected and what was found.
//
// A Checkpoint is a model directory: `model.safetensors`, or shards listed in
// `model.safetensors.index.json` ({"weight_map": {"<tensor>": "<shard file>"}}).
//
// Thread-safety: both classes are immutable after open(); every const method may be called
// from any thread. TensorView pointers and data stay valid while the Checkpoint (or
// SafetensorsFile) that returned them lives; moving it keeps them valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace xds {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;       // row-major, outermost first (HF Linear: [out, in])
  const std::byte* data = nullptr;  // into the read-only mapping
  size_t nbytes = 0;                // == numel() * dtype_size(dtype)
  std::string file;                 // the file it lives in (for error messages and cache keys)

  int64_t numel() const;
  // "[2, 3]"
  std::string shape_string() const;
};

// "[2, 3]" for any shape.
std::string format_shape(std::span<const int64_t> shape);

// The writers' side of the layout above: one tensor of a file to be written.
struct SafetensorsEntry {
  std::string_view name;
  DType dtype;
  std::span<const int64_t> shape;
  uint64_t bytes;
};
// The first 8 + N bytes of a file holding `entries`' data back to back in this order: the
// u64 length, then the JSON header ("__metadata__": {"format": "pt"} first, then the tensors
// in this order), padded with spaces to a multiple of 8: the data area is 8-byte aligned.
std::string safetensors_header(std::span<const SafetensorsEntry> entries);

// A safetensors file's header, parsed and validated against the file's size (the layout
// above): the tensors in file order (ascending data offset; `data` points into the bytes that
// were parsed) and the "__metadata__" strings.
struct SafetensorsHeader {
  std::vector<TensorView> tensors;
  std::map<std::string, std::string> metadata;
};
// Parses the `size` bytes of a whole file; `path` names it in errors (and in TensorView::file).
// Pure: SafetensorsFile::open() is this on a mapping.
Result<SafetensorsHeader> parse_safetensors_header(const std::byte* bytes, size_t size,
                                                   const std::string& path);

// model.safetensors.index.json's "weight_map": tensor name -> shard file name (a plain name in
// the checkpoint's directory; a path, "." or ".." is refused). `index_path` names the file in
// errors. Pure: Checkpoint::open() reads the file and calls this.
Result<std::map<std::string, std::string>> parse_safetensors_index(std::string_view text,
                                                                   const std::string& index_path);

// A read-only memory mapping of a whole file (MAP_SHARED, so processes share pages).
class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return map_->path(); }
  size_t file_size() const { return map_->size(); }
  // Tensors in file order (ascending data offset).
  const std::vector<TensorView>& tensors() const { return *tensors_; }
  const TensorView* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::unique_ptr<MappedFile> map_;
  std::unique_ptr<std::vector<TensorView>> tensors_;  // heap: stable across moves
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

class Checkpoint {
 public:
  // Opens dir/model.safetensors or the shards of dir/model.safetensors.index.json. Prints a
  // progress line on stderr while opening checkpoints larger than ~1 GB.
  static Result<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // nullptr if absent.
  const TensorView* find(std::string_view name) const;
  // The tensor, which must exist with exactly `shape`; otherwise an error naming the file
  // (or the directory), the tensor, the expected and the found shape.
  Result<const TensorView*> require(std::string_view name,
                                    std::initializer_list<int64_t> shape) const;
  Result<const TensorView*> require(std::string_view name, std::span<const int64_t> shape) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  size_t num_tensors() const { return by_name_.size(); }
  // Sum of the sizes of all files.
  size_t total_bytes() const { return total_bytes_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const TensorView*> by_name_;
  size_t total_bytes_ = 0;
};

}  // namespace xds
