// MLA attention over the paged latent KV cache: the weight-absorbed form (decode) and the
// expanded form (prefill chunks, see mla_expanded_attention).
//
// The cache keeps, per layer, two planes of fixed-size blocks of block_size rows:
//   latent: block_size rows of C per block   c = kv_a_layernorm(kv_a[:C])   (C = kv_lora_rank)
//   rope:   block_size rows of Dr per block  k_pe after rotation            (Dr = qk_rope_head_dim)
// Context position s of a sequence lives in block b = block_table[s / block_size], slot
// s % block_size, at
//   latent + b · latent_block_stride + slot · latent_ld     (rope: rope_block_stride, Dr)
// Within a block rows are latent_ld (rope: Dr) apart; blocks may lie anywhere a stride
// apart: compact planes [num_blocks, block_size, ld] (the default strides), or a block-major
// cache [block][layer][plane][block_size rows] whose block strides span every layer's planes.
// Latent rows may be padded (latent_ld > latent_dim, see padded_latent_stride): at C = 512 a
// dense row is 32 cache lines, so the rows of a block all fall in the same two L1 sets and a
// column strip of them cannot stay in L1.
//
// For one query token and heads [h0, h1):
//   score[h, s] = (q_abs[h]·latent(s) + q_pe[h]·rope(s)) * scale,  s < ctx
//   p = softmax_s(score);  out[h] = Σ_s p[h, s] latent(s)                 [H, C]
// q_abs[h] = W_UK[h]ᵀ q_nope[h] (absorbed), so out still needs W_UV[h] applied by the caller.
#pragma once

#include <cstdint>
#include <span>

namespace xds::kernels {

// The planes hold fp32 rows (latent, rope) or bf16 rows (latent16, rope16: each value the
// fp32 row's round-to-nearest-even, kv_row_to_bf16); exactly one pair is set. Only the
// absorbed kernel's bf16 products read bf16 planes (absorbed_bf16_available()).
// Strides count elements of the planes' type (float, or uint16_t for bf16 planes).
struct LatentKvView {
  const float* latent = nullptr;  // block 0's row 0; rows [block_size, latent_ld] per block,
                                  // first latent_dim used
  const float* rope = nullptr;    // block 0's row 0; rows [block_size, rope_dim] per block
  const int32_t* block_table = nullptr;
  int64_t block_size = 0;
  int64_t latent_dim = 0;
  int64_t rope_dim = 0;
  int64_t latent_ld = 0;               // elements from one cached row to the next; 0: latent_dim
  const uint16_t* latent16 = nullptr;  // bf16 planes, same shapes and strides
  const uint16_t* rope16 = nullptr;
  // Elements from one block to the next in each plane; 0: compact planes (block_size ·
  // latent_stride(), block_size · rope_dim).
  int64_t latent_block_stride = 0, rope_block_stride = 0;

  // INT8 latent (KvCacheDType int8): latent8 [block_size, latent_ld] int8 per block with
  // one fp32 scale per row at latent_scale [block_size] (row value = q · scale, the rule of
  // int8_quant.h); the rope plane is then `rope` (fp32) or `rope16` (bf16). latent_ld and
  // latent_block_stride count int8 elements, scale_block_stride floats, rope_block_stride
  // the rope plane's elements. The absorbed kernel's bf16 products read the int8 rows
  // directly (the scale applied to each row's score and probability); its fp32 products
  // dequantize them chunk by chunk (mla_attention_int8.cc).
  const int8_t* latent8 = nullptr;
  const float* latent_scale = nullptr;
  int64_t scale_block_stride = 0;  // 0: compact (block_size)

  bool bf16() const { return latent16 != nullptr; }
  bool int8() const { return latent8 != nullptr; }
  int64_t latent_stride() const { return latent_ld > 0 ? latent_ld : latent_dim; }
  int64_t latent_block_step() const {
    return latent_block_stride > 0 ? latent_block_stride : block_size * latent_stride();
  }
  int64_t rope_block_step() const {
    return rope_block_stride > 0 ? rope_block_stride : block_size * rope_dim;
  }
  // Offsets of context position s's rows from the plane pointers.
  int64_t latent_offset(int64_t s) const {
    return block_table[s / block_size] * latent_block_step() + s % block_size * latent_stride();
  }
  int64_t rope_offset(int64_t s) const {
    return block_table[s / block_size] * rope_block_step() + s % block_size * rope_dim;
  }
  int64_t scale_block_step() const {
    return scale_block_stride > 0 ? scale_block_stride : block_size;
  }
  int64_t scale_offset(int64_t s) const {
    return block_table[s / block_size] * scale_block_step() + s % block_size;
  }
  const float* latent_at(int64_t s) const { return latent + latent_offset(s); }
  const int8_t* latent8_at(int64_t s) const { return latent8 + latent_offset(s); }
  float latent_scale_at(int64_t s) const { return latent_scale[scale_offset(s)]; }
  const float* rope_at(int64_t s) const { return rope + rope_offset(s); }
  const uint16_t* latent16_at(int64_t s) const { return latent16 + latent_offset(s); }
  const uint16_t* rope16_at(int64_t s) const { return rope16 + rope_offset(s); }
};

// A row stride of an odd number of 64-byte lines, at least latent_dim elements of
// `element_bytes` (4: fp32, 2: bf16): consecutive cached rows then fall in different L1 sets.
constexpr int64_t padded_latent_stride(int64_t latent_dim, int64_t element_bytes = 4) {
  const int64_t per_line = 64 / element_bytes;
  const int64_t lines = (latent_dim + per_line - 1) / per_line;
  return per_line * (lines % 2 == 1 ? lines : lines + 1);
}

// dst[i] = bf16 of src[i], rounded to nearest even as the absorbed kernel's bf16 products
// round the fp32 rows they read (vcvtneps2bf16: denormals flushed to zero). The bf16 planes'
// writer. Needs absorbed_bf16_available().
void kv_row_to_bf16(const float* src, int64_t count, uint16_t* dst);

// Context rows [s_begin, s_end) of an INT8 view (kv.int8()) dequantized into fp32 rows:
// latent [s_end - s_begin][latent_ld] (first latent_dim used: q · scale), rope
// [s_end - s_begin][rope_dim] (bf16 widened exactly). The plain reader every INT8 path
// shares (the expanded form's gather, the absorbed kernel's chunks, tests).
void dequantize_int8_kv_rows(const LatentKvView& kv, int64_t s_begin, int64_t s_end,
                             float* latent, int64_t latent_ld, float* rope);

// q_abs: [heads, latent_dim] (row stride q_abs_ld), q_pe: [heads, rope_dim] (stride q_pe_ld),
// out: [heads, latent_dim] (stride out_ld).
// bf16: the fast mode's products (absorbed_bf16_available()): queries, cached rows and
// probabilities rounded to bf16, every dot product a vdpbf16ps pair (fp32 accumulation);
// else fp32 throughout.
struct AbsorbedQuery {
  const float* q_abs;
  int64_t q_abs_ld;
  const float* q_pe;
  int64_t q_pe_ld;
  float* out;
  int64_t out_ld;
  bool bf16 = false;
};

// Whether AbsorbedQuery::bf16 takes the bf16 products: built with AVX512_BF16 and the
// AVX-512 panel ISA selected (otherwise the fp32 kernel runs).
bool absorbed_bf16_available();

// Rows of context per slice of the absorbed kernel (256 KB of fp32 latent at C = 512).
inline constexpr int64_t kAbsorbedSliceRows = 128;
// Rows per dequantized chunk of an INT8 view with the fp32 products (1 MB of fp32 latent at
// C = 512: within L2).
inline constexpr int64_t kInt8ChunkRows = 4 * kAbsorbedSliceRows;

// Context rows that the calling thread attends to next (its next work item, perhaps of
// another sequence): a call given them prefetches their first slice while it computes its
// own last one, as each slice prefetches the next. Only a hint: results never depend on it.
// (Decode at batch 64 runs 128 items of ~257 cold rows per layer; each one's first slice
// otherwise waits on memory.) The bf16 products prefetch their whole first slice; the fp32
// kernel, which prefetches one tile ahead, their first tile.
struct AbsorbedNextRows {
  LatentKvView kv;
  int64_t begin = 0, end = 0;
};

// Heads [head_begin, head_end) of one query token over context [0, ctx), on the calling
// thread. INT8 views (kv.int8()): the bf16 products (AbsorbedQuery::bf16 where available)
// read the int8 rows slice by slice as any other view; the fp32 products dequantize them in
// chunks of kInt8ChunkRows rows into a compact fp32 view, each chunk attended as a part and
// the parts combined as mla_absorbed_merge does (the prefetch hint is not used there). Each
// cached position is read from memory once for all those heads (the latent is shared by
// every head, MQA-like): slice by slice, scores, an online softmax, then p·latent while the
// slice is in cache.
void mla_absorbed_attention(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                            const LatentKvView& kv, int64_t ctx, float scale,
                            const AbsorbedNextRows* next = nullptr);

// A part of one token's context, for several threads on one token (flash-decoding style):
// out[h] = Σ_{s in part} e^(score[h, s] - m[h]) latent(s), unnormalised, at out + h*out_ld;
// m[h] the part's max score, l[h] = Σ_{s in part} e^(score[h, s] - m[h]).
struct AbsorbedPart {
  float* out;
  int64_t out_ld;
  float* m;
  float* l;
};

// Heads [head_begin, head_end) over context rows [s_begin, s_end) into `part` (head j of
// the range at row j of part.out, m[j], l[j]).
void mla_absorbed_attention_part(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                                 const LatentKvView& kv, int64_t s_begin, int64_t s_end,
                                 float scale, const AbsorbedPart& part,
                                 const AbsorbedNextRows* next = nullptr);

// out[h] = Σ_i e^(m_i[h] - M) out_i[h] / Σ_i e^(m_i[h] - M) l_i[h], M = max_i m_i[h], parts
// taken in the order given: the attention of the whole context from its parts.
void mla_absorbed_merge(std::span<const AbsorbedPart> parts, int64_t nh, int64_t lat, float* out,
                        int64_t out_ld);

// How a context of ctx rows is split into parts: `count` parts of `rows` rows (the last one
// shorter); a function of ctx alone, so that a token's result does not depend on the batch
// or the thread count. Parts of at least kAbsorbedPartMinRows rows (one part below that), at
// most kAbsorbedMaxParts of them: 513 rows go as 257 + 256.
inline constexpr int64_t kAbsorbedPartMinRows = 256;
inline constexpr int64_t kAbsorbedMaxParts = 8;
struct AbsorbedSplit {
  int64_t count;
  int64_t rows;
};
AbsorbedSplit absorbed_context_split(int64_t ctx);

// FLOPs (2 per multiply-add) of the attention products over `pairs` (query token, cached
// row) pairs for `heads` heads:
//   absorbed: scores over the latent and rope columns (C + Dr), p·latent over C;
//   expanded: scores over the nope and rope columns (Dn + Dr), p·v over Dv.
// A chunk of m tokens after p0 cached ones has m · p0 + m (m + 1) / 2 pairs (causal).
struct MlaShape {
  int64_t heads, latent_dim, nope_dim, rope_dim, v_dim;  // H, C, Dn, Dr, Dv
};
inline double mla_absorbed_pair_flops(const MlaShape& s, double pairs) {
  const double lat = static_cast<double>(s.latent_dim), dr = static_cast<double>(s.rope_dim);
  return pairs * static_cast<double>(s.heads) * (2.0 * (lat + dr) + 2.0 * lat);
}
inline double mla_expanded_pair_flops(const MlaShape& s, double pairs) {
  const double dn = static_cast<double>(s.nope_dim), dr = static_cast<double>(s.rope_dim);
  const double dv = static_cast<double>(s.v_dim);
  return pairs * static_cast<double>(s.heads) * (2.0 * (dn + dr) + 2.0 * dv);
}

// FLOPs of attending a chunk of m new tokens after p0 cached ones, per layer, each way with
// its projections through W_UK / W_UV (kv_b_proj's C × H (Dn + Dv)):
//   absorbed: W_UK and W_UV for the m tokens, then the absorbed products;
//   expanded: kv_b_proj over the whole context (p0 + m rows), then the expanded products.
struct MlaChunkFlops {
  double absorbed, expanded;
};
inline MlaChunkFlops mla_chunk_flops(const MlaShape& s, int64_t p0, int64_t m) {
  const double h = static_cast<double>(s.heads), lat = static_cast<double>(s.latent_dim);
  const double dn = static_cast<double>(s.nope_dim), dv = static_cast<double>(s.v_dim);
  const double pairs = static_cast<double>(m) * static_cast<double>(p0) +
                       static_cast<double>(m) * static_cast<double>(m + 1) / 2.0;
  const double absorbed =
      static_cast<double>(m) * h * 2.0 * lat * (dn + dv) + mla_absorbed_pair_flops(s, pairs);
  const double expanded =
      static_cast<double>(p0 + m) * 2.0 * lat * h * (dn + dv) + mla_expanded_pair_flops(s, pairs);
  return {absorbed, expanded};
}

// The expanded form for one prefill chunk: m new tokens at positions p0 .. p0+m-1 attend to
// positions [0, p0+m) causally, with keys and values already expanded per head:
//   q:    q[t, h, 0..Dn+Dr)  at q + t*q_ld + h*(Dn+Dr)       (nope part, then rotated rope part)
//   kv:   kv[s, h, 0..Dn+Dv) at kv + s*kv_ld + h*(Dn+Dv)     (k_nope, then v)
//   rope: rope[s, 0..Dr)     at rope + s*Dr                  (k_pe, shared by all heads)
//   out:  out[t, h, 0..Dv)   at out + t*out_ld + h*Dv
struct ExpandedChunk {
  const float* q;
  int64_t q_ld;
  const float* kv;
  int64_t kv_ld;
  const float* rope;
  float* out;
  int64_t out_ld;
  int64_t m, p0;
  int64_t dn, dr, dv;
};

// Rows of queries per block of the sgemm form (AVX2).
inline constexpr int64_t kExpandedRowBlock = 64;

// Floats of scratch mla_expanded_attention needs for a chunk of m queries whose context
// ends at ctx.
int64_t expanded_scratch_floats(int64_t dn, int64_t dr, int64_t dv, int64_t m, int64_t ctx);

// Head h of the chunk, on the calling thread (mla_expanded.cc). AVX-512: tiles of 16
// queries × 16 keys for the scores and 16 queries × 16 value columns for p·v, every sum in
// ascending order whatever the chunking; AVX2: three single-threaded sgemm products per block
// of kExpandedRowBlock queries. scratch: expanded_scratch_floats(dn, dr, dv, m, p0 + m)
// floats.
void mla_expanded_attention(const ExpandedChunk& c, int64_t h, float scale, float* scratch);

}  // namespace xds::kernels
