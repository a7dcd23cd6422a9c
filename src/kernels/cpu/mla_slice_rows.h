// Internal to the absorbed attention kernels (mla_attention*.cc): the cached rows of a
// context slice, as pointers, and the software prefetch that brings the next slice's rows in
// while the current one computes. Shared by the fp32 and the bf16 products.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/mla_attention.h"

namespace xds::kernels::absorbed_detail {

// The latent and rope rows of context rows [s0, s1) in planes of T (float or bf16), walking
// the block table once (a division per row cost more than converting the row): per block
// its base in each plane (block_table[b] · block stride), then rows ld apart.
template <typename T>
void gather_row_pointers(const LatentKvView& kv, const T* latent_plane, const T* rope_plane,
                         int64_t s0, int64_t s1, const T** latent, const T** rope) {
  const int64_t ld = kv.latent_stride(), dr = kv.rope_dim;
  const int64_t latent_step = kv.latent_block_step(), rope_step = kv.rope_block_step();
  int64_t block = s0 / kv.block_size, slot = s0 % kv.block_size;
  const T* lb = latent_plane + kv.block_table[block] * latent_step;
  const T* rb = rope_plane + kv.block_table[block] * rope_step;
  for (int64_t i = 0; i < s1 - s0; ++i) {
    latent[i] = lb + slot * ld;
    rope[i] = rb + slot * dr;
    if (++slot == kv.block_size && i + 1 < s1 - s0) {
      slot = 0, ++block;
      lb = latent_plane + kv.block_table[block] * latent_step;
      rb = rope_plane + kv.block_table[block] * rope_step;
    }
  }
}

// The fp32 or the bf16 plane of a view, as T.
template <typename T>
const T* plane_of(const float* f32, const uint16_t* bf16) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return bf16;
  } else {
    return f32;
  }
}

// Software prefetch of the next slice's rows, one row per step() (in bursts of at most
// kMaxBurst lines: fp32 rows go in two steps), spread over the current slice's scores and
// p·latent loops (which read bf16 rows from L1/L2): the cached rows' memory latency then
// overlaps that compute. Converting a slice that nothing had fetched stalled on memory for
// ~45 % of the kernel's time (64 tokens × 513 rows × 12 layers). A line per step, every
// column pair, cost the scores loop ~10 instructions of bookkeeping per 16 vdpbf16ps (hot
// kernel 57.7 against 50.5 µs a call); a whole fp32 row (37 lines) in one burst slowed the
// fp32 planes' cold runs by ~20 %.
template <typename T>
class NextSlicePrefetch {
 public:
  static constexpr int64_t kPerLine = 64 / sizeof(T);
  static constexpr int64_t kMaxBurst = 20;
  void start(const T* const* latent, const T* const* rope, int64_t rows, int64_t lat, int64_t dr) {
    latent_ = latent, rope_ = rope, rows_ = rows, row_ = 0, part_ = 0;
    latent_lines_ = (lat + kPerLine - 1) / kPerLine;
    lines_ = latent_lines_ + (dr + kPerLine - 1) / kPerLine;
    parts_ = (lines_ + kMaxBurst - 1) / kMaxBurst;
    burst_ = (lines_ + parts_ - 1) / parts_;
  }
  __attribute__((always_inline)) void step() {
    if (row_ >= rows_) return;
    const int64_t begin = part_ * burst_, end = std::min(lines_, begin + burst_);
    for (int64_t i = begin; i < end; ++i) {
      const T* at = i < latent_lines_ ? latent_[row_] + kPerLine * i
                                      : rope_[row_] + kPerLine * (i - latent_lines_);
      _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
    }
    if (++part_ == parts_) part_ = 0, ++row_;
  }

 private:
  const T* const* latent_ = nullptr;
  const T* const* rope_ = nullptr;
  int64_t rows_ = 0, row_ = 0, part_ = 0, parts_ = 1, burst_ = 0, latent_lines_ = 0, lines_ = 0;
};

// Rows per slice when [s_begin, s_end) goes in slices of equal length (at most
// kAbsorbedSliceRows), rounded up to whole 16-row blocks where that stays within
// kAbsorbedSliceRows (513 rows: 112 × 4 + 65): whole tiles of 16 rows for the kernels that
// take a block at once.
inline int64_t slice_rows_of(int64_t s_begin, int64_t s_end) {
  const int64_t slices = (s_end - s_begin + kAbsorbedSliceRows - 1) / kAbsorbedSliceRows;
  return std::min(kAbsorbedSliceRows, ((s_end - s_begin + slices - 1) / slices + 15) / 16 * 16);
}

// The row pointers of the current slice and the next one, swapped per slice. The next of
// the last slice: the first rows of the thread's next call where given and of this element
// type.
template <typename T>
class SliceRows {
 public:
  SliceRows(const LatentKvView& kv, const T* latent_plane, const T* rope_plane, int64_t s_begin,
            int64_t s_end, const AbsorbedNextRows* next)
      : kv_(kv), latent_(latent_plane), rope_(rope_plane), end_(s_end), next_(next) {
    slice_rows_ = slice_rows_of(s_begin, s_end);
    gather_row_pointers(kv, latent_, rope_, s_begin, std::min(s_end, s_begin + slice_rows_),
                        pointers_[cur_][0], pointers_[cur_][1]);
  }
  int64_t slice_rows() const { return slice_rows_; }
  // Starts slice [s0, s1): gathers the next slice's row pointers (the first rows of the
  // thread's next call after the last slice), for the prefetch during this one.
  void begin(int64_t s1) {
    ahead_ = std::min(end_, s1 + slice_rows_) - s1;
    T const** nl = pointers_[cur_ ^ 1][0];
    T const** nr = pointers_[cur_ ^ 1][1];
    if (ahead_ > 0) {
      gather_row_pointers(kv_, latent_, rope_, s1, s1 + ahead_, nl, nr);
    } else if (next_ != nullptr && next_->kv.bf16() == std::is_same_v<T, uint16_t>) {
      ahead_ = std::min(kAbsorbedSliceRows, next_->end - next_->begin);
      gather_row_pointers(next_->kv, plane_of<T>(next_->kv.latent, next_->kv.latent16),
                          plane_of<T>(next_->kv.rope, next_->kv.rope16), next_->begin,
                          next_->begin + ahead_, nl, nr);
    }
  }
  const T* const* latent() const { return pointers_[cur_][0]; }
  const T* const* rope() const { return pointers_[cur_][1]; }
  // The rows after the current slice (ahead() of them: 0 where nothing follows).
  const T* const* next_latent() const { return pointers_[cur_ ^ 1][0]; }
  const T* const* next_rope() const { return pointers_[cur_ ^ 1][1]; }
  int64_t ahead() const { return ahead_; }
  void advance() { cur_ ^= 1; }

 private:
  const LatentKvView& kv_;
  const T* latent_;
  const T* rope_;
  int64_t end_, slice_rows_ = 0, ahead_ = 0;
  const AbsorbedNextRows* next_;
  const T* pointers_[2][2][kAbsorbedSliceRows];  // [cur/next][latent/rope][row]
  int cur_ = 0;
};

}  // namespace xds::kernels::absorbed_detail
