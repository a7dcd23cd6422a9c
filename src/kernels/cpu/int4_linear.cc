#include "kernels/cpu/int4_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "base/check.h"
#include "kernels/cpu/int4_kernels.h"
#include "kernels/cpu/int8_tiles.h"

namespace xds::kernels {
namespace {

using namespace int4_detail;

// Below this many multiply-adds a call runs on the calling thread (waking the pool costs
// more).
constexpr int64_t kMinPoolMultiplyAdds = int64_t{1} << 18;

std::atomic<int> g_forced_isa{-1};

Int4Isa default_isa() {
  static const Int4Isa isa =
      int4_isa_available(Int4Isa::kAvx512Vnni) ? Int4Isa::kAvx512Vnni : Int4Isa::kAvx2;
  return isa;
}

// The shape half of check_int4_source (no pass over the values).
Status check_int4_shape(const Int4Source& w) {
  if (!int4_group_cols_supported(w.group_cols))
    return invalid_argument("int4 weights: group of {} columns (expected 32, 64 or 128)",
                            w.group_cols);
  if (w.rows < 0 || w.cols < 0)
    return invalid_argument("int4 weights: shape [{}, {}]", w.rows, w.cols);
  if (w.cols % w.group_cols != 0)
    return invalid_argument("int4 weights: {} columns is not a multiple of the group of {}", w.cols,
                            w.group_cols);
  if (w.rows > 0 && w.cols > 0 && (w.q == nullptr || w.scale == nullptr))
    return invalid_argument("int4 weights: null q or scale");
  return Status::ok_status();
}

// The first value above 15 of rows [r0, r1) of q (or of the zero points), as an error.
Status check_int4_rows(const Int4Source& w, int64_t r0, int64_t r1) {
  const int64_t groups = w.cols / w.group_cols;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < w.cols; ++c)
      if (w.q[r * w.cols + c] > 15)
        return invalid_argument("int4 weights: q[{}][{}] = {} > 15", r, c, w.q[r * w.cols + c]);
    for (int64_t g = 0; w.zero != nullptr && g < groups; ++g)
      if (w.zero[r * groups + g] > 15)
        return invalid_argument("int4 weights: zero[{}][{}] = {} > 15", r, g,
                                w.zero[r * groups + g]);
  }
  return Status::ok_status();
}

// One pair's view of the packed weights.
PairView pair_view(const Int4PanelsRef& w, int64_t p) {
  const int64_t meta = p * w.groups() * kPairRows;
  return {w.data + p * w.cols * 16, w.scale + meta, w.zero != nullptr ? w.zero + meta : nullptr,
          w.groups(), w.group_cols};
}

// The chunk of pairs a thread takes at a time (about four chunks per thread), or 0 when
// the call runs on the calling thread.
int64_t pair_chunk(int64_t pairs, int64_t multiply_adds, int threads) {
  if (threads <= 1 || multiply_adds < kMinPoolMultiplyAdds) return 0;
  return std::max<int64_t>(1, pairs / (4 * int64_t{threads}));
}

// run(p0, p1) over every pair: on the pool's threads in chunks from a shared counter, or on
// the calling thread (pool null or a small call).
template <class Run>
void run_pairs(ThreadPool* pool, int64_t pairs, int64_t multiply_adds, Run&& run) {
  const int64_t chunk = pair_chunk(pairs, multiply_adds, pool != nullptr ? pool->num_threads() : 1);
  if (chunk == 0) return run(int64_t{0}, pairs);
  const int64_t chunks = (pairs + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  pool->run_on_available([&](int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed))
      run(c * chunk, std::min(pairs, (c + 1) * chunk));
  });
}

// A thread's fp32 sums of one pair, [m][32].
float* thread_acc(int64_t m) {
  thread_local std::vector<float> acc;
  acc.resize(static_cast<size_t>(m * kPairRows));
  return acc.data();
}

// Token t's 32 values v (times sx when set) into y's rows of pair p.
void store_pair(const float* v, const float* sx, const Int8Output& y, int64_t t, int64_t p,
                int64_t rows) {
  alignas(32) float out[kPairRows];
  for (int i = 0; i < kPairRows; ++i) out[i] = sx != nullptr ? v[i] * *sx : v[i];
  const int64_t at = t * y.ld + p * kPairRows;
  int8_detail::store_pair_row(
      out, {y.f32 != nullptr ? y.f32 + at : nullptr, y.bf16 != nullptr ? y.bf16 + at : nullptr,
            static_cast<int>(std::min(kPairRows, rows - p * kPairRows))});
}

void check_call(int64_t x_cols, const Int4PanelsRef& w, const Int8Output& y) {
  XDS_CHECK(x_cols == w.cols, "int4 linear: x has {} columns, W {}", x_cols, w.cols);
  XDS_CHECK(int4_group_cols_supported(w.group_cols) && w.cols % w.group_cols == 0,
            "int4 linear: {} columns in groups of {}", w.cols, w.group_cols);
  XDS_CHECK((y.f32 != nullptr) != (y.bf16 != nullptr), "int4 linear: set exactly one output");
  XDS_CHECK(y.ld >= w.rows, "int4 linear: output stride {} < {} rows", y.ld, w.rows);
  XDS_CHECK(reinterpret_cast<uintptr_t>(w.data) % 64 == 0,
            "int4 linear: weight data not 64-byte aligned");
}

using A8Pair = void (*)(const A8Tokens&, const PairView&, float*);
using A16Pair = void (*)(const A16Tokens&, const PairView&, float*);

A8Pair a8_pair_of(Int4Isa isa) {
  switch (isa) {
    case Int4Isa::kAvx512Vnni:
      return a8_pair_avx512;
    case Int4Isa::kAvx2:
      return a8_pair_avx2;
    case Int4Isa::kScalar:
      break;
  }
  return a8_pair_scalar;
}

A16Pair a16_pair_of(Int4Isa isa) {
  switch (isa) {
    case Int4Isa::kAvx512Vnni:
      return a16_pair_avx512;
    case Int4Isa::kAvx2:
      return a16_pair_avx2;
    case Int4Isa::kScalar:
      break;
  }
  return a16_pair_scalar;
}

void a8_call(const Int8RowsRef& x, const Int4PanelsRef& w, const Int8Output& y, ThreadPool* pool) {
  check_call(x.cols, w, y);
  if (x.rows == 0 || w.rows == 0) return;
  // Σ xq per token and group [m][groups], read by every thread.
  thread_local std::vector<int32_t> xsum;
  const int64_t groups = w.groups();
  xsum.resize(static_cast<size_t>(x.rows * groups));
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      int32_t s = 0;
      for (int64_t c = g * w.group_cols; c < (g + 1) * w.group_cols; ++c) s += x.q[t * x.ld + c];
      xsum[static_cast<size_t>(t * groups + g)] = s;
    }
  const A8Tokens tokens{x.q, x.ld, xsum.data(), x.rows};
  const A8Pair pair = a8_pair_of(int4_isa());
  run_pairs(pool, w.pairs(), x.rows * w.rows * w.cols, [&](int64_t p0, int64_t p1) {
    float* acc = thread_acc(x.rows);
    for (int64_t p = p0; p < p1; ++p) {
      pair(tokens, pair_view(w, p), acc);
      for (int64_t t = 0; t < x.rows; ++t)
        store_pair(acc + t * kPairRows, x.scale + t, y, t, p, w.rows);
    }
  });
}

void a16_call(const float* x, int64_t m, int64_t ldx, const Int4PanelsRef& w, const Int8Output& y,
              ThreadPool* pool) {
  check_call(w.cols, w, y);
  XDS_CHECK(ldx >= w.cols, "int4 linear: x stride {} < {} columns", ldx, w.cols);
  if (m == 0 || w.rows == 0) return;
  // Σ x per token and group (asymmetric weights only): in double, rounded once.
  thread_local std::vector<float> xsum;
  const int64_t groups = w.groups();
  if (w.zero != nullptr) {
    xsum.resize(static_cast<size_t>(m * groups));
    for (int64_t t = 0; t < m; ++t)
      for (int64_t g = 0; g < groups; ++g) {
        double s = 0;
        for (int64_t c = g * w.group_cols; c < (g + 1) * w.group_cols; ++c) s += x[t * ldx + c];
        xsum[static_cast<size_t>(t * groups + g)] = static_cast<float>(s);
      }
  }
  const A16Tokens tokens{x, ldx, w.zero != nullptr ? xsum.data() : nullptr, m};
  const A16Pair pair = a16_pair_of(int4_isa());
  run_pairs(pool, w.pairs(), m * w.rows * w.cols, [&](int64_t p0, int64_t p1) {
    float* acc = thread_acc(m);
    for (int64_t p = p0; p < p1; ++p) {
      pair(tokens, pair_view(w, p), acc);
      for (int64_t t = 0; t < m; ++t) store_pair(acc + t * kPairRows, nullptr, y, t, p, w.rows);
    }
  });
}

}  // namespace

bool int4_isa_available(Int4Isa isa) {
  switch (isa) {
    case Int4Isa::kScalar:
    case Int4Isa::kAvx2:
      return true;
    case Int4Isa::kAvx512Vnni:
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni");
#else
      return false;
#endif
  }
  return false;
}

Int4Isa int4_isa() {
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  return forced < 0 ? default_isa() : static_cast<Int4Isa>(forced);
}

void set_int4_isa(Int4Isa isa) {
  XDS_CHECK(int4_isa_available(isa), "set_int4_isa: {} is not available here", int4_isa_name(isa));
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* int4_isa_name(Int4Isa isa) {
  switch (isa) {
    case Int4Isa::kScalar:
      return "scalar";
    case Int4Isa::kAvx2:
      return "avx2";
    case Int4Isa::kAvx512Vnni:
      return "avx512_vnni";
  }
  return "?";
}

Status check_int4_source(const Int4Source& w) {
  XDS_RETURN_IF_ERROR(check_int4_shape(w));
  return check_int4_rows(w, 0, w.rows);
}

void pack_int4_panels(const Int4Source& w, int64_t pair_begin, int64_t pair_end,
                      const Int4PanelsOut& out) {
  const Status shape = check_int4_shape(w);
  XDS_CHECK(shape.ok(), "pack_int4_panels: {}", shape.message());
  XDS_CHECK((out.zero != nullptr) == (w.zero != nullptr),
            "pack_int4_panels: zero points in {} but not in {}",
            w.zero != nullptr ? "the source" : "the output",
            w.zero != nullptr ? "the output" : "the source");
  const int64_t groups = w.cols / w.group_cols;
  const int64_t real_end = std::min(w.rows, pair_end * kPairRows);
  const Status values = check_int4_rows(w, std::min(real_end, pair_begin * kPairRows), real_end);
  XDS_CHECK(values.ok(), "pack_int4_panels: {}", values.message());
  for (int64_t p = pair_begin; p < pair_end; ++p) {
    uint8_t* pair = out.data + p * w.cols * 16;
    std::memset(pair, 0, static_cast<size_t>(w.cols * 16));
    for (int j = 0; j < kPairRows; ++j) {
      const int64_t r = p * kPairRows + j;
      const bool real = r < w.rows;
      if (real) {
        const int shift = j < 16 ? 0 : 4;
        uint8_t* lane = pair + 4 * (j % 16);
        for (int64_t c = 0; c < w.cols; ++c)
          lane[(c / kQuadCols) * kLineBytes + c % kQuadCols] |=
              static_cast<uint8_t>(w.q[r * w.cols + c] << shift);
      }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = (p * groups + g) * kPairRows + j;
        out.scale[at] = real ? w.scale[r * groups + g] : 0.0f;
        if (out.zero != nullptr) out.zero[at] = real ? w.zero[r * groups + g] : uint8_t{0};
      }
    }
  }
}

void Int4Panels::Free::operator()(void* p) const {
  std::free(p);
}

Int4Panels Int4Panels::pack(const Int4Source& w) {
  Int4Panels m;
  m.rows_ = w.rows;
  m.cols_ = w.cols;
  m.group_cols_ = w.group_cols;
  const Int4PanelsRef shape{nullptr, nullptr, nullptr, w.rows, w.cols, w.group_cols};
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(shape.data_bytes(), 64));
  m.data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
  XDS_CHECK(m.data_ != nullptr, "Int4Panels: out of memory for {} bytes", bytes);
  const size_t meta = static_cast<size_t>(std::max<int64_t>(shape.scale_count(), 1));
  m.scale_ = std::make_unique<float[]>(meta);
  if (w.zero != nullptr) m.zero_ = std::make_unique<uint8_t[]>(meta);
  pack_int4_panels(w, 0, shape.pairs(), {m.data_.get(), m.scale_.get(), m.zero_.get()});
  return m;
}

Int4PanelsRef Int4Panels::ref() const {
  return {data_.get(), scale_.get(), zero_.get(), rows_, cols_, group_cols_};
}

void int4_linear(const Int8RowsRef& x, const Int4PanelsRef& w, const Int8Output& y,
                 ThreadPool& pool) {
  a8_call(x, w, y, &pool);
}

void int4_linear_on_thread(const Int8RowsRef& x, const Int4PanelsRef& w, const Int8Output& y) {
  a8_call(x, w, y, nullptr);
}

void int4_linear_f32(const float* x, int64_t m, int64_t ldx, const Int4PanelsRef& w,
                     const Int8Output& y, ThreadPool& pool) {
  a16_call(x, m, ldx, w, y, &pool);
}

void int4_linear_f32_on_thread(const float* x, int64_t m, int64_t ldx, const Int4PanelsRef& w,
                               const Int8Output& y) {
  a16_call(x, m, ldx, w, y, nullptr);
}

void int4_linear_bf16(const uint16_t* x, int64_t m, int64_t ldx, const Int4PanelsRef& w,
                      const Int8Output& y, ThreadPool& pool) {
  thread_local std::vector<float> xf;  // [m][cols], the exact widening
  xf.resize(static_cast<size_t>(m * w.cols));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t c = 0; c < w.cols; ++c) xf[t * w.cols + c] = bf16_to_f32(x[t * ldx + c]);
  a16_call(xf.data(), m, w.cols, w, y, &pool);
}

}  // namespace xds::kernels
