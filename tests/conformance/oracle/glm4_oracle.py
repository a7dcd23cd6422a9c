#!/usr/bin/python3
"""Float64 reference forward pass of GLM-4.5 checkpoints (the conformance oracle).

Written from Hugging Face transformers' modeling_glm4_moe.py, plainly, in float64 with
numpy: full recompute (no KV cache). Attention: q, k, v projections with biases when
attention_bias, an RMSNorm over each head of q and k when use_qk_norm, RoPE on the first
rotary_dim = int(head_dim * partial_rotary_factor) dims of each head in the rotate-half
convention (cos/sin = cat(freqs, freqs) over rotary_dim; the other dims pass through),
causal softmax at head_dim^-0.5, query head i reading KV head i // (H / KV), o_proj without
bias. MLP: a dense SwiGLU in layers < first_k_dense_replace; after, Glm4MoeMoE: sigmoid
scores, selection on scores + e_score_correction_bias within the topk_group best of n_group
groups (a group scores the sum of its best two; the other groups' experts are filled with
0.0 as transformers' masked_fill does), weights = the unbiased scores of the chosen experts,
divided by their sum + 1e-20 when norm_topk_prob (top-1 included), × routed_scaling_factor,
plus the shared experts (one MLP of width n_shared_experts * moe_intermediate_size).

The MTP layer (transformers drops it; vLLM's glm4_moe_mtp.py): row t (t < T-1) from the
main model's final-normed hidden at t and token t+1: e = embed(token t+1), zeroed at position
0; x = eh_proj(cat(enorm(e), hnorm(h_t))); x = decoder layer L at position t (causal over the
MTP rows); logits = shared_head.head(shared_head.norm(x)) (lm_head if no shared_head.head).

Shares the checkpoint reader and the elementwise pieces with ds3_oracle; nothing with the
engine. Shapes: T tokens, H query heads, KV heads, Dh head_dim, D hidden, E routed experts.

CLI:
  glm4_oracle.py --model DIR --ids 1,2,3 [--out PREFIX]
prints the logits (and MTP logits) as JSON on stdout, or writes PREFIX.logits.f64 [T, vocab],
PREFIX.mtp.f64 [T-1, vocab] and PREFIX.gap.f64 [1] (the smallest routing margin; little-endian
float64).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds3_oracle import Checkpoint, order_desc, rms_norm, sigmoid, silu, softmax  # noqa: E402


class Config:
    """The config.json fields the forward pass uses (Glm4MoeConfig names and defaults)."""

    REQUIRED = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "moe_intermediate_size",
                "n_routed_experts", "num_experts_per_tok"]

    def __init__(self, raw):
        for key in self.REQUIRED:
            if key not in raw:
                raise ValueError(f"config.json: missing {key}")
        g = raw.get
        self.vocab_size = int(raw["vocab_size"])
        self.hidden_size = int(raw["hidden_size"])
        self.num_hidden_layers = int(raw["num_hidden_layers"])
        self.num_attention_heads = int(raw["num_attention_heads"])
        self.num_key_value_heads = int(raw["num_key_value_heads"])
        self.head_dim = int(g("head_dim") or self.hidden_size // self.num_attention_heads)
        self.partial_rotary_factor = float(g("partial_rotary_factor", 0.5))
        self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        self.n_routed_experts = int(raw["n_routed_experts"])
        self.num_experts_per_tok = int(raw["num_experts_per_tok"])
        self.n_shared_experts = int(g("n_shared_experts", 1))
        self.first_k_dense_replace = int(g("first_k_dense_replace", 1))
        self.n_group = int(g("n_group", 1))
        self.topk_group = int(g("topk_group", 1))
        self.norm_topk_prob = bool(g("norm_topk_prob", True))
        self.routed_scaling_factor = float(g("routed_scaling_factor", 1.0))
        self.rms_norm_eps = float(g("rms_norm_eps", 1e-5))
        self.rope_theta = float(g("rope_theta", 10000.0))
        if g("rope_scaling"):
            raise ValueError("rope_scaling is not supported by this oracle")
        self.attention_bias = bool(g("attention_bias", False))
        self.use_qk_norm = bool(g("use_qk_norm", False))
        self.tie_word_embeddings = bool(g("tie_word_embeddings", False))
        self.num_nextn_predict_layers = int(g("num_nextn_predict_layers", 0))

    def is_moe_layer(self, layer):
        return layer >= self.first_k_dense_replace


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def route(scores, bias, cfg):
    """scores [E] sigmoid of the router logits, bias [E].
    -> (chosen [k] ascending, weights aligned, expert_gap, group_gap): the margins of the two
    discrete decisions (k-th minus (k+1)-th masked choice score; topk_group-th minus the next
    group score), inf where nothing competes."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    choice = scores + bias
    per = e // cfg.n_group
    groups = np.array([np.sort(choice[g * per:(g + 1) * per])[::-1][:2].sum()
                       for g in range(cfg.n_group)])
    gorder = order_desc(groups)
    kept = gorder[:cfg.topk_group]
    group_gap = math.inf
    if cfg.topk_group < cfg.n_group:
        group_gap = groups[gorder[cfg.topk_group - 1]] - groups[gorder[cfg.topk_group]]
    mask = np.zeros(e, dtype=bool)
    for g in kept:
        mask[g * per:(g + 1) * per] = True
    masked = np.where(mask, choice, 0.0)
    order = order_desc(masked)
    chosen = order[:k]
    expert_gap = masked[order[k - 1]] - masked[order[k]] if k < e else math.inf
    weights = scores[chosen]
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum() + 1e-20)
    weights = weights * cfg.routed_scaling_factor
    sort = np.argsort(chosen)
    return chosen[sort], weights[sort], float(expert_gap), float(group_gap)


class Oracle:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = Config(json.load(f))
        self.ckpt = Checkpoint(model_dir)
        rd = self.cfg.rotary_dim
        self.inv_freq = 1.0 / self.cfg.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
        self._cache = {}

    def w(self, name):
        if name not in self._cache:
            self._cache[name] = self.ckpt.get(name)
        return self._cache[name]

    def has(self, name):
        return self.ckpt.has(name)

    def linear(self, x, name, bias=None):
        y = x @ self.w(name).T
        return y + self.w(bias) if bias is not None else y

    def mlp(self, x, prefix):
        return self.linear(silu(self.linear(x, prefix + "gate_proj.weight"))
                           * self.linear(x, prefix + "up_proj.weight"), prefix + "down_proj.weight")

    def rope(self, x, positions):
        """x [T, heads, Dh] -> the first rotary_dim dims rotated, the rest as they are."""
        rd = self.cfg.rotary_dim
        freqs = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]  # [T, rd/2]
        emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]              # [T, 1, rd]
        rot, rest = x[..., :rd], x[..., rd:]
        rot = rot * np.cos(emb) + rotate_half(rot) * np.sin(emb)
        return np.concatenate([rot, rest], axis=-1)

    def attention(self, x, positions, prefix):
        cfg = self.cfg
        t, h, kvh, dh = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        b = (lambda n: prefix + n + ".bias") if cfg.attention_bias else (lambda n: None)
        q = self.linear(x, prefix + "q_proj.weight", b("q_proj")).reshape(t, h, dh)
        k = self.linear(x, prefix + "k_proj.weight", b("k_proj")).reshape(t, kvh, dh)
        v = self.linear(x, prefix + "v_proj.weight", b("v_proj")).reshape(t, kvh, dh)
        if cfg.use_qk_norm:
            q = rms_norm(q, self.w(prefix + "q_norm.weight"), eps)
            k = rms_norm(k, self.w(prefix + "k_norm.weight"), eps)
        q, k = self.rope(q, positions), self.rope(k, positions)
        out = np.zeros((t, h, dh))
        causal = np.tril(np.ones((t, t), dtype=bool))
        for head in range(h):
            kv = head // (h // kvh)
            scores = (q[:, head, :] @ k[:, kv, :].T) * dh ** -0.5      # [T, T]
            scores = np.where(causal, scores, -np.inf)
            out[:, head, :] = softmax(scores, axis=-1) @ v[:, kv, :]
        return self.linear(out.reshape(t, h * dh), prefix + "o_proj.weight")

    def moe(self, x, prefix):
        """x [T, D] -> (out [T, D], routing per token (sorted experts, expert gap, group gap))."""
        cfg = self.cfg
        scores = sigmoid(self.linear(x, prefix + "gate.weight"))  # [T, E]
        bias = self.w(prefix + "gate.e_score_correction_bias")
        out = np.zeros_like(x)
        routing = []
        for t in range(x.shape[0]):
            chosen, weights, egap, ggap = route(scores[t], bias, cfg)
            for e, wgt in zip(chosen, weights):
                out[t] += wgt * self.mlp(x[t], f"{prefix}experts.{e}.")
            routing.append((sorted(int(e) for e in chosen), egap, ggap))
        if cfg.n_shared_experts > 0:
            out = out + self.mlp(x, prefix + "shared_experts.")
        return out, routing

    def decoder_layer(self, x, positions, layer):
        eps = self.cfg.rms_norm_eps
        p = f"model.layers.{layer}."
        x = x + self.attention(rms_norm(x, self.w(p + "input_layernorm.weight"), eps),
                               positions, p + "self_attn.")
        normed = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), eps)
        routing = None
        if self.cfg.is_moe_layer(layer):
            mlp_out, routing = self.moe(normed, p + "mlp.")
        else:
            mlp_out = self.mlp(normed, p + "mlp.")
        return x + mlp_out, routing

    def lm_head(self, x):
        tied = self.cfg.tie_word_embeddings
        return self.linear(x, "model.embed_tokens.weight" if tied else "lm_head.weight")

    def forward(self, ids):
        cfg = self.cfg
        positions = np.arange(len(ids))
        x = self.w("model.embed_tokens.weight")[np.asarray(ids, dtype=np.int64)]
        routing = {}
        for layer in range(cfg.num_hidden_layers):
            x, r = self.decoder_layer(x, positions, layer)
            if r is not None:
                routing[layer] = r
        final = rms_norm(x, self.w("model.norm.weight"), cfg.rms_norm_eps)
        return {"logits": self.lm_head(final), "final_normed": final, "routing": routing}

    def mtp(self, ids, final_normed):
        """Rows t in 0..T-2 -> (logits [T-1, vocab], routing of MTP layer L)."""
        cfg = self.cfg
        L = cfg.num_hidden_layers
        pre = f"model.layers.{L}."
        eps = cfg.rms_norm_eps
        table = pre + "embed_tokens.weight"
        if not self.has(table):
            table = "model.embed_tokens.weight"
        e = self.w(table)[np.asarray(ids[1:], dtype=np.int64)].copy()   # [T-1, D]
        e[0] = 0.0  # row 0 is at position 0
        e = rms_norm(e, self.w(pre + "enorm.weight"), eps)
        g = rms_norm(final_normed[:-1], self.w(pre + "hnorm.weight"), eps)
        x = self.linear(np.concatenate([e, g], axis=1), pre + "eh_proj.weight")
        x, routing = self.decoder_layer(x, np.arange(len(ids) - 1), L)
        x = rms_norm(x, self.w(pre + "shared_head.norm.weight"), eps)
        head = pre + "shared_head.head.weight"
        logits = self.linear(x, head) if self.has(head) else self.lm_head(x)
        return logits, routing

    def run(self, ids, with_mtp=True):
        out = self.forward(ids)
        result = {"logits": out["logits"], "routing": out["routing"], "mtp_logits": None,
                  "mtp_routing": None}
        if with_mtp and self.cfg.num_nextn_predict_layers > 0 and len(ids) >= 2:
            result["mtp_logits"], result["mtp_routing"] = self.mtp(ids, out["final_normed"])
        return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="output prefix; without it, JSON on stdout")
    args = ap.parse_args(argv)
    ids = [int(s) for s in args.ids.replace(" ", "").split(",") if s]
    result = Oracle(args.model).run(ids)
    if args.out:
        result["logits"].astype("<f8").tofile(args.out + ".logits.f64")
        if result["mtp_logits"] is not None:
            result["mtp_logits"].astype("<f8").tofile(args.out + ".mtp.f64")
        # The smallest routing margin of every MoE row, main and MTP layers: a caller compares
        # routed outputs only where it is safe.
        gaps = [min(r[1], r[2]) for per_token in result["routing"].values() for r in per_token]
        gaps += [min(r[1], r[2]) for r in result["mtp_routing"] or []]
        np.array([min(gaps) if gaps else math.inf], dtype="<f8").tofile(args.out + ".gap.f64")
        return 0
    mtp = result["mtp_logits"]
    json.dump({"ids": ids, "logits": result["logits"].tolist(),
               "mtp_logits": None if mtp is None else mtp.tolist(),
               "routing": {str(k): [r[0] for r in v] for k, v in result["routing"].items()}},
              sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
