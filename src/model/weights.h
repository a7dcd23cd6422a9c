// Binding checkpoint tensors into the kernels' layout (tensor/matrix.h).
//
// BF16 and F32 weights are used in place: the MatrixRef points into the read-only mmap of
// the safetensors file (zero copy; every process on the host shares the page cache).
// F16 and block-FP8 weights are dequantized to F32 exactly once, into a repack file in a
// shared cache directory, written to a temporary file and renamed atomically, then mmap'd
// read-only: later binds, in this process or any other, map the same file
// (docs/design/architecture.md, "Weights are shared, not copied").
//
// Block FP8 (published DeepSeek-V3 layout): `<name>` is F8_E4M3 [rows, cols] and
// `<name>_scale_inv` is F32 [ceil(rows/128), ceil(cols/128)];
//   weight[r][c] = f32(fp8[r][c]) * scale_inv[r/128][c/128]   (one f32 multiply; edge
//   blocks are partial).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/repack_bundle.h"
#include "model/repack_eviction.h"
#include "model/safetensors.h"
#include "tensor/matrix.h"

namespace xds {

// Environment setting XDS_CACHE_DIR: the repack cache directory. Default
// $HOME/.cache/xdeepserve/repack (or /tmp/xdeepserve-repack without HOME).
std::string repack_cache_dir_from_env();

struct RepackOptions {
  std::string dir;             // empty: repack_cache_dir_from_env()
  ThreadPool* pool = nullptr;  // optional: parallel dequantization
  bool progress = true;        // progress line on stderr for checkpoints > ~1 GB
};

// Owns the repack-file mappings and converted vectors that bound weights point into; it
// must outlive every MatrixRef / span bound through it.
// Thread-safety: not thread-safe; bind from one thread (the dequantization itself may use
// the pool given in RepackOptions).
class RepackCache {
 public:
  explicit RepackCache(RepackOptions opts = {});
  ~RepackCache();
  RepackCache(const RepackCache&) = delete;
  RepackCache& operator=(const RepackCache&) = delete;

  struct Stats {
    int64_t files_written = 0;  // repack files created by this cache
    int64_t files_reused = 0;   // existing repack files mapped without rewriting
    int64_t in_place = 0;       // tensors bound zero-copy from the checkpoint mapping
    int64_t vectors_converted = 0;
  };
  const Stats& stats() const { return stats_; }
  const std::string& dir() const { return dir_; }
  ThreadPool* pool() const { return opts_.pool; }
  // The repack file that holds `key` (dir/<hash>.xrp).
  std::string path_for_key(const std::string& key) const;

  // Maps the repack file for `key` holding `nbytes` of payload; if it is absent or invalid,
  // creates it by calling fill(out) on a fresh writable buffer of nbytes (64-byte aligned),
  // then renames it into place. Returns the read-only payload.
  Result<const std::byte*> get_or_create(const std::string& key, size_t nbytes,
                                         const std::function<Status(std::byte*)>& fill);
  // Binds a group of matrices — one MoE layer's routed experts — into one bundle file
  // (model/repack_bundle.h): every get_or_create that bind() makes goes into the bundle,
  // whose payloads are then mapped together in 2 MB pages, however small each is. `name`
  // says what the group is; the file is found by the name and the first payload's key. Not
  // nested. On an error the payloads bound inside are unmapped (the bind failed anyway).
  Status bind_bundle(std::string_view name, const std::function<Status()>& bind);
  // Keeps `v` alive for the cache's lifetime and returns a view of it.
  std::span<const float> keep(std::vector<float> v);

  // Progress accounting for bind_*: prints "\rbinding DIR: x/y GB" (throttled) when the
  // checkpoint is larger than ~1 GB. finish_progress() ends the line (idempotent).
  void note_bound(const Checkpoint& ckpt, size_t nbytes);
  void finish_progress();

  Stats& mutable_stats() { return stats_; }

 private:
  // The payload of a valid repack file at `path` for `key`, or nullptr if there is none.
  const std::byte* map_existing(const std::string& path, const std::string& key, size_t nbytes);
  // Removes `<hash>.xrp.tmp.<pid>.*` files whose writer process no longer exists (killed while
  // repacking); once per cache, before its first write.
  void remove_stale_temporaries();
  // Creates the cache folder and sweeps dead writers' temporaries (once): before a write.
  Status prepare_to_write();
  Result<const std::byte*> get_or_create_in_bundle(const std::string& key, size_t nbytes,
                                                   const std::function<Status(std::byte*)>& fill);
  // Eviction (model/repack_eviction.h): removes least recently used files until `bytes` more
  // fit under XDS_CACHE_MAX_GB and 5 % of the disk stays free. InvalidArgument for a
  // malformed XDS_CACHE_MAX_GB.
  Status make_room(uint64_t bytes);
  // A file this cache maps: never evicted by it, and marked used now (its mtime).
  void note_in_use(const std::string& path);
  void note_written(const std::string& path, uint64_t bytes);
  std::optional<std::vector<RepackFile>> listing_;  // the folder, listed at the first write
  std::unordered_set<std::string> in_use_;           // file names
  bool swept_ = false;
  bool in_bundle_ = false;
  std::string bundle_name_;
  std::unique_ptr<RepackBundle> bundle_;             // opened at the bundle's first payload
  std::vector<RepackBundle::Range> bundle_ranges_;  // finished bundles, unmapped at the end

  RepackOptions opts_;
  std::string dir_;
  Stats stats_;
  std::vector<std::unique_ptr<MappedFile>> maps_;
  std::deque<std::vector<float>> vectors_;
  size_t bound_bytes_ = 0;
  double last_print_s_ = -1;
  bool line_open_ = false;
};

// Binds the 2-D weight `name`, which must have shape [rows, cols] (HF [out, in]).
// BF16/F32: in place (dtype unchanged). F16 and F8_E4M3 (+ `<name>_scale_inv`): F32 in the
// repack cache. Errors name the file, the tensor, the expected and the found shape/dtype.
// `block_rows`/`block_cols` are the FP8 block sizes (quantization_config weight_block_size).
Result<MatrixRef> bind_matrix(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                              int64_t cols, RepackCache& cache, int64_t block_rows = 128,
                              int64_t block_cols = 128);

// Environment setting XDS_WEIGHT_LAYOUT: "rows" keeps BF16 linear weights in place in the
// checkpoint's row-major layout (no repack file: zero extra disk, slower decode kernels)
// and FP8 ones dequantized to F32 rows; anything else or unset: panels.
bool panels_from_env();

// bind_matrix for the weights of linear layers (y = x · Wᵀ only, never sliced by rows):
// BF16 and F16 are repacked once into the kernels' panel layout (MatrixLayout::kPanels16,
// two bytes a weight) in the repack cache, shared by every process (unless
// XDS_WEIGHT_LAYOUT=rows, or an element misaligned in the file); F8_E4M3 likewise,
// as FP8 panels with their block scales (a byte per weight; F32 rows as bind_matrix binds
// them when the blocks or scales do not suit: see tensor/matrix.h), refusing NaN elements;
// other dtypes are bound as bind_matrix does.
Result<MatrixRef> bind_linear(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                              int64_t cols, RepackCache& cache, int64_t block_rows = 128,
                              int64_t block_cols = 128);

// kv_b_proj ([H*(Dn+Dv), C], per head Dn rows of W_UK then Dv rows of W_UV) re-laid for the
// weight-absorbed attention as 2H panel matrices (one repack file, shared like every other):
//   uk_t[h]: [C, Dn] = W_UK[h]ᵀ   (q_abs[h] = uk_t[h] · q_nope[h])
//   uv[h]:   [Dv, C] = W_UV[h]    (out[h]   = uv[h] · latent_out[h])
// Only for a BF16 or F16 kv_b_proj (panels of its own elements, read from the checkpoint)
// with panels enabled; otherwise both are empty and attention slices the row-major kv_b_proj.
// An int8 kv_b_proj (W[r][c] = q[r][c] · s[r]) gives int8 panels (int8_weights.h
// bind_int8_absorbed_heads): uv[h] keeps its rows' scales; uk_t[h] holds qᵀ with unit row
// scales, and uk_scale holds the scales of the W_UK rows, which the caller folds into the
// query: q_abs[h] = uk_t[h] · (q_nope[h] ⊙ uk_scale[h]), exact as W_UK[h]ᵀ q_nope[h] is.
struct AbsorbedHeads {
  std::vector<MatrixRef> uk_t, uv;
  std::span<const float> uk_scale;  // [H, Dn]; empty unless the heads are int8
};
Result<AbsorbedHeads> bind_absorbed_heads(const Checkpoint& ckpt, const std::string& name,
                                          const MatrixRef& kv_b, int64_t heads, int64_t dn,
                                          int64_t dv, RepackCache& cache);

// Binds the 1-D tensor `name` of shape [n] as f32 (norm weights, biases): F32 in place,
// BF16/F16 converted into memory owned by `cache`.
Result<std::span<const float>> bind_vector_f32(const Checkpoint& ckpt, const std::string& name,
                                               int64_t n, RepackCache& cache);

// The repack-cache key of a tensor converted to `target` (with its scale tensor, if any):
// the files' identities (path, size, mtime), names, dtypes and shapes.
std::string repack_key(const TensorView& t, const TensorView* scale, std::string_view target,
                       int64_t br, int64_t bc);

// weight[r][c] = f32(fp8[r*cols + c]) * scale_inv[(r/br)*ceil(cols/bc) + c/bc] for rows
// [row_begin, row_end). Exposed for tests and mkmodel.
void dequantize_fp8_block_rows(const uint8_t* fp8, const float* scale_inv, int64_t rows,
                               int64_t cols, int64_t br, int64_t bc, int64_t row_begin,
                               int64_t row_end, float* out);

}  // namespace xds
