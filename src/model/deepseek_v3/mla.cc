// MLA attention for one layer of a step (see deepseek_v3.h and
// docs/design/deepseek_v3_forward.md). Shapes: n tokens, H heads, Dn/Dr/Dv head dims,
// C = kv_lora_rank, Q = q_lora_rank, S = context length of a chunk's sequence.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <utility>

#include "base/grow.h"
#include "kernels/cpu/int8_matrix.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "model/deepseek_v3/deepseek_v3_batch.h"
#include "model/linear_runner.h"

namespace xds {
namespace {

// Tokens a thread from which absorbed attention runs whole tokens as units (see the core
// below); fewer, and the parts of a token are shared out.
constexpr int64_t kWholeTokensPerThread = 4;


// FLOPs of the two ways to attend a chunk of m new tokens after p0 cached ones.
bool absorbed_is_cheaper(const DeepseekV3Config& c, int64_t p0, int64_t m) {
  const double h = static_cast<double>(c.num_attention_heads);
  const double lat = static_cast<double>(c.kv_lora_rank);
  const double dn = static_cast<double>(c.qk_nope_head_dim),
               dr = static_cast<double>(c.qk_rope_head_dim);
  const double dv = static_cast<double>(c.v_head_dim);
  const double pairs = static_cast<double>(m) * static_cast<double>(p0) +
                       static_cast<double>(m) * static_cast<double>(m + 1) / 2.0;
  const double absorbed =
      m * h * 2.0 * lat * (dn + dv) + pairs * h * (2.0 * (lat + dr) + 2.0 * lat);
  const double expanded = static_cast<double>(p0 + m) * 2.0 * lat * h * (dn + dv) +
                          pairs * h * (2.0 * (dn + dr) + 2.0 * dv);
  return absorbed <= expanded;
}

// y = x · Wᵀ for one head's slice of the absorbed attention (x: [n, w.cols], row stride
// ldx), on the calling thread, in the compute dtype: with bf16 products x is rounded first,
// as every linear's input, and BF16 panels take the dot-product kernel.
// Int8 panels (a W8A8 kv_b_proj) take the fp32 rows in both modes, quantized per token as
// every int8 linear's input (linear_runner.h).
void head_linear(const float* x, int64_t n, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                 bool bf16, ThreadPool& inline_pool) {
  if (!bf16 || kernels::is_int8_matrix(w)) {
    kernels::linear_f32(x, n, ldx, w, y, ldy, inline_pool, kernels::kNnSgemmMinTokens);
    return;
  }
  thread_local std::vector<uint16_t> xb;  // [n, w.cols]
  xb.resize(static_cast<size_t>(n * w.cols));
  for (int64_t t = 0; t < n; ++t)
    kernels::round_to_bf16(x + t * ldx, w.cols, xb.data() + t * w.cols);
  kernels::linear_bf16(xb.data(), n, w.cols, w, y, ldy, inline_pool);
}

// Context rows [0, ctx) of both planes as contiguous fp32: latent [ctx, C], rope [ctx, Dr]
// (bf16 planes widened, exactly; an INT8 latent dequantized).
void gather_planes(const kernels::LatentKvView& kv, int64_t ctx, float* latent, float* rope) {
  const int64_t lat = kv.latent_dim, dr = kv.rope_dim;
  if (kv.int8()) return kernels::dequantize_int8_kv_rows(kv, 0, ctx, latent, lat, rope);
  for (int64_t s = 0; s < ctx; ++s) {
    if (!kv.bf16()) {
      std::memcpy(latent + s * lat, kv.latent_at(s), sizeof(float) * static_cast<size_t>(lat));
      std::memcpy(rope + s * dr, kv.rope_at(s), sizeof(float) * static_cast<size_t>(dr));
      continue;
    }
    const uint16_t* l16 = kv.latent16_at(s);
    const uint16_t* r16 = kv.rope16_at(s);
    for (int64_t c = 0; c < lat; ++c) latent[s * lat + c] = bf16_to_f32(l16[c]);
    for (int64_t c = 0; c < dr; ++c) rope[s * dr + c] = bf16_to_f32(r16[c]);
  }
}

}  // namespace

void DeepseekV3Model::run_attention(const MlaWeights& w, int64_t cache_layer, const Batch& b,
                                    KvStorage& kv_store, const float* xn, float* out) {
  const DeepseekV3Config& c = config_;
  const int64_t n = b.n, d = c.hidden_size, heads = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t dq = dn + dr, lat = c.kv_lora_rank;
  const float scale = static_cast<float>(rope_->softmax_scale());
  ThreadPool& pool = *pool_;
  std::optional<ScopedPhase> phase(std::in_place, phases_, "attn.qkv_proj");

  // q: [n, H, Dn+Dr]
  float* q = grow(s_q_, n * heads * dq);
  // kva: [n, C+Dr] -> cache: latent = RMSNorm(kva[:C]), rope = rotate(kva[C:])
  float* kva = grow(s_kva_, n * (lat + dr));
  if (w.q_a_proj) {
    const int64_t ql = w.q_a_proj->rows;
    float* qa = grow(s_qa_, n * ql);
    // q_a and kv_a read the same xn: one parallel region
    const kernels::LinearOutput a_projs[] = {{&*w.q_a_proj, qa, ql}, {&w.kv_a_proj, kva, lat + dr}};
    linear_->group(xn, n, d, a_projs);
    pool.parallel_for(n, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t)
        kernels::rmsnorm(qa + t * ql, w.q_a_norm.data(), ql, c.rms_norm_eps, qa + t * ql);
    });
    linear(qa, n, ql, *w.q_b_proj, q, heads * dq);
  } else {
    const kernels::LinearOutput projs[] = {{&*w.q_proj, q, heads * dq},
                                           {&w.kv_a_proj, kva, lat + dr}};
    linear_->group(xn, n, d, projs);
  }
  pool.parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = rope_->cos_sin(b.pos[t]);
      float* row = kva + t * (lat + dr);
      kernels::rmsnorm(row, w.kv_a_norm.data(), lat, c.rms_norm_eps, row);
      kernels::rope_interleaved(row + lat, dr, cs);
      for (int64_t h = 0; h < heads; ++h)
        kernels::rope_interleaved(q + (t * heads + h) * dq + dn, dr, cs);
    }
  });
  const int64_t block_size = kv_store.block_size();
  for (const Batch::Chunk& ch : b.chunks) {
    for (int64_t i = 0; i < ch.count; ++i) {
      const float* row = kva + (ch.begin + i) * (lat + dr);
      const int64_t pos = ch.start_pos + i;
      kv_store.write(cache_layer, ch.blocks[pos / block_size], pos % block_size, row, row + lat);
    }
  }

  // attn: [n, H, Dv]
  float* attn = grow(s_attn_, n * heads * dv);
  const int threads = pool.num_threads();

  // Absorbed chunks, merged into runs of consecutive tokens so that W_UK and W_UV are read
  // once per run (decode tokens of many sequences form one run).
  auto& runs = s_runs_;                 // [begin, end) in batch order
  auto& absorbed_tokens = s_absorbed_;  // batch indices
  auto& token_chunk = s_token_chunk_;   // chunk of each absorbed token, -1 otherwise
  runs.clear();
  absorbed_tokens.clear();
  token_chunk.assign(static_cast<size_t>(n), -1);
  for (size_t ci = 0; ci < b.chunks.size(); ++ci) {
    const Batch::Chunk& ch = b.chunks[ci];
    const bool absorbed = options_.attention == AttentionMode::kAbsorbed ||
                          (options_.attention == AttentionMode::kAuto &&
                           absorbed_is_cheaper(c, ch.start_pos, ch.count));
    if (!absorbed) continue;
    if (!runs.empty() && runs.back().second == ch.begin) {
      runs.back().second += ch.count;
    } else {
      runs.emplace_back(ch.begin, ch.begin + ch.count);
    }
    for (int64_t i = 0; i < ch.count; ++i) {
      absorbed_tokens.push_back(ch.begin + i);
      token_chunk[ch.begin + i] = static_cast<int32_t>(ci);
    }
  }
  if (!runs.empty()) {
    const bool bf16 = options_.compute == ComputeDType::kBF16;
    // q_abs[t, h] = W_UK[h]ᵀ q_nope[t, h]: [n, H, C]; lat_out: [n, H, C]
    float* q_abs = grow(s_qabs_, n * heads * lat);
    float* lat_out = grow(s_lat_, n * heads * lat);
    phase.emplace(phases_, "attn.w_uk");
    for (auto [r0, r1] : runs) {
      if (w.uk_t.empty()) {  // matmul_nn_accumulate adds into q_abs; the panels overwrite it
        std::memset(q_abs + r0 * heads * lat, 0,
                    sizeof(float) * static_cast<size_t>((r1 - r0) * heads * lat));
      }
      pool.parallel_for(heads, [&](int64_t h0, int64_t h1, int) {
        for (int64_t h = h0; h < h1; ++h) {
          if (!w.uk_scale.empty()) {  // int8 W_UK[h]ᵀ: its row scales folded into q_nope
            thread_local std::vector<float> scaled;  // [r1 - r0, Dn]
            float* qs = grow(scaled, (r1 - r0) * dn);
            const float* s = w.uk_scale.data() + h * dn;
            for (int64_t t = r0; t < r1; ++t) {
              const float* qn = q + (t * heads + h) * dq;
              for (int64_t i = 0; i < dn; ++i) qs[(t - r0) * dn + i] = qn[i] * s[i];
            }
            head_linear(qs, r1 - r0, dn, w.uk_t[h], q_abs + (r0 * heads + h) * lat, heads * lat,
                        bf16, inline_pool_);
            continue;
          }
          if (!w.uk_t.empty()) {  // W_UK[h]ᵀ as panels: the panel kernels, no widening
            head_linear(q + (r0 * heads + h) * dq, r1 - r0, heads * dq, w.uk_t[h],
                        q_abs + (r0 * heads + h) * lat, heads * lat, bf16, inline_pool_);
            continue;
          }
          const MatrixRef w_uk = w.kv_b_proj.row_slice(h * (dn + dv), dn);
          kernels::matmul_nn_accumulate(q + (r0 * heads + h) * dq, r1 - r0, heads * dq, w_uk,
                                        q_abs + (r0 * heads + h) * lat, heads * lat);
        }
      });
    }
    phase.emplace(phases_, "attn.absorbed_core");
    // One item = one token × one part of its context (absorbed_context_split: a function of
    // the context length alone, so results do not depend on the batch or the thread count).
    // Threads claim units of work from a shared counter, longest first. With at least
    // kWholeTokensPerThread tokens a thread, a unit is a whole token: its thread runs the
    // parts one after another into its own scratch (which stays in its L2) and merges them
    // straight into lat_out. With fewer, a unit is one part, so that the threads share a
    // token's parts; the parts' unnormalised sums then go through part_out (every line a
    // cold write and a read back) and are merged
    // after all units. Either way the same parts are merged in the same order: same bits.
    using Item = AbsorbedItem;
    using Unit = AbsorbedUnit;
    std::vector<Item>& items = s_items_;
    std::vector<Unit>& units = s_units_;
    std::vector<AbsorbedMerge>& merges = s_merges_;  // part units' tokens of several parts
    items.clear();
    units.clear();
    merges.clear();
    const bool whole_tokens =
        static_cast<int64_t>(absorbed_tokens.size()) >= kWholeTokensPerThread * threads;
    int64_t slots = 0, most_parts = 1;
    for (const int64_t t : absorbed_tokens) {
      const int64_t ctx = b.pos[t] + 1;
      const kernels::AbsorbedSplit split = kernels::absorbed_context_split(ctx);
      const bool via_part_out = !whole_tokens && split.count > 1;
      if (via_part_out) merges.push_back({t, slots, split.count});
      if (whole_tokens) units.push_back({static_cast<int64_t>(items.size()), split.count});
      most_parts = std::max(most_parts, split.count);
      for (int64_t p = 0; p < split.count; ++p) {  // in context order
        const int64_t begin = p * split.rows, end = std::min(ctx, begin + split.rows);
        if (!whole_tokens) units.push_back({static_cast<int64_t>(items.size()), 1});
        items.push_back({t, begin, end, via_part_out ? slots++ : -1});
      }
    }
    // Longest first: a unit's context rows run from its first item's begin to its last's end.
    auto rows_of = [&](const Unit& u) {
      return items[u.first + u.count - 1].end - items[u.first].begin;
    };
    std::stable_sort(units.begin(), units.end(),
                     [&](const Unit& x, const Unit& y) { return rows_of(x) > rows_of(y); });
    float* part_out = grow(s_part_out_, slots * heads * lat);  // [slots, H, C]
    float* part_ml = grow(s_part_ml_, slots * 2 * heads);      // [slots, 2, H]: m, l
    std::atomic<int64_t> next{0};
    // Each thread claims its next unit before it runs the current one, so that the kernel
    // prefetches the next item's first rows during the current one's last slice.
    auto view_of = [&](const Item& it) {
      return kv_store.view(cache_layer, b.chunks[token_chunk[it.token]].blocks);
    };
    // Part i of a set of partial sums: [parts, H, C] sums at `sums`, [parts, 2, H] m, l at `ml`.
    auto part_at = [&](float* sums, float* ml, int64_t i) {
      return kernels::AbsorbedPart{sums + i * heads * lat, lat, ml + i * 2 * heads,
                                   ml + i * 2 * heads + heads};
    };
    const int64_t count = static_cast<int64_t>(units.size());
    pool.run_on_available([&](int) {
      // A whole token's parts: [parts, H, C] sums, then [parts, 2, H] m and l.
      thread_local std::vector<float> scratch;
      float* scratch_out = grow(scratch, most_parts * heads * (lat + 2));
      float* scratch_ml = scratch_out + most_parts * heads * lat;
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count;) {
        // The next unit is claimed ahead only while at least one per thread is left after it:
        // with fewer, a thread that has not started yet must still find one. (Claimed always,
        // one token's two parts both went to the first thread: the attention ran alone on it,
        // and the other, idle past its spin, slept until the W_UV phase woke it.)
        const bool ahead = count - next.load(std::memory_order_relaxed) >= threads;
        const int64_t following = ahead ? next.fetch_add(1, std::memory_order_relaxed) : count;
        const Unit& u = units[i];
        const int64_t token = items[u.first].token;
        const kernels::AbsorbedQuery aq{q_abs + token * heads * lat,
                                        lat,
                                        q + token * heads * dq + dn,
                                        dq,
                                        lat_out + token * heads * lat,
                                        lat,
                                        bf16};
        const kernels::LatentKvView kv = view_of(items[u.first]);
        kernels::AbsorbedPart parts[kernels::kAbsorbedMaxParts];
        for (int64_t p = 0; p < u.count; ++p) {
          const Item& it = items[u.first + p];
          // The rows this thread reads next: the token's next part, else the next unit's.
          const Item* after = p + 1 < u.count     ? &it + 1
                              : following < count ? &items[units[following].first]
                                                  : nullptr;
          kernels::AbsorbedNextRows then;
          if (after != nullptr) then = {view_of(*after), after->begin, after->end};
          const kernels::AbsorbedNextRows* hint = after != nullptr ? &then : nullptr;
          if (u.count > 1) {
            parts[p] = part_at(scratch_out, scratch_ml, p);
          } else if (it.slot >= 0) {
            parts[p] = part_at(part_out, part_ml, it.slot);
          } else {
            kernels::mla_absorbed_attention(aq, 0, heads, kv, it.end, scale, hint);
            continue;
          }
          kernels::mla_absorbed_attention_part(aq, 0, heads, kv, it.begin, it.end, scale, parts[p],
                                               hint);
        }
        if (u.count > 1) {
          kernels::mla_absorbed_merge({parts, static_cast<size_t>(u.count)}, heads, lat,
                                      lat_out + token * heads * lat, lat);
        }
        i = ahead ? following : next.fetch_add(1, std::memory_order_relaxed);
      }
    });
    if (!merges.empty()) {
      pool.parallel_for(static_cast<int64_t>(merges.size()), [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) {
          const auto [t, first, count] = merges[i];
          kernels::AbsorbedPart parts[kernels::kAbsorbedMaxParts];
          for (int64_t p = 0; p < count; ++p) parts[p] = part_at(part_out, part_ml, first + p);
          kernels::mla_absorbed_merge({parts, static_cast<size_t>(count)}, heads, lat,
                                      lat_out + t * heads * lat, lat);
        }
      });
    }
    phase.emplace(phases_, "attn.w_uv");
    for (auto [r0, r1] : runs) {
      pool.parallel_for(heads, [&](int64_t h0, int64_t h1, int) {
        for (int64_t h = h0; h < h1; ++h) {
          const MatrixRef w_uv =
              w.uv.empty() ? w.kv_b_proj.row_slice(h * (dn + dv) + dn, dv) : w.uv[h];
          head_linear(lat_out + (r0 * heads + h) * lat, r1 - r0, heads * lat, w_uv,
                      attn + (r0 * heads + h) * dv, heads * dv, bf16, inline_pool_);
        }
      });
    }
  }

  for (size_t ci = 0; ci < b.chunks.size(); ++ci) {
    const Batch::Chunk& ch = b.chunks[ci];
    if (ch.count > 0 && token_chunk[ch.begin] >= 0) continue;  // done above
    // Expanded: kv_full[s] = kv_b_proj(latent(s)): [S, H, Dn+Dv] over the whole context, a
    // linear in the compute dtype (bf16: the latent rounded, as every linear's input).
    phase.emplace(phases_, "attn.kv_b_expand");
    const int64_t ctx_end = ch.start_pos + ch.count;
    const kernels::LatentKvView kv = kv_store.view(cache_layer, ch.blocks);
    float* gathered = grow(s_gather_, ctx_end * lat);
    float* rope = grow(s_rope_, ctx_end * dr);  // the rope plane, contiguous for sgemm
    gather_planes(kv, ctx_end, gathered, rope);
    float* kv_full = grow(s_kvfull_, ctx_end * heads * (dn + dv));
    linear(gathered, ctx_end, lat, w.kv_b_proj, kv_full, heads * (dn + dv));
    phase.emplace(phases_, "attn.expanded");
    const kernels::ExpandedChunk ec{q + ch.begin * heads * dq,
                                    heads * dq,
                                    kv_full,
                                    heads * (dn + dv),
                                    rope,
                                    attn + ch.begin * heads * dv,
                                    heads * dv,
                                    ch.count,
                                    ch.start_pos,
                                    dn,
                                    dr,
                                    dv};
    const int64_t per_thread = kernels::expanded_scratch_floats(dn, dr, dv, ch.count, ctx_end);
    float* scores_all = grow(s_scores_, threads * per_thread);
    pool.parallel_for(heads, [&](int64_t h0, int64_t h1, int thread) {
      for (int64_t h = h0; h < h1; ++h)
        kernels::mla_expanded_attention(ec, h, scale, scores_all + thread * per_thread);
    });
  }
  phase.emplace(phases_, "attn.o_proj");
  linear(attn, n, heads * dv, w.o_proj, out, d);
}

}  // namespace xds
