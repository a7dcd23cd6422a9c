// The absorbed attention's fp32 products over an INT8 latent plane (LatentKvView::int8()):
// rows are dequantized chunk by chunk (kInt8ChunkRows rows, all heads) into a compact fp32
// view, which the fp32 kernel then reads as any other view. Each chunk is a part of the
// context (unnormalised sums, max, sum of weights); the chunks fold into the caller's part in
// ascending order:
//   M = max(m, m_c);  out = e^(m - M) out + e^(m_c - M) out_c;  l = e^(m - M) l + e^(m_c - M) l_c
// The compact view keeps the cache's block size: a chunk's rows sit at their position less
// the chunk's first block's first row, and its block table maps block k to k - first block.
// The bf16 products (AbsorbedQuery::bf16 where available) read the INT8 rows directly, slice
// by slice (mla_attention_bf16.cc): the copy's write and re-read cost them more than the
// INT8 rows saved.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/mla_absorbed_group.h"
#include "kernels/cpu/mla_attention.h"

namespace xds::kernels {

namespace {

// A compact fp32 view of rows [c0, c1) of `kv` in the thread's buffers.
struct CompactChunk {
  std::vector<float> latent, rope;
  std::vector<int32_t> table;

  LatentKvView fill(const LatentKvView& kv, int64_t c0, int64_t c1) {
    const int64_t bs = kv.block_size, lat = kv.latent_dim, dr = kv.rope_dim;
    const int64_t first = c0 / bs, last = (c1 - 1) / bs;
    const int64_t rows = (last - first + 1) * bs, at = c0 - first * bs;
    table.assign(static_cast<size_t>(last + 1), 0);
    for (int64_t k = first; k <= last; ++k)
      table[static_cast<size_t>(k)] = static_cast<int32_t>(k - first);
    LatentKvView v;
    v.block_table = table.data();
    v.block_size = bs;
    v.latent_dim = lat;
    v.rope_dim = dr;
    const int64_t ld = padded_latent_stride(lat, 4);
    latent.resize(static_cast<size_t>(rows * ld));
    rope.resize(static_cast<size_t>(std::max<int64_t>(1, rows * dr)));
    dequantize_int8_kv_rows(kv, c0, c1, latent.data() + at * ld, ld, rope.data() + at * dr);
    v.latent = latent.data();
    v.rope = rope.data();
    v.latent_ld = ld;
    return v;
  }
};

}  // namespace

void dequantize_int8_kv_rows(const LatentKvView& kv, int64_t s_begin, int64_t s_end, float* latent,
                             int64_t latent_ld, float* rope) {
  XDS_CHECK(kv.int8(), "dequantize_int8_kv_rows: the view has no INT8 latent plane");
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  for (int64_t s = s_begin; s < s_end; ++s) {
    const int64_t i = s - s_begin;
    const int8_t* q = kv.latent8_at(s);
    const float scale = kv.latent_scale_at(s);
    float* dst = latent + i * latent_ld;
    for (int64_t c = 0; c < lat; ++c) dst[c] = static_cast<float>(q[c]) * scale;
    float* r = rope + i * dr;
    if (kv.rope16 != nullptr) {
      const uint16_t* src = kv.rope16 + kv.rope_offset(s);
      for (int64_t c = 0; c < dr; ++c)
        r[c] = std::bit_cast<float>(static_cast<uint32_t>(src[c]) << 16);
    } else {
      const float* src = kv.rope_at(s);
      std::copy_n(src, dr, r);
    }
  }
}

void absorbed_detail::attend_int8_part(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                                       const LatentKvView& kv, int64_t s_begin, int64_t s_end,
                                       float scale, const AbsorbedPart& part) {
  const int64_t nh = head_end - head_begin, lat = kv.latent_dim;
  XDS_CHECK(!(q.bf16 && absorbed_bf16_available()),
            "attend_int8_part: the bf16 products read INT8 rows directly");
  thread_local CompactChunk chunk;
  thread_local std::vector<float> folded;  // a later chunk's part: [nh, C] sums, m [nh], l [nh]
  for (int64_t c0 = s_begin; c0 < s_end; c0 += kInt8ChunkRows) {
    const int64_t c1 = std::min(s_end, c0 + kInt8ChunkRows);
    const LatentKvView v = chunk.fill(kv, c0, c1);
    if (c0 == s_begin) {  // the first chunk straight into the caller's part
      mla_absorbed_attention_part(q, head_begin, head_end, v, c0, c1, scale, part, nullptr);
      continue;
    }
    folded.resize(static_cast<size_t>(nh * (lat + 2)));
    float* out_c = folded.data();
    float* m_c = out_c + nh * lat;
    float* l_c = m_c + nh;
    mla_absorbed_attention_part(q, head_begin, head_end, v, c0, c1, scale, {out_c, lat, m_c, l_c},
                                nullptr);
    for (int64_t h = 0; h < nh; ++h) {
      const float mx = std::max(part.m[h], m_c[h]);
      const float a = std::exp(part.m[h] - mx), b = std::exp(m_c[h] - mx);
      float* o = part.out + h * part.out_ld;
      const float* oc = out_c + h * lat;
      for (int64_t c = 0; c < lat; ++c) o[c] = a * o[c] + b * oc[c];
      part.l[h] = a * part.l[h] + b * l_c[h];
      part.m[h] = mx;
    }
  }
}

}  // namespace xds::kernels
