// Internal to the absorbed attention kernels (mla_attention*.cc): the cached rows of a
// context slice, as pointers, and the software prefetch that brings the next slice's rows in
// while the current one computes. Shared by the fp32 products (float planes) and the bf16
// ones (float, bf16 or INT8-latent planes).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/mla_attention.h"

namespace xds::kernels::absorbed_detail {

// The view's latent plane as L (float, uint16_t: bf16, int8_t: INT8) and its rope plane as R
// (float or uint16_t); null where the view holds its rows in the other type.
template <typename L>
const L* latent_plane_of(const LatentKvView& kv) {
  if constexpr (std::is_same_v<L, int8_t>) {
    return kv.latent8;
  } else if constexpr (std::is_same_v<L, uint16_t>) {
    return kv.latent16;
  } else {
    return kv.latent;
  }
}
template <typename R>
const R* rope_plane_of(const LatentKvView& kv) {
  if constexpr (std::is_same_v<R, uint16_t>) {
    return kv.rope16;
  } else {
    return kv.rope;
  }
}
template <typename L, typename R>
bool view_holds(const LatentKvView& kv) {
  return latent_plane_of<L>(kv) != nullptr && (kv.rope_dim == 0 || rope_plane_of<R>(kv) != nullptr);
}

// The latent and rope rows of context rows [s0, s1) in planes of L and R (float, bf16; the
// latent also int8), walking the block table once (a division per row cost more than
// converting the row): per block its base in each plane (block_table[b] · block stride),
// then rows ld apart. scale (INT8 latent only, else null): each row's scale, at
// kv.latent_scale.
template <typename L, typename R>
void gather_row_pointers(const LatentKvView& kv, const L* latent_plane, const R* rope_plane,
                         int64_t s0, int64_t s1, const L** latent, const R** rope,
                         const float** scale) {
  const int64_t ld = kv.latent_stride(), dr = kv.rope_dim;
  const int64_t latent_step = kv.latent_block_step(), rope_step = kv.rope_block_step();
  const int64_t scale_step = kv.scale_block_step();
  int64_t block = s0 / kv.block_size, slot = s0 % kv.block_size;
  auto bases = [&](const L*& lb, const R*& rb, const float*& sb) {
    const int64_t b = kv.block_table[block];
    lb = latent_plane + b * latent_step;
    rb = rope_plane + b * rope_step;
    if (scale != nullptr) sb = kv.latent_scale + b * scale_step;
  };
  const L* lb = nullptr;
  const R* rb = nullptr;
  const float* sb = nullptr;
  bases(lb, rb, sb);
  for (int64_t i = 0; i < s1 - s0; ++i) {
    latent[i] = lb + slot * ld;
    rope[i] = rb + slot * dr;
    if (scale != nullptr) scale[i] = sb + slot;
    if (++slot == kv.block_size && i + 1 < s1 - s0) {
      slot = 0, ++block;
      bases(lb, rb, sb);
    }
  }
}

// Software prefetch of the next slice's rows, one row per step() (in bursts of at most
// kMaxBurst lines: fp32 rows go in two steps), spread over the current slice's scores and
// p·latent loops (which read bf16 rows from L1/L2): the cached rows' memory latency then
// overlaps that compute (a slice that nothing fetched stalls the conversion on memory for a
// large share of the kernel's time). A line per step, every column pair, would cost the
// scores loop ~10 instructions of bookkeeping per 16 vdpbf16ps; a whole fp32 row (37 lines)
// in one burst slows the fp32 planes' cold runs (docs/benchmarks.md, "Absorbed MLA
// attention"). L, R: the latent and rope planes' elements; an INT8
// latent's rows also fetch the line of their scale (one line per 16 rows of a block: the
// repeats hit L1).
template <typename L, typename R = L>
class NextSlicePrefetch {
 public:
  static constexpr int64_t kMaxBurst = 20;
  // scale: the rows' scales (INT8 latent), or null.
  void start(const L* const* latent, const R* const* rope, int64_t rows, int64_t lat, int64_t dr,
             const float* const* scale = nullptr) {
    latent_ = latent, rope_ = rope, scale_ = scale, rows_ = rows, row_ = 0, part_ = 0;
    latent_lines_ = (lat * static_cast<int64_t>(sizeof(L)) + 63) / 64;
    rope_end_ = latent_lines_ + (dr * static_cast<int64_t>(sizeof(R)) + 63) / 64;
    lines_ = rope_end_ + (scale != nullptr ? 1 : 0);
    parts_ = (lines_ + kMaxBurst - 1) / kMaxBurst;
    burst_ = (lines_ + parts_ - 1) / parts_;
  }
  __attribute__((always_inline)) void step() {
    if (row_ >= rows_) return;
    const int64_t begin = part_ * burst_, end = std::min(lines_, begin + burst_);
    for (int64_t i = begin; i < end; ++i) {
      const char* at = i < latent_lines_ ? reinterpret_cast<const char*>(latent_[row_]) + 64 * i
                       : i < rope_end_
                           ? reinterpret_cast<const char*>(rope_[row_]) + 64 * (i - latent_lines_)
                           : reinterpret_cast<const char*>(scale_[row_]);
      _mm_prefetch(at, _MM_HINT_T0);
    }
    if (++part_ == parts_) part_ = 0, ++row_;
  }

 private:
  const L* const* latent_ = nullptr;
  const R* const* rope_ = nullptr;
  const float* const* scale_ = nullptr;
  int64_t rows_ = 0, row_ = 0, part_ = 0, parts_ = 1, burst_ = 0, latent_lines_ = 0;
  int64_t rope_end_ = 0, lines_ = 0;
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
// the last slice: the first rows of the thread's next call where given and of these element
// types. L, R: the latent and rope planes' elements (float, uint16_t: bf16; an int8_t latent
// also gives each row's scale pointer).
template <typename L, typename R = L>
class SliceRows {
 public:
  static constexpr bool kInt8 = std::is_same_v<L, int8_t>;
  SliceRows(const LatentKvView& kv, const L* latent_plane, const R* rope_plane, int64_t s_begin,
            int64_t s_end, const AbsorbedNextRows* next)
      : kv_(kv), latent_(latent_plane), rope_(rope_plane), end_(s_end), next_(next) {
    slice_rows_ = slice_rows_of(s_begin, s_end);
    gather_row_pointers(kv, latent_, rope_, s_begin, std::min(s_end, s_begin + slice_rows_),
                        latent_rows_[cur_], rope_rows_[cur_], scales_of(cur_));
  }
  int64_t slice_rows() const { return slice_rows_; }
  // Starts slice [s0, s1): gathers the next slice's row pointers (the first rows of the
  // thread's next call after the last slice), for the prefetch during this one.
  void begin(int64_t s1) {
    ahead_ = std::min(end_, s1 + slice_rows_) - s1;
    const int n = cur_ ^ 1;
    if (ahead_ > 0) {
      gather_row_pointers(kv_, latent_, rope_, s1, s1 + ahead_, latent_rows_[n], rope_rows_[n],
                          scales_of(n));
    } else if (next_ != nullptr && view_holds<L, R>(next_->kv)) {
      ahead_ = std::min(kAbsorbedSliceRows, next_->end - next_->begin);
      gather_row_pointers(next_->kv, latent_plane_of<L>(next_->kv), rope_plane_of<R>(next_->kv),
                          next_->begin, next_->begin + ahead_, latent_rows_[n], rope_rows_[n],
                          scales_of(n));
    }
  }
  const L* const* latent() const { return latent_rows_[cur_]; }
  const R* const* rope() const { return rope_rows_[cur_]; }
  // The rows' scale pointers (INT8 latent), else null.
  const float* const* scale() const { return kInt8 ? scales_[cur_] : nullptr; }
  // The rows after the current slice (ahead() of them: 0 where nothing follows).
  const L* const* next_latent() const { return latent_rows_[cur_ ^ 1]; }
  const R* const* next_rope() const { return rope_rows_[cur_ ^ 1]; }
  const float* const* next_scale() const { return kInt8 ? scales_[cur_ ^ 1] : nullptr; }
  int64_t ahead() const { return ahead_; }
  void advance() { cur_ ^= 1; }

 private:
  const float** scales_of(int i) { return kInt8 ? scales_[i] : nullptr; }

  const LatentKvView& kv_;
  const L* latent_;
  const R* rope_;
  int64_t end_, slice_rows_ = 0, ahead_ = 0;
  const AbsorbedNextRows* next_;
  const L* latent_rows_[2][kAbsorbedSliceRows];  // [cur/next][row]
  const R* rope_rows_[2][kAbsorbedSliceRows];
  const float* scales_[2][kInt8 ? kAbsorbedSliceRows : 1];
  int cur_ = 0;
};

}  // namespace xds::kernels::absorbed_detail
