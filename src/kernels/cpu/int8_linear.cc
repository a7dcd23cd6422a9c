#include "kernels/cpu/int8_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "base/check.h"
#include "kernels/cpu/int8_tiles.h"
#include "kernels/cpu/static_dispatch.h"

namespace xds::kernels {
namespace {

using namespace int8_detail;

// Columns of k per block when several passes share a pair (16 KB of the pair: stays in L1
// while every token pass reads it).
constexpr int64_t kKBlockGroups = 128;
// A single pass prefetches this far ahead on the pair's stream (as the BF16 panels).
constexpr int64_t kAheadBytes = 8192;
// Below this many multiply-adds a call runs on the calling thread (waking the pool costs
// more).
constexpr int64_t kMinPoolMultiplyAdds = int64_t{1} << 18;

std::atomic<int> g_forced_isa{-1};

Int8Isa default_isa() {
  static const Int8Isa isa =
      int8_isa_available(Int8Isa::kAvx512Vnni) ? Int8Isa::kAvx512Vnni : Int8Isa::kAvx2;
  return isa;
}

// The activations in the form the selected path reads: [m][ld] of u8 = xq + 128 (vnni),
// int16 (avx2) or int8 (scalar), ld = groups · 4 (the padding columns hold a zero xq), and
// the per-token scales [m] (scale_out: where packing writes them, for fp32 input).
struct PackedX {
  Int8Isa isa;
  void* data;
  int64_t ld;
  const float* scale;
  float* scale_out;  // null for int8 input
  int64_t m;
};

// A thread's buffers for a packed x.
struct XBuffers {
  std::vector<int16_t> x;
  std::vector<float> scale;
};

XBuffers& thread_x_buffers() {
  thread_local XBuffers b;
  return b;
}

// x of m rows and cols columns packed into b; in_scale: int8 input's scales (null for fp32
// input, whose scales packing writes into b).
PackedX packed_x_in(XBuffers& b, int64_t m, int64_t cols, const float* in_scale) {
  const Int8Isa isa = int8_isa();
  const int64_t ld = (cols + kGroupCols - 1) / kGroupCols * kGroupCols;
  const int64_t bytes = m * ld * (isa == Int8Isa::kAvx2 ? 2 : 1);
  b.x.resize(static_cast<size_t>((bytes + 1) / 2));
  float* out = nullptr;
  if (in_scale == nullptr) {
    b.scale.resize(static_cast<size_t>(m));
    out = b.scale.data();
  }
  return {isa, b.x.data(), ld, in_scale != nullptr ? in_scale : out, out, m};
}

void pack_row(const PackedX& px, int64_t t, const int8_t* q, int64_t cols) {
  if (px.isa == Int8Isa::kAvx512Vnni) {
    uint8_t* dst = static_cast<uint8_t*>(px.data) + t * px.ld;
    for (int64_t c = 0; c < cols; ++c) dst[c] = static_cast<uint8_t>(q[c]) ^ 0x80u;
    std::fill(dst + cols, dst + px.ld, uint8_t{0x80});
  } else if (px.isa == Int8Isa::kAvx2) {
    int16_t* dst = static_cast<int16_t*>(px.data) + t * px.ld;
    for (int64_t c = 0; c < cols; ++c) dst[c] = q[c];
    std::fill(dst + cols, dst + px.ld, int16_t{0});
  } else {
    int8_t* dst = static_cast<int8_t*>(px.data) + t * px.ld;
    std::memcpy(dst, q, static_cast<size_t>(cols));
    std::fill(dst + cols, dst + px.ld, int8_t{0});
  }
}

// The balanced size of pass i of `passes` over the tokens left from t of n (13 as 7 + 6).
int pass_tokens(int64_t n, int64_t t, int64_t i, int64_t passes) {
  return static_cast<int>((n - t + passes - i - 1) / (passes - i));
}

// Where each pass of a k block prefetches: an equal share of the next block's groups (the
// pair's next block, or after its last block the next pair's first: pairs are contiguous),
// so memory keeps streaming while the passes that find this block in L1 compute.
Prefetch block_share(const int8_t* next, int64_t block_groups, int64_t pass, int64_t passes) {
  const int64_t share = (kKBlockGroups + passes - 1) / passes;
  return {next + pass * share * kGroupBytes, std::max<int64_t>(1, block_groups / share), share};
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
void vnni_pair(const PackedX& px, const Int8PanelsRef& w, int64_t p, int32_t* acc) {
  const int64_t groups = w.groups(), n = px.m;
  const int8_t* wp = w.data + p * groups * kGroupBytes;
  const int32_t* start = w.correction + p * kPairRows;
  const auto* x = static_cast<const uint8_t*>(px.data);
  const auto tile = [&](int tb, const uint8_t* xt, int64_t gb, int64_t ge, const int32_t* st,
                        int32_t* a, Prefetch pf) {
    const bool ran = dispatch_1_to<kVnniMaxTokens>(
        tb, [&]<int T>() { vnni_tile<T>(xt, px.ld, wp, gb, ge, st, a, kPairRows, pf); });
    XDS_CHECK(ran, "int8 vnni tile: {} tokens", tb);
  };
  if (n <= kVnniMaxTokens) {
    return tile(static_cast<int>(n), x, 0, groups, start, acc, {wp + kAheadBytes, 1, INT64_MAX});
  }
  const int64_t passes = (n + kVnniMaxTokens - 1) / kVnniMaxTokens;
  for (int64_t kb = 0; kb < groups; kb += kKBlockGroups) {
    const int64_t ke = std::min(groups, kb + kKBlockGroups);
    int64_t t = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const int tb = pass_tokens(n, t, i, passes);
      tile(tb, x + t * px.ld, kb, ke, kb == 0 ? start : nullptr, acc + t * kPairRows,
           block_share(wp + ke * kGroupBytes, ke - kb, i, passes));
      t += tb;
    }
  }
}
#else
void vnni_pair(const PackedX&, const Int8PanelsRef&, int64_t, int32_t*) {
  XDS_CHECK(false, "int8: this build has no AVX512_VNNI");
}
#endif

void avx2_pair(const PackedX& px, const Int8PanelsRef& w, int64_t p, int32_t* acc) {
  const int64_t groups = w.groups(), n = px.m;
  const int8_t* wp = w.data + p * groups * kGroupBytes;
  const auto* x = static_cast<const int16_t*>(px.data);
  if (n == 1) {  // the whole pair in one pass: 8 accumulators
    return avx2_tile<1, 8>(x, px.ld, wp, 0, 0, groups, true, acc, kPairRows,
                           {wp + kAheadBytes, 1, INT64_MAX});
  }
  // A panel (4 quads) at a time, both panels' passes per k block.
  const int64_t per_panel = (n + kAvx2MaxTokens - 1) / kAvx2MaxTokens;
  for (int64_t kb = 0; kb < groups; kb += kKBlockGroups) {
    const int64_t ke = std::min(groups, kb + kKBlockGroups);
    for (int h = 0; h < 2; ++h) {
      int64_t t = 0;
      for (int64_t i = 0; i < per_panel; ++i) {
        const int tb = pass_tokens(n, t, i, per_panel);
        const Prefetch pf =
            block_share(wp + ke * kGroupBytes, ke - kb, h * per_panel + i, 2 * per_panel);
        const int16_t* xt = x + t * px.ld;
        int32_t* a = acc + t * kPairRows;
        if (tb == 1) {
          avx2_tile<1, 4>(xt, px.ld, wp, 4 * h, kb, ke, kb == 0, a, kPairRows, pf);
        } else {
          avx2_tile<2, 4>(xt, px.ld, wp, 4 * h, kb, ke, kb == 0, a, kPairRows, pf);
        }
        t += tb;
      }
    }
  }
}

// acc [m][32] = the exact int32 sums of every token against pair p.
void pair_sums(const PackedX& px, const Int8PanelsRef& w, int64_t p, int32_t* acc) {
  switch (px.isa) {
    case Int8Isa::kAvx512Vnni:
      return vnni_pair(px, w, p, acc);
    case Int8Isa::kAvx2:
      return avx2_pair(px, w, p, acc);
    case Int8Isa::kScalar:
      return scalar_pair(static_cast<const int8_t*>(px.data), px.m, px.ld,
                         w.data + p * w.groups() * kGroupBytes, w.groups(), acc, kPairRows);
  }
}

PairOut pair_out(const Int8Output& y, int64_t t, int64_t p, int64_t rows) {
  const int64_t at = t * y.ld + p * kPairRows;
  return {y.f32 != nullptr ? y.f32 + at : nullptr, y.bf16 != nullptr ? y.bf16 + at : nullptr,
          static_cast<int>(std::min(kPairRows, rows - p * kPairRows))};
}

// The chunk of pairs a thread takes at a time (about four chunks per thread), or 0 when
// the call runs on the calling thread.
int64_t pair_chunk(int64_t pairs, int64_t multiply_adds, int threads) {
  if (threads <= 1 || multiply_adds < kMinPoolMultiplyAdds) return 0;
  return std::max<int64_t>(1, pairs / (4 * int64_t{threads}));
}

// Up to this many elements of x (m · cols) every thread packs the whole x for itself (a
// decode batch: a few microseconds at most) rather than share the rows and wait for the
// others: a thread that waits on another that the OS has descheduled loses its slice.
constexpr int64_t kPrivatePackElements = 16384;

// One call: pack x's rows (pack(px, t)), then run the pairs in chunks (run_pairs(px, p0,
// p1)). On the pool the chunks come from a shared counter; x is packed by every thread for
// itself when small, else once, its rows shared from a counter, the threads waiting until
// all are packed. Otherwise all on the calling thread.
template <class Pack, class Pairs>
void run_call(ThreadPool* pool, int64_t m, int64_t cols, const float* in_scale, int64_t pairs,
              int64_t multiply_adds, Pack&& pack, Pairs&& run_pairs) {
  const int64_t chunk = pair_chunk(pairs, multiply_adds, pool != nullptr ? pool->num_threads() : 1);
  if (chunk == 0) {
    const PackedX px = packed_x_in(thread_x_buffers(), m, cols, in_scale);
    for (int64_t t = 0; t < m; ++t) pack(px, t);
    return run_pairs(px, int64_t{0}, pairs);
  }
  const int64_t chunks = (pairs + chunk - 1) / chunk;
  std::atomic<int64_t> next_chunk{0};
  const auto take_chunks = [&](const PackedX& px) {
    for (int64_t c = next_chunk.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next_chunk.fetch_add(1, std::memory_order_relaxed))
      run_pairs(px, c * chunk, std::min(pairs, (c + 1) * chunk));
  };
  if (m * cols <= kPrivatePackElements) {
    pool->run_on_available([&](int) {
      const PackedX px = packed_x_in(thread_x_buffers(), m, cols, in_scale);  // this thread's
      for (int64_t t = 0; t < m; ++t) pack(px, t);
      take_chunks(px);
    });
    return;
  }
  const PackedX shared = packed_x_in(thread_x_buffers(), m, cols, in_scale);  // the caller's
  std::atomic<int64_t> next_row{0}, packed{0};
  pool->run_on_available([&](int) {
    for (int64_t t = next_row.fetch_add(1, std::memory_order_relaxed); t < m;
         t = next_row.fetch_add(1, std::memory_order_relaxed)) {
      pack(shared, t);
      packed.fetch_add(1, std::memory_order_release);
    }
    while (packed.load(std::memory_order_acquire) < m) _mm_pause();
    take_chunks(shared);
  });
}

// Per-thread int32 sums of one pair, [m][32] (twice for gate/up).
int32_t* thread_acc(int64_t m, int which) {
  thread_local std::vector<int32_t> acc[2];
  acc[which].resize(static_cast<size_t>(m * kPairRows));
  return acc[which].data();
}

void check_shapes(const Int8RowsRef& x, const Int8PanelsRef& w, const Int8Output& y) {
  XDS_CHECK(x.cols == w.cols, "int8 linear: x has {} columns, W {}", x.cols, w.cols);
  XDS_CHECK((y.f32 != nullptr) != (y.bf16 != nullptr), "int8 linear: set exactly one output");
  XDS_CHECK(y.ld >= w.rows, "int8 linear: output stride {} < {} rows", y.ld, w.rows);
}

// The int8 rows' packing and the linear epilogue's pairs, for run_call.
auto pack_int8_rows(const Int8RowsRef& x) {
  return [&x](const PackedX& px, int64_t t) { pack_row(px, t, x.q + t * x.ld, x.cols); };
}

auto linear_pairs(const Int8PanelsRef& w, const Int8Output& y) {
  return [&w, &y](const PackedX& px, int64_t p0, int64_t p1) {
    int32_t* acc = thread_acc(px.m, 0);
    for (int64_t p = p0; p < p1; ++p) {
      pair_sums(px, w, p, acc);
      for (int64_t t = 0; t < px.m; ++t)
        epilogue_linear(acc + t * kPairRows, w.scale + p * kPairRows, px.scale[t],
                        pair_out(y, t, p, w.rows));
    }
  };
}

void linear_call(const Int8RowsRef& x, const Int8PanelsRef& w, const Int8Output& y,
                 ThreadPool* pool) {
  check_shapes(x, w, y);
  if (x.rows == 0 || w.rows == 0) return;
  run_call(pool, x.rows, x.cols, x.scale, w.pairs(), x.rows * w.rows * w.cols, pack_int8_rows(x),
           linear_pairs(w, y));
}

// Up to this many elements of h (m · rows) the calling thread quantizes h after the
// products; beyond, the pool's threads share its rows.
constexpr int64_t kSerialQuantizeElements = 65536;

void gate_up_call(const Int8RowsRef& x, const Int8GateUp& w, const Int8Output& h,
                  const Int8RowsOut* hq, ThreadPool* pool) {
  const Int8PanelsRef& gate = *w.gate;
  const Int8PanelsRef& up = *w.up;
  XDS_CHECK(gate.rows == up.rows && gate.cols == up.cols,
            "int8 gate/up: gate [{}, {}] and up [{}, {}] differ", gate.rows, gate.cols, up.rows,
            up.cols);
  check_shapes(x, gate, h);
  if (x.rows == 0 || gate.rows == 0) return;
  const auto pairs = [&](const PackedX& px, int64_t p0, int64_t p1) {
    int32_t* acc_g = thread_acc(px.m, 0);
    int32_t* acc_u = thread_acc(px.m, 1);
    for (int64_t p = p0; p < p1; ++p) {
      pair_sums(px, gate, p, acc_g);
      pair_sums(px, up, p, acc_u);
      for (int64_t t = 0; t < px.m; ++t)
        epilogue_gate_up(acc_g + t * kPairRows, acc_u + t * kPairRows, gate.scale + p * kPairRows,
                         up.scale + p * kPairRows, px.scale[t], pair_out(h, t, p, gate.rows));
    }
  };
  run_call(pool, x.rows, x.cols, x.scale, gate.pairs(), 2 * x.rows * gate.rows * gate.cols,
           pack_int8_rows(x), pairs);
  if (hq == nullptr) return;
  // The quantized h: each row once all of it is written (after the products' region).
  const auto quantize = [&](int64_t t0, int64_t t1, int) {
    if (h.f32 != nullptr) {
      quantize_rows_int8(h.f32 + t0 * h.ld, t1 - t0, gate.rows, h.ld,
                         {hq->q + t0 * hq->ld, hq->scale + t0, hq->ld});
    } else {
      quantize_rows_int8(h.bf16 + t0 * h.ld, t1 - t0, gate.rows, h.ld,
                         {hq->q + t0 * hq->ld, hq->scale + t0, hq->ld});
    }
  };
  if (pool == nullptr || x.rows * gate.rows <= kSerialQuantizeElements)
    return quantize(0, x.rows, 0);
  pool->parallel_for(x.rows, quantize);
}

}  // namespace

bool int8_isa_available(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kScalar:
    case Int8Isa::kAvx2:
      return true;
    case Int8Isa::kAvx512Vnni:
      if constexpr (kHaveVnni) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
      }
      return false;
  }
  return false;
}

Int8Isa int8_isa() {
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  return forced < 0 ? default_isa() : static_cast<Int8Isa>(forced);
}

void set_int8_isa(Int8Isa isa) {
  XDS_CHECK(int8_isa_available(isa), "set_int8_isa: {} is not available here", int8_isa_name(isa));
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kScalar:
      return "scalar";
    case Int8Isa::kAvx2:
      return "avx2";
    case Int8Isa::kAvx512Vnni:
      return "avx512_vnni";
  }
  return "?";
}

void pack_int8_panels(const Int8RowsRef& w, int64_t pair_begin, int64_t pair_end,
                      const Int8PanelsOut& out) {
  XDS_CHECK(w.cols <= kInt8MaxCols, "pack_int8_panels: {} columns > {}", w.cols, kInt8MaxCols);
  const Int8PanelsRef shape{nullptr, nullptr, nullptr, w.rows, w.cols};
  const int64_t groups = shape.groups();
  for (int64_t p = pair_begin; p < pair_end; ++p) {
    int8_t* pair = out.data + p * groups * kGroupBytes;
    for (int j = 0; j < kPairRows; ++j) {
      const int64_t r = p * kPairRows + j;
      int8_t* dst = pair + (j / 16) * kLineBytes + (j % 16) * 4;
      const int8_t* src = r < w.rows ? w.q + r * w.ld : nullptr;
      int64_t sum = 0;
      for (int64_t c = 0; c < groups * kGroupCols; ++c) {
        const int8_t v = src != nullptr && c < w.cols ? src[c] : int8_t{0};
        dst[(c / kGroupCols) * kGroupBytes + c % kGroupCols] = v;
        sum += v;
      }
      out.scale[r] = src != nullptr ? w.scale[r] : 0.0f;
      // -128 Σ w modulo 2^32 (|Σ| < 2^24 here; the VNNI sums end exact modulo 2^32).
      out.correction[r] = static_cast<int32_t>(static_cast<uint32_t>(-128 * sum));
    }
  }
}

void Int8Panels::Free::operator()(void* p) const {
  std::free(p);
}

Int8Panels Int8Panels::pack(const Int8RowsRef& w) {
  Int8Panels m;
  m.rows_ = w.rows;
  m.cols_ = w.cols;
  const Int8PanelsRef shape{nullptr, nullptr, nullptr, w.rows, w.cols};
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(shape.data_bytes(), 64));
  m.data_.reset(static_cast<int8_t*>(std::aligned_alloc(64, bytes)));
  XDS_CHECK(m.data_ != nullptr, "Int8Panels: out of memory for {} bytes", bytes);
  m.scale_ = std::make_unique<float[]>(static_cast<size_t>(shape.stored_rows()));
  m.correction_ = std::make_unique<int32_t[]>(static_cast<size_t>(shape.stored_rows()));
  pack_int8_panels(w, 0, shape.pairs(), {m.data_.get(), m.scale_.get(), m.correction_.get()});
  return m;
}

Int8PanelsRef Int8Panels::ref() const {
  return {data_.get(), scale_.get(), correction_.get(), rows_, cols_};
}

void int8_linear(const Int8RowsRef& x, const Int8PanelsRef& w, const Int8Output& y,
                 ThreadPool& pool) {
  linear_call(x, w, y, &pool);
}

void int8_linear_on_thread(const Int8RowsRef& x, const Int8PanelsRef& w, const Int8Output& y) {
  linear_call(x, w, y, nullptr);
}

void int8_linear_f32(const float* x, int64_t m, int64_t ldx, const Int8PanelsRef& w,
                     const Int8Output& y, ThreadPool& pool) {
  XDS_CHECK((y.f32 != nullptr) != (y.bf16 != nullptr), "int8 linear: set exactly one output");
  XDS_CHECK(y.ld >= w.rows, "int8 linear: output stride {} < {} rows", y.ld, w.rows);
  if (m == 0 || w.rows == 0) return;
  const auto pack = [&](const PackedX& px, int64_t t) {
    thread_local std::vector<int8_t> q;  // this thread's row
    q.resize(static_cast<size_t>(w.cols));
    px.scale_out[t] = quantize_row_int8(x + t * ldx, w.cols, q.data());
    pack_row(px, t, q.data(), w.cols);
  };
  run_call(&pool, m, w.cols, nullptr, w.pairs(), m * w.rows * w.cols, pack, linear_pairs(w, y));
}

void int8_linear_sums_on_thread(const Int8RowsRef& x, const Int8PanelsRef& w, int32_t* sums,
                                int64_t ld) {
  XDS_CHECK(x.cols == w.cols, "int8 linear: x has {} columns, W {}", x.cols, w.cols);
  if (x.rows == 0 || w.rows == 0) return;
  const PackedX px = packed_x_in(thread_x_buffers(), x.rows, x.cols, x.scale);
  for (int64_t t = 0; t < x.rows; ++t) pack_row(px, t, x.q + t * x.ld, x.cols);
  int32_t* acc = thread_acc(px.m, 0);
  for (int64_t p = 0; p < w.pairs(); ++p) {
    pair_sums(px, w, p, acc);
    const int64_t real = std::min(kPairRows, w.rows - p * kPairRows);
    for (int64_t t = 0; t < x.rows; ++t)
      std::memcpy(sums + t * ld + p * kPairRows, acc + t * kPairRows,
                  sizeof(int32_t) * static_cast<size_t>(real));
  }
}

void int8_gate_up(const Int8RowsRef& x, const Int8GateUp& w, const Int8Output& h,
                  const Int8RowsOut* hq, ThreadPool& pool) {
  gate_up_call(x, w, h, hq, &pool);
}

void int8_gate_up_on_thread(const Int8RowsRef& x, const Int8GateUp& w, const Int8Output& h,
                            const Int8RowsOut* hq) {
  gate_up_call(x, w, h, hq, nullptr);
}

}  // namespace xds::kernels
