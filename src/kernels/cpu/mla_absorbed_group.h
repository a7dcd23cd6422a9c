// Internal to the absorbed attention kernels: one group of at most 16 heads over a range of
// context rows, the unit both products work in. The fp32 products and the entry points live
// in mla_attention.cc, the bf16 products in mla_attention_bf16.cc; the pieces they share
// (the transposed queries, the online softmax step) are declared here.
#pragma once

#include <cstdint>

#include "kernels/cpu/mla_attention.h"

namespace xds::kernels::absorbed_detail {

// Heads [h0, h0 + nh) (nh <= 16) of one query over context rows [s_begin, s_end), on the
// calling thread. Leaves out unnormalised: out[j] = Σ_s e^(score[h0 + j, s] - m[j]) latent(s)
// at out + j · out_ld, l[j] = Σ_s e^(score - m[j]). Refers to the caller's buffers; holds no
// state of its own.
struct AbsorbedGroup {
  const AbsorbedQuery& q;
  int64_t h0, nh;
  const LatentKvView& kv;
  int64_t s_begin, s_end;
  float scale;
  float* qt;   // scratch: [C + Dr, 16] transposed queries
  float* out;  // [nh, C], row stride out_ld
  int64_t out_ld;
  float* m;                      // [nh] running max score
  float* l;                      // [nh] running Σ e^(score - m)
  const AbsorbedNextRows* next;  // the thread's next rows (a prefetch hint), or null
};

// qt[c][j] = the absorbed query of head h0 + j at column c (latent, then rope), zero for
// j >= nh: [C + Dr, kw].
void transpose_queries(const AbsorbedQuery& q, int64_t h0, int64_t nh, int64_t lat, int64_t dr,
                       int64_t kw, float* qt);

// The slice's softmax step on the group's scores sc [len][kw] (head j in lane j): sc =
// e^(scale · sc - m_new[j]) with m_new the running max per head, l[j] = l[j] · e^(m[j] -
// m_new[j]) + Σ_s sc[s][j] (ascending s), out rows rescaled by e^(m[j] - m_new[j]) when the
// max grew (`first`: m, l start from this slice).
void slice_softmax(const AbsorbedGroup& g, float* sc, int64_t len, int64_t kw, bool first);

// The group with the bf16 products (AbsorbedQuery::bf16; needs absorbed_bf16_available()),
// over the view's fp32 or bf16 planes or its INT8 latent (read directly, slice by slice).
void attend_group_bf16(const AbsorbedGroup& g);

// mla_absorbed_attention_part over an INT8 view with the fp32 products (dequantized chunks,
// mla_attention_int8.cc).
void attend_int8_part(const AbsorbedQuery& q, int64_t head_begin, int64_t head_end,
                      const LatentKvView& kv, int64_t s_begin, int64_t s_end, float scale,
                      const AbsorbedPart& part);

}  // namespace xds::kernels::absorbed_detail
