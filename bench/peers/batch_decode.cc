// batch_decode: prefill and batched-decode tokens/s of a llama.cpp-family engine (built
// against that tree's llama.h / libllama by bench/peers/run.sh), measured the way
// bench_decode measures ours, with a distinct random token for every sequence at every
// step (llama-batched-bench feeds the same token to all sequences, so they all route to
// the same experts and a batch reads a fraction of the expert bytes it should).
//
//   batch_decode MODEL.gguf [--threads T] [--batches 1,4,16] [--context 512] [--steps 8]
//                [--prompt 512] [--rtr]
//
// prefill: one sequence of `prompt` random tokens in one llama_decode (tokens/s), timed
// after one untimed run.
// decode b: b sequences, each with `context` random tokens of its own in the KV cache, then
// `steps` steps (after one untimed warm-up step) of one random token per sequence in one
// llama_decode; tokens/s = b * steps / time. Tokens are drawn from [256, n_vocab).
// The largest batch's sequences are filled once, in order (contiguous cells); the batches
// run largest first, and before each the sequences beyond it are removed and the others cut
// back to their `context` tokens, so every batch sees b * context cells, as if filled anew.
// The engine runs as ik_llama.cpp's fastest CPU settings for DeepSeek have it (its common/
// defaults and flags -mla 3 -fa -fmoe): MLA 3, flash attention, fused MoE up/gate, graph
// reuse, an f16 KV cache.
// --rtr: the engine's run-time repack of the weights (-rtr: Q8_0 -> Q8_0_R8, Q8_K -> Q8_K_R8;
// the weights are then read into memory, not mmapped).
// Prints one JSON object per row on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llama.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

// Adds one token of sequence `seq` at `pos` to `b`.
void add(llama_batch& b, llama_token t, int pos, int seq, bool logits) {
  b.token[b.n_tokens] = t;
  b.pos[b.n_tokens] = pos;
  b.n_seq_id[b.n_tokens] = 1;
  b.seq_id[b.n_tokens][0] = seq;
  b.logits[b.n_tokens] = logits;
  ++b.n_tokens;
}

void check(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "error: llama_decode (%s) returned %d\n", what, rc);
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [--threads T] [--batches 1,4,16] [--context N]"
                 " [--steps N] [--prompt N] [--rtr]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  int threads = 2, context = 512, steps = 8, prompt = 512;
  bool rtr = false;
  std::vector<int> batches = {1, 4, 16};
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--threads") threads = std::atoi(v), ++i;
    else if (a == "--batches") batches = parse_list(v), ++i;
    else if (a == "--context") context = std::atoi(v), ++i;
    else if (a == "--steps") steps = std::atoi(v), ++i;
    else if (a == "--prompt") prompt = std::atoi(v), ++i;
    else if (a == "--rtr") rtr = true;
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  int max_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.repack_tensors = rtr;
  if (rtr) mp.use_mmap = false;  // repacking rewrites the weights in memory
  mp.mla = 3;                    // as common/ passes -mla to the model (wk_b / wv_b from wkv_b)
  mp.flash_attn = true;
  mp.n_seq_max = max_batch + 1;
  mp.n_ubatch = std::max(prompt, max_batch);
  llama_model* model = llama_model_load_from_file(path, mp);
  if (model == nullptr) { std::fprintf(stderr, "error: cannot load %s\n", path); return 1; }
  const int vocab = llama_n_vocab(model);

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(max_batch * (context + steps + 2) + prompt + 16);
  cp.n_batch = static_cast<uint32_t>(std::max(prompt, max_batch));
  cp.n_ubatch = cp.n_batch;
  cp.n_seq_max = static_cast<uint32_t>(max_batch + 1);
  cp.n_threads = cp.n_threads_batch = static_cast<uint32_t>(threads);
  cp.flash_attn = true;         // -fa
  cp.mla_attn = 3;              // -mla 3
  cp.fused_moe_up_gate = true;  // -fmoe
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) { std::fprintf(stderr, "error: cannot create a context\n"); return 1; }

  std::mt19937 rng(1);
  std::uniform_int_distribution<int> tok(256, vocab - 1);
  llama_batch b = llama_batch_init(static_cast<int32_t>(cp.n_batch), 0, 1);
  const char* rtr_s = rtr ? "true" : "false";

  {  // prefill: sequence max_batch (kept apart from the decode sequences), untimed once first
    for (int rep = 0; rep < 2; ++rep) {
      llama_kv_cache_seq_rm(ctx, max_batch, -1, -1);
      b.n_tokens = 0;
      for (int p = 0; p < prompt; ++p) add(b, tok(rng), p, max_batch, p == prompt - 1);
      const double t0 = now_s();
      check(llama_decode(ctx, b), "prefill");
      llama_synchronize(ctx);
      const double t = now_s() - t0;
      if (rep == 1) {
        std::printf("{\"row\": \"prefill\", \"tokens\": %d, \"tokens_per_s\": %.2f, "
                    "\"threads\": %d, \"rtr\": %s}\n", prompt, prompt / t, threads, rtr_s);
      }
    }
    llama_kv_cache_seq_rm(ctx, max_batch, -1, -1);
  }
  for (int s = 0; s < max_batch; ++s) {  // each sequence's own context, filled once
    for (int p0 = 0; p0 < context; p0 += static_cast<int>(cp.n_batch)) {
      b.n_tokens = 0;
      const int p1 = std::min(context, p0 + static_cast<int>(cp.n_batch));
      for (int p = p0; p < p1; ++p) add(b, tok(rng), p, s, p == context - 1);
      check(llama_decode(ctx, b), "context");
    }
  }
  std::vector<int> order = batches;
  std::sort(order.rbegin(), order.rend());
  for (int nb : order) {
    for (int s = 0; s < max_batch; ++s) {
      llama_kv_cache_seq_rm(ctx, s, s < nb ? context : 0, -1);
    }
    double t0 = 0;
    for (int step = 0; step <= steps; ++step) {  // step 0: warm-up, untimed
      if (step == 1) { llama_synchronize(ctx); t0 = now_s(); }
      b.n_tokens = 0;
      for (int s = 0; s < nb; ++s) add(b, tok(rng), context + step, s, true);
      check(llama_decode(ctx, b), "decode");
    }
    llama_synchronize(ctx);
    const double t = now_s() - t0;
    std::printf("{\"row\": \"decode\", \"batch\": %d, \"context\": %d, \"steps\": %d, "
                "\"tokens_per_s\": %.2f, \"step_ms\": %.2f, \"threads\": %d, \"rtr\": %s}\n",
                nb, context, steps, nb * steps / t, t * 1e3 / steps, threads, rtr_s);
    std::fflush(stdout);
  }
  llama_batch_free(b);
  llama_free(ctx);
  llama_free_model(model);
  llama_backend_free();
  return 0;
}
