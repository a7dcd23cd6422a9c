#include "kernels/cpu/linear.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/int4_matrix.h"
#include "kernels/cpu/int8_matrix.h"
#include "kernels/cpu/linear_panels.h"
#include "kernels/cpu/static_dispatch.h"

// AVX2 + FMA kernels (8 floats per register, 16 registers). The machines this project runs
// on report AVX2/FMA; an AVX512-BF16 variant belongs behind a runtime CPU check.

namespace xds::kernels {
namespace {

constexpr int kRowBlock = 6;      // rows of W per tile (split into 3s for multi-token tiles)
constexpr int kLongRowBlock = 8;  // rows per single-token tile when rows are page-long
constexpr int64_t kPageBytes = 4096;
constexpr int kTokenBlock = 4;            // tokens per tile
constexpr int64_t kSgemmPanelRows = 256;  // rows of W widened to fp32 per sgemm call
constexpr int64_t kTokenChunk = 16;       // tokens whose x slices share one pass over a row block
constexpr int64_t kKBlock = 256;          // k per block: 16 tokens x 1 KB of x stay in L1

inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline float scalar(float v) {
  return v;
}
inline float scalar(uint16_t v) {
  return bf16_to_f32(v);
}

inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[t][r] = x[t] · w[r] over k for TB tokens and RB rows; fp32 accumulation in a fixed
// order (8 vector lanes over ascending k, then their horizontal sum, then the scalar tail),
// independent of TB, RB and of k blocking, so that a token's result does not depend on which
// other tokens share its batch.
//
// Blocked form: the lanes of [kb, ke) are added to part[t * RB + r] (8 floats each, spilled
// between k blocks, which is exact); `first` starts from zero, `last` finishes into y.
// kb, ke are multiples of 8 except that the last block ends at k.
template <typename XT, typename WT, int TB, int RB>
void dot_tile(const XT* x, int64_t ldx, const WT* w, int64_t ldw, int64_t k, int64_t kb, int64_t ke,
              __m256* part, bool first, bool last, float* y, int64_t ldy) {
  __m256 acc[TB][RB];
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < RB; ++r) acc[t][r] = first ? _mm256_setzero_ps() : part[t * RB + r];
  const int64_t kv = std::min(ke, k & ~int64_t{7});
  // Rows shorter than a page end before the hardware prefetcher has locked on: then the RB
  // rows after this tile (what the next tile reads) are prefetched into L2 at the rate this
  // tile consumes its own (RB × 8 weights per step, at most two lines). Page-long rows
  // stream as fast or faster without it (docs/design/cpu_kernels.md).
  const bool prefetch = ldw * static_cast<int64_t>(sizeof(WT)) < kPageBytes;
  const char* next = reinterpret_cast<const char*>(w + RB * ldw);
  for (int64_t k0 = kb; k0 < kv; k0 += 8) {
    if (prefetch) {
      const char* pf = next + k0 * RB * static_cast<int64_t>(sizeof(WT));
      _mm_prefetch(pf, _MM_HINT_T1);
      if constexpr (RB * 8 * sizeof(WT) > 64) _mm_prefetch(pf + 64, _MM_HINT_T1);
    }
    __m256 wv[RB];
    for (int r = 0; r < RB; ++r) wv[r] = load8(w + r * ldw + k0);
    for (int t = 0; t < TB; ++t) {
      const __m256 xv = load8(x + t * ldx + k0);
      for (int r = 0; r < RB; ++r) acc[t][r] = _mm256_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  if (!last) {
    for (int t = 0; t < TB; ++t)
      for (int r = 0; r < RB; ++r) part[t * RB + r] = acc[t][r];
    return;
  }
  const int64_t k_vec = k & ~int64_t{7};
  for (int t = 0; t < TB; ++t) {
    for (int r = 0; r < RB; ++r) {
      float s = hsum(acc[t][r]);
      for (int64_t i = k_vec; i < k; ++i) s += scalar(x[t * ldx + i]) * scalar(w[r * ldw + i]);
      y[t * ldy + r] = s;
    }
  }
}

// A range [kb, ke) of k and where the tile's accumulators live between ranges (see dot_tile).
struct KBlock {
  int64_t kb = 0, ke = 0;
  __m256* part = nullptr;  // [TB * RB] per row group, groups kPartStride apart
  bool first = true, last = true;
};
constexpr int kPartStride = kTokenBlock * 3;  // vectors per row group of a multi-token tile

template <typename XT, typename WT, int TB>
void dot_rows(int rb, const XT* x, int64_t ldx, const WT* w, int64_t ldw, int64_t k,
              const KBlock& kr, float* y, int64_t ldy) {
  const bool ran =
      dispatch_1_to < TB == 1 ? 8 : 3 > (rb, [&]<int RB>() {
                                      dot_tile<XT, WT, TB, RB>(x, ldx, w, ldw, k, kr.kb, kr.ke,
                                                               kr.part, kr.first, kr.last, y, ldy);
                                    });
  XDS_CHECK(ran, "bad row block {} for {} tokens", rb, TB);
}

// One tile of tb tokens × rb rows (rb <= 8): a single token uses up to 8 independent rows;
// several tokens use row groups of 3 (4 tokens × 3 rows = 12 accumulators + 3 + 1 registers).
template <typename XT, typename WT>
void tile(int tb, int rb, const XT* x, int64_t ldx, const WT* w, int64_t k, const KBlock& kr,
          float* y, int64_t ldy) {
  if (tb == 1) return dot_rows<XT, WT, 1>(rb, x, ldx, w, k, k, kr, y, ldy);
  for (int r0 = 0; r0 < rb; r0 += 3) {
    const int part = std::min(3, rb - r0);
    const WT* wr = w + r0 * k;
    float* yr = y + r0;
    KBlock group = kr;
    if (group.part) group.part += (r0 / 3) * kPartStride;
    switch (tb) {
      case 2:
        dot_rows<XT, WT, 2>(part, x, ldx, wr, k, k, group, yr, ldy);
        break;
      case 3:
        dot_rows<XT, WT, 3>(part, x, ldx, wr, k, k, group, yr, ldy);
        break;
      case 4:
        dot_rows<XT, WT, 4>(part, x, ldx, wr, k, k, group, yr, ldy);
        break;
      default:
        XDS_CHECK(false, "bad token block {}", tb);
    }
  }
}

template <typename XT, typename WT>
void tile(int tb, int rb, const XT* x, int64_t ldx, const WT* w, int64_t k, float* y, int64_t ldy) {
  tile<XT, WT>(tb, rb, x, ldx, w, k, KBlock{0, k}, y, ldy);
}

int64_t rows_per_task(int64_t rows, int threads) {
  const int64_t per = (rows + threads - 1) / threads;
  constexpr int64_t kAlign = 24;  // whole tiles of 6 and of 8 rows
  return std::max<int64_t>(kAlign, (per + kAlign - 1) / kAlign * kAlign);
}

// Large batches (prefill): each pool thread widens panels of its W rows to fp32 and calls
// single-threaded OpenBLAS sgemm, y[:, panel] = x · panelᵀ. Summation order differs from
// the tile kernel by rounding only (~1e-7 relative).
void linear_sgemm(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                  ThreadPool& pool) {
  use_single_threaded_blas();
  const int64_t k = w.cols;
  const int64_t step = rows_per_task(w.rows, pool.num_threads());
  const int64_t tasks = (w.rows + step - 1) / step;
  pool.parallel_for(tasks, [&](int64_t b, int64_t e, int) {
    thread_local std::vector<float> panel;
    const int64_t r_end = std::min(w.rows, e * step);
    for (int64_t r = b * step; r < r_end; r += kSgemmPanelRows) {
      const int64_t rows = std::min(kSgemmPanelRows, r_end - r);
      const float* wp;
      if (w.dtype == DType::kBF16) {
        panel.resize(static_cast<size_t>(rows * k));
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * k;
        for (int64_t i = 0; i < rows * k; ++i) panel[i] = bf16_to_f32(src[i]);
        wp = panel.data();
      } else {
        wp = static_cast<const float*>(w.data) + r * k;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                  static_cast<int>(rows), static_cast<int>(k), 1.0f, x, static_cast<int>(ldx), wp,
                  static_cast<int>(k), 0.0f, y + r, static_cast<int>(ldy));
    }
  });
}

// Several tokens: per block of 6 rows, k is walked in blocks of kKBlock so that the chunk's
// x slices (16 tokens × 1 KB) and the rows' slices stay in L1 while every token block uses
// them; accumulators are spilled between k blocks (exact, see dot_tile).
template <typename XT, typename WT>
void rows_multi_token(const XT* x, int64_t n, int64_t ldx, const WT* w, int64_t k, int64_t r_begin,
                      int64_t r_end, float* y, int64_t ldy) {
  constexpr int64_t kGroups = kRowBlock / 3;
  alignas(32) __m256 parts[kTokenChunk / kTokenBlock][kGroups * kPartStride];
  for (int64_t r = r_begin; r < r_end; r += kRowBlock) {
    const int rb = static_cast<int>(std::min<int64_t>(kRowBlock, r_end - r));
    for (int64_t t0 = 0; t0 < n; t0 += kTokenChunk) {
      const int64_t t1 = std::min(n, t0 + kTokenChunk);
      for (int64_t kb = 0; kb < k; kb += kKBlock) {
        const int64_t ke = kb + kKBlock >= k ? k : kb + kKBlock;
        for (int64_t t = t0; t < t1; t += kTokenBlock) {
          const int tb = static_cast<int>(std::min<int64_t>(kTokenBlock, t1 - t));
          const KBlock kr{kb, ke, parts[(t - t0) / kTokenBlock], kb == 0, ke == k};
          tile<XT, WT>(tb, rb, x + t * ldx, ldx, w + r * k, k, kr, y + t * ldy + r, ldy);
        }
      }
    }
  }
}

template <typename XT, typename WT>
void linear_impl(const XT* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                 ThreadPool& pool) {
  const WT* wd = static_cast<const WT*>(w.data);
  const int64_t k = w.cols;
  // Below ~64K multiply-adds a wake-up of the pool costs more than the work.
  const bool small = n * w.rows * k < (int64_t{1} << 16);
  const int64_t step = small ? w.rows : rows_per_task(w.rows, pool.num_threads());
  const int64_t tasks = (w.rows + step - 1) / step;
  pool.parallel_for(tasks, [&](int64_t b, int64_t e, int) {
    const int64_t r_begin = b * step, r_end = std::min(w.rows, e * step);
    if (n > 1) return rows_multi_token<XT, WT>(x, n, ldx, wd, k, r_begin, r_end, y, ldy);
    // One token: 8 streams per tile for page-long rows (measured best), 6 for short ones.
    const int64_t block =
        k * static_cast<int64_t>(sizeof(WT)) >= kPageBytes ? kLongRowBlock : kRowBlock;
    for (int64_t r = r_begin; r < r_end; r += block) {
      const int rb = static_cast<int>(std::min<int64_t>(block, r_end - r));
      tile<XT, WT>(1, rb, x, ldx, wd + r * k, k, y + r, ldy);
    }
  });
}

// kPanels16 weights: the threads take chunks of panels (about four per thread) from a shared
// counter and run the outer-product kernel over each. Dynamic rather than one fixed half
// per thread: where another process shares a core one thread is often slowed for a while,
// and with fixed halves the other then spins at the end of every linear (a visible share of
// a batch-16 step in `perf`: docs/benchmarks.md).
// Which thread computes a panel changes no result.
//
// The chunk size for `panels` panels (whole pairs: even), or 0 when the product
// (n · rows · cols multiply-adds) is too small to wake the pool for: below ~64K a wake-up
// costs more than the work.
int64_t panel_chunk(int64_t panels, int64_t multiply_adds, int threads) {
  if (threads == 1 || multiply_adds < (int64_t{1} << 16)) return 0;
  return std::max<int64_t>(2, panels / (4 * threads) / 2 * 2);
}

// A group's chunks of panels, [out, p, end): each weight's panels in chunks of
// panel_chunk's size (at least a pair).
struct GroupChunk {
  int32_t out;
  int64_t p, end;
};

void group_chunks(int64_t n, std::span<const LinearOutput> outs, int threads,
                  std::vector<GroupChunk>& chunks) {
  chunks.clear();
  for (size_t i = 0; i < outs.size(); ++i) {
    const MatrixRef& w = *outs[i].w;
    const int64_t panels = w.panels();
    const int64_t chunk = std::max<int64_t>(2, panel_chunk(panels, n * w.rows * w.cols, threads));
    for (int64_t p = 0; p < panels; p += chunk)
      chunks.push_back({static_cast<int32_t>(i), p, std::min(panels, p + chunk)});
  }
}

// Panel weights (same cols) against one x on the pool: the chunks of all of them from one
// counter. The wide path: the threads first pack x's token tiles together (each tile once,
// not once per chunk of panels nor per weight) and wait until all are packed.
void linear_panels_group(const float* x, int64_t n, int64_t ldx, std::span<const LinearOutput> outs,
                         ThreadPool& pool) {
  thread_local std::vector<GroupChunk> chunks;
  group_chunks(n, outs, pool.num_threads(), chunks);
  bool any_wide = false;
  for (const LinearOutput& o : outs) any_wide = any_wide || wide_path_for(n, *o.w);
  const int64_t cols = outs[0].w->cols;
  thread_local std::vector<float> xp_buffer;
  if (any_wide) xp_buffer.resize(static_cast<size_t>(n * cols));
  float* const xp = xp_buffer.data();
  const int64_t tiles = any_wide ? token_tile_count(n) : 0;
  std::atomic<int64_t> next{0}, next_tile{0}, packed{0};
  const int64_t count = static_cast<int64_t>(chunks.size());
  const GroupChunk* const list = chunks.data();  // the caller's (a lambda would see its own)
  pool.run_on_available([&](int) {
    for (int64_t i = next_tile.fetch_add(1, std::memory_order_relaxed); i < tiles;
         i = next_tile.fetch_add(1, std::memory_order_relaxed)) {
      pack_token_tiles(x, n, ldx, cols, i, i + 1, xp);
      packed.fetch_add(1, std::memory_order_release);
    }
    while (packed.load(std::memory_order_acquire) < tiles) _mm_pause();
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < count;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const GroupChunk& ch = list[c];
      const LinearOutput& o = outs[ch.out];
      if (wide_path_for(n, *o.w)) {
        panels_linear_packed(xp, n, *o.w, ch.p, ch.end, o.y, o.ldy);
      } else {
        panels_linear(x, n, ldx, *o.w, ch.p, ch.end, o.y, o.ldy);
      }
    }
  });
}

// bf16 x against BF16 panels with the dot-product kernel, the chunks taken as above.
void linear_panels_dot_group(const uint16_t* x, int64_t n, int64_t ldx,
                             std::span<const LinearOutput> outs, ThreadPool& pool) {
  thread_local std::vector<GroupChunk> chunks;
  group_chunks(n, outs, pool.num_threads(), chunks);
  const int64_t count = static_cast<int64_t>(chunks.size());
  const GroupChunk* const list = chunks.data();  // the caller's (a lambda would see its own)
  std::atomic<int64_t> next{0};
  pool.run_on_available([&](int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < count;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const LinearOutput& o = outs[list[c].out];
      panels_linear_bf16(x, n, ldx, *o.w, list[c].p, list[c].end, o.y, o.ldy);
    }
  });
}

// One weight: the group of one (`group`: linear_panels_group or linear_panels_dot_group), or
// the whole matrix on the calling thread (`alone`: the matching panel kernel) where the
// product is too small to wake the pool for.
template <class X, class Alone, class Group>
void one_weight_on_pool(const X* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                        int64_t ldy, ThreadPool& pool, Alone&& alone, Group&& group) {
  if (panel_chunk(w.panels(), n * w.rows * w.cols, pool.num_threads()) == 0)
    return alone(x, n, ldx, w, 0, w.panels(), y, ldy);
  const LinearOutput one[] = {{&w, y, ldy}};
  group(x, n, ldx, std::span<const LinearOutput>(one), pool);
}

// W4A8's int8 rows in w's panel column order: x itself, or (permuted groups) x gathered
// into scratch (int4_matrix.h).
Int8RowsRef int4_a8_rows(const Int8RowsRef& x, const MatrixRef& w, Int8Rows& scratch) {
  const int32_t* order = int4_column_order(w);
  if (order == nullptr) return x;
  return gather_int8_columns(x, order, scratch);
}

// W4A16's rows x [n][ldx] in w's panel column order: x itself, or x gathered into scratch
// [n][w.cols] (ldx then w.cols).
template <class T>
const T* int4_a16_rows(const T* x, int64_t n, int64_t& ldx, const MatrixRef& w,
                       std::vector<T>& scratch) {
  const int32_t* order = int4_column_order(w);
  if (order == nullptr) return x;
  scratch.resize(static_cast<size_t>(n * w.cols));
  gather_columns(x, n, ldx, order, w.cols, scratch.data());
  ldx = w.cols;
  return scratch.data();
}

// kInt4Panels weights (int4_matrix.h): W4A8 quantizes x per token (from fp32, or from bf16
// widened exactly), W4A16 multiplies x as it is; either in the panels' column order. pool
// null: on the calling thread.
void int4_linear_x_f32(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy, ThreadPool* pool) {
  const Int4PanelsRef p = int4_panels_of(w);
  const Int8Output out{y, nullptr, ldy};
  if (!w.int8_activations) {
    thread_local std::vector<float> xg;
    x = int4_a16_rows(x, n, ldx, w, xg);
    if (pool == nullptr) return int4_linear_f32_on_thread(x, n, ldx, p, out);
    return int4_linear_f32(x, n, ldx, p, out, *pool);
  }
  thread_local Int8Rows xq, xg;
  if (pool == nullptr) {
    xq.resize(n, w.cols);
    quantize_rows_int8(x, n, w.cols, ldx, xq.out());
    return int4_linear_on_thread(int4_a8_rows(xq.ref(), w, xg), p, out);
  }
  quantize_rows_int8_on_pool(x, n, w.cols, ldx, xq, *pool);
  int4_linear(int4_a8_rows(xq.ref(), w, xg), p, out, *pool);
}

void int4_linear_x_bf16(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                        int64_t ldy, ThreadPool& pool) {
  const Int4PanelsRef p = int4_panels_of(w);
  const Int8Output out{y, nullptr, ldy};
  if (!w.int8_activations) {
    thread_local std::vector<uint16_t> xg;
    x = int4_a16_rows(x, n, ldx, w, xg);
    return int4_linear_bf16(x, n, ldx, p, out, pool);
  }
  thread_local Int8Rows xq, xg;
  xq.resize(n, w.cols);
  quantize_rows_int8(x, n, w.cols, ldx, xq.out());
  int4_linear(int4_a8_rows(xq.ref(), w, xg), p, out, pool);
}

}  // namespace

void use_single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void linear_f32(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                ThreadPool& pool, int64_t sgemm_min_tokens) {
  if (n == 0 || w.rows == 0) return;
  if (w.layout == MatrixLayout::kPanels16) {
    return one_weight_on_pool(x, n, ldx, w, y, ldy, pool, panels_linear, linear_panels_group);
  }
  if (is_int8_matrix(w))
    return int8_linear_f32(x, n, ldx, int8_panels_of(w), {y, nullptr, ldy}, pool);
  if (is_int4_matrix(w)) return int4_linear_x_f32(x, n, ldx, w, y, ldy, &pool);
  if (n >= sgemm_min_tokens) return linear_sgemm(x, n, ldx, w, y, ldy, pool);
  if (w.dtype == DType::kBF16) return linear_impl<float, uint16_t>(x, n, ldx, w, y, ldy, pool);
  XDS_CHECK(w.dtype == DType::kF32, "linear: weight dtype {}", dtype_name(w.dtype));
  linear_impl<float, float>(x, n, ldx, w, y, ldy, pool);
}

namespace {

// Whether a group runs in one parallel region: several threads, every weight taken by the
// grouped kernel (`grouped_kernel_takes`), and enough work to wake the pool for (as
// panel_chunk decides for one weight). Checks that all weights share x's k.
template <class Takes>
bool runs_as_group(int64_t n, std::span<const LinearOutput> outs, const ThreadPool& pool,
                   Takes&& grouped_kernel_takes) {
  int64_t multiply_adds = 0;
  bool grouped = pool.num_threads() > 1;
  for (const LinearOutput& o : outs) {
    XDS_CHECK(o.w->cols == outs[0].w->cols, "linear group: k {} and {}", o.w->cols,
              outs[0].w->cols);
    grouped = grouped && grouped_kernel_takes(*o.w);
    multiply_adds += n * o.w->rows * o.w->cols;
  }
  return grouped && multiply_adds >= (int64_t{1} << 16);
}

}  // namespace

void linear_f32_group(const float* x, int64_t n, int64_t ldx, std::span<const LinearOutput> outs,
                      ThreadPool& pool) {
  if (n == 0 || outs.empty()) return;
  const bool all_int8 = std::all_of(outs.begin(), outs.end(),
                                    [](const LinearOutput& o) { return is_int8_matrix(*o.w); });
  if (all_int8) {  // x quantized once for all of them (q_a with kv_a)
    thread_local Int8Rows xq;
    quantize_rows_int8_on_pool(x, n, outs[0].w->cols, ldx, xq, pool);
    for (const LinearOutput& o : outs)
      int8_linear(xq.ref(), int8_panels_of(*o.w), {o.y, nullptr, o.ldy}, pool);
    return;
  }
  const bool all_int4_a8 = std::all_of(
      outs.begin(), outs.end(), [](const LinearOutput& o) { return is_int4_a8_matrix(*o.w); });
  if (all_int4_a8) {  // W4A8: x quantized once for all of them
    // Each weight's permuted groups gather x's int8 rows through its own column order (gate
    // and up may differ); the same order twice in a row is gathered once.
    thread_local Int8Rows xq, xg;
    quantize_rows_int8_on_pool(x, n, outs[0].w->cols, ldx, xq, pool);
    const int32_t* gathered = nullptr;
    for (const LinearOutput& o : outs) {
      Int8RowsRef rows = xq.ref();
      if (const int32_t* order = int4_column_order(*o.w)) {
        if (order != gathered) gather_int8_columns(rows, order, xg);
        gathered = order;
        rows = xg.ref();
      }
      int4_linear(rows, int4_panels_of(*o.w), {o.y, nullptr, o.ldy}, pool);
    }
    return;
  }
  if (!runs_as_group(n, outs, pool, [](const MatrixRef& w) { return is_panel_matrix(w); })) {
    for (const LinearOutput& o : outs) linear_f32(x, n, ldx, *o.w, o.y, o.ldy, pool);
    return;
  }
  linear_panels_group(x, n, ldx, outs, pool);
}

void linear_f32_serial(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy) {
  if (n == 0 || w.rows == 0) return;
  if (w.layout == MatrixLayout::kPanels16)
    return panels_linear(x, n, ldx, w, 0, w.panels(), y, ldy);
  if (is_int8_matrix(w)) {
    thread_local Int8Rows xq;
    xq.resize(n, w.cols);
    quantize_rows_int8(x, n, w.cols, ldx, xq.out());
    return int8_linear_on_thread(xq.ref(), int8_panels_of(w), {y, nullptr, ldy});
  }
  if (is_int4_matrix(w)) return int4_linear_x_f32(x, n, ldx, w, y, ldy, nullptr);
  const int64_t k = w.cols;
  for (int64_t t = 0; t < n; t += kTokenBlock) {
    const int tb = static_cast<int>(std::min<int64_t>(kTokenBlock, n - t));
    for (int64_t r = 0; r < w.rows; r += kRowBlock) {
      const int rb = static_cast<int>(std::min<int64_t>(kRowBlock, w.rows - r));
      if (w.dtype == DType::kBF16) {
        tile<float, uint16_t>(tb, rb, x + t * ldx, ldx,
                              static_cast<const uint16_t*>(w.data) + r * k, k, y + t * ldy + r,
                              ldy);
      } else {
        tile<float, float>(tb, rb, x + t * ldx, ldx, static_cast<const float*>(w.data) + r * k, k,
                           y + t * ldy + r, ldy);
      }
    }
  }
}

void linear_bf16(const uint16_t* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                 int64_t ldy, ThreadPool& pool) {
  if (n == 0 || w.rows == 0) return;
  if (is_int8_matrix(w)) {  // the bf16 rows quantized per token (widened exactly)
    thread_local Int8Rows xq;
    xq.resize(n, w.cols);
    quantize_rows_int8(x, n, w.cols, ldx, xq.out());
    return int8_linear(xq.ref(), int8_panels_of(w), {y, nullptr, ldy}, pool);
  }
  if (is_int4_matrix(w)) return int4_linear_x_bf16(x, n, ldx, w, y, ldy, pool);
  if (panels_dot_for(w)) {
    return one_weight_on_pool(x, n, ldx, w, y, ldy, pool, panels_linear_bf16,
                              linear_panels_dot_group);
  }
  if (n >= kSgemmMinTokens || w.layout == MatrixLayout::kPanels16) {
    // bf16 values widen to fp32 exactly, so the fp32 kernels give the same products.
    thread_local std::vector<float> wide;
    wide.resize(static_cast<size_t>(n * w.cols));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < w.cols; ++i) wide[t * w.cols + i] = bf16_to_f32(x[t * ldx + i]);
    if (w.layout == MatrixLayout::kPanels16)
      return linear_f32(wide.data(), n, w.cols, w, y, ldy, pool);
    return linear_sgemm(wide.data(), n, w.cols, w, y, ldy, pool);
  }
  if (w.dtype == DType::kBF16) return linear_impl<uint16_t, uint16_t>(x, n, ldx, w, y, ldy, pool);
  XDS_CHECK(w.dtype == DType::kF32, "linear: weight dtype {}", dtype_name(w.dtype));
  linear_impl<uint16_t, float>(x, n, ldx, w, y, ldy, pool);
}

void linear_bf16_group(const uint16_t* x, int64_t n, int64_t ldx,
                       std::span<const LinearOutput> outs, ThreadPool& pool) {
  if (n == 0 || outs.empty()) return;
  if (!runs_as_group(n, outs, pool, [](const MatrixRef& w) { return panels_dot_for(w); })) {
    for (const LinearOutput& o : outs) linear_bf16(x, n, ldx, *o.w, o.y, o.ldy, pool);
    return;
  }
  linear_panels_dot_group(x, n, ldx, outs, pool);
}

void round_to_bf16(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = f32_to_bf16(src[i]);
}

namespace {

// y[t, c0 .. c0+8*CB) += Σ_r x[t, r] W[r, c0 ..] for TB tokens, accumulated in registers
// over all rows r (W is read once per TB tokens).
template <typename WT, int TB, int CB>
void nn_tile(const float* x, int64_t ldx, const WT* w, int64_t rows, int64_t ldw, float* y,
             int64_t ldy) {
  __m256 acc[TB][CB];
  for (int t = 0; t < TB; ++t)
    for (int c = 0; c < CB; ++c) acc[t][c] = _mm256_loadu_ps(y + t * ldy + 8 * c);
  for (int64_t r = 0; r < rows; ++r) {
    __m256 wv[CB];
    for (int c = 0; c < CB; ++c) wv[c] = load8(w + r * ldw + 8 * c);
    for (int t = 0; t < TB; ++t) {
      const __m256 xv = _mm256_set1_ps(x[t * ldx + r]);
      for (int c = 0; c < CB; ++c) acc[t][c] = _mm256_fmadd_ps(xv, wv[c], acc[t][c]);
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int c = 0; c < CB; ++c) _mm256_storeu_ps(y + t * ldy + 8 * c, acc[t][c]);
}

// The same sums for one or two tokens, reading W row by row (4 rows at a time, sequential
// streams) instead of in 32-column strips that stride across all rows: y stays in L1 and
// each element still gets its rows' multiply-adds in ascending row order, one FMA each, so
// the result is bit-for-bit that of nn_tile.
template <typename WT>
void matmul_nn_few_tokens(const float* x, int64_t n, int64_t ldx, const WT* w, int64_t rows,
                          int64_t cols, float* y, int64_t ldy) {
  const int64_t cv = cols & ~int64_t{31};
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const WT* w0 = w + r * cols;
    for (int64_t c = 0; c < cv; c += 8) {
      const __m256 a = load8(w0 + c), b = load8(w0 + cols + c), d = load8(w0 + 2 * cols + c),
                   e = load8(w0 + 3 * cols + c);
      for (int64_t t = 0; t < n; ++t) {
        const float* xr = x + t * ldx + r;
        float* yt = y + t * ldy + c;
        __m256 acc = _mm256_loadu_ps(yt);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(xr[0]), a, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(xr[1]), b, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(xr[2]), d, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(xr[3]), e, acc);
        _mm256_storeu_ps(yt, acc);
      }
    }
  }
  for (; r < rows; ++r) {
    for (int64_t c = 0; c < cv; c += 8) {
      const __m256 a = load8(w + r * cols + c);
      for (int64_t t = 0; t < n; ++t) {
        float* yt = y + t * ldy + c;
        _mm256_storeu_ps(yt,
                         _mm256_fmadd_ps(_mm256_set1_ps(x[t * ldx + r]), a, _mm256_loadu_ps(yt)));
      }
    }
  }
}

template <typename WT>
void matmul_nn_impl(const float* x, int64_t n, int64_t ldx, const WT* w, int64_t rows, int64_t cols,
                    float* y, int64_t ldy) {
  const int64_t cv = cols & ~int64_t{31};  // blocks of 32 columns (4 registers)
  if (n <= 2) {
    matmul_nn_few_tokens(x, n, ldx, w, rows, cols, y, ldy);
  } else {
    for (int64_t t = 0; t < n; t += 3) {
      const int tb = static_cast<int>(std::min<int64_t>(3, n - t));
      for (int64_t c = 0; c < cv; c += 32) {
        const float* xt = x + t * ldx;
        float* yt = y + t * ldy + c;
        if (tb == 3) nn_tile<WT, 3, 4>(xt, ldx, w + c, rows, cols, yt, ldy);
        if (tb == 2) nn_tile<WT, 2, 4>(xt, ldx, w + c, rows, cols, yt, ldy);
        if (tb == 1) nn_tile<WT, 1, 4>(xt, ldx, w + c, rows, cols, yt, ldy);
      }
    }
  }
  for (int64_t t = 0; t < n; ++t) {  // the remaining columns
    for (int64_t r = 0; r < rows; ++r) {
      const float xr = x[t * ldx + r];
      for (int64_t c = cv; c < cols; ++c) y[t * ldy + c] += xr * scalar(w[r * cols + c]);
    }
  }
}

}  // namespace

void matmul_nn_accumulate(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y,
                          int64_t ldy) {
  XDS_CHECK(w.layout == MatrixLayout::kRows, "matmul_nn_accumulate: weights must be row-major");
  if (n >= kNnSgemmMinTokens) {
    // W widened to fp32 once per call (a head's W_UK: 128 × 512, 256 KB), then sgemm with
    // beta = 1: from 16 tokens on sgemm runs several times faster than the register kernel
    // (docs/benchmarks.md, "Linear layers, row-major and scheduling").
    use_single_threaded_blas();
    const float* wf = static_cast<const float*>(w.data);
    thread_local std::vector<float> wide;
    if (w.dtype == DType::kBF16) {
      const int64_t count = w.rows * w.cols;
      wide.resize(static_cast<size_t>(count));
      const auto* src = static_cast<const uint16_t*>(w.data);
      for (int64_t i = 0; i < count; ++i) wide[i] = bf16_to_f32(src[i]);
      wf = wide.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                static_cast<int>(w.cols), static_cast<int>(w.rows), 1.0f, x, static_cast<int>(ldx),
                wf, static_cast<int>(w.cols), 1.0f, y, static_cast<int>(ldy));
    return;
  }
  if (w.dtype == DType::kBF16) {
    matmul_nn_impl(x, n, ldx, static_cast<const uint16_t*>(w.data), w.rows, w.cols, y, ldy);
  } else {
    matmul_nn_impl(x, n, ldx, static_cast<const float*>(w.data), w.rows, w.cols, y, ldy);
  }
}

}  // namespace xds::kernels
