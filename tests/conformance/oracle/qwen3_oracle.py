#!/usr/bin/python3
"""Float64 reference forward pass of Qwen3-MoE checkpoints (the conformance oracle).

Written from Hugging Face transformers' modeling_qwen3_moe.py, plainly, in float64 with
numpy: full recompute (no KV cache), grouped-query attention with an RMSNorm over each head
of q and k (before RoPE), rotate-half RoPE (optionally YaRN: cos and sin times the attention
factor 0.1·ln(factor) + 1), causal softmax at head_dim^-0.5, query head i reading KV head
i // (H / KV) (repeat_kv); the sparse MoE block: softmax over every expert, top-k,
renormalised if norm_topk_prob, no shared experts; a dense SwiGLU in mlp_only_layers and in
layers where (layer + 1) % decoder_sparse_step != 0. Shares the checkpoint reader and the
elementwise pieces (rms_norm, silu, softmax) with ds3_oracle; nothing with the engine.

Shapes: T tokens, H query heads, KV heads, Dh head_dim, D hidden, E experts.

CLI:
  qwen3_oracle.py --model DIR --ids 1,2,3
prints the logits and the routing as JSON on stdout.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds3_oracle import Checkpoint, order_desc, rms_norm, silu, softmax  # noqa: E402


class Config:
    """The config.json fields the forward pass uses (Qwen3MoeConfig names and defaults)."""

    REQUIRED = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "moe_intermediate_size",
                "num_experts", "num_experts_per_tok"]

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
        self.num_experts = int(raw["num_experts"])
        self.num_experts_per_tok = int(raw["num_experts_per_tok"])
        self.decoder_sparse_step = int(g("decoder_sparse_step", 1))
        self.mlp_only_layers = list(g("mlp_only_layers") or [])
        self.norm_topk_prob = bool(g("norm_topk_prob", False))
        self.rms_norm_eps = float(g("rms_norm_eps", 1e-6))
        self.rope_theta = float(g("rope_theta", 10000.0))
        self.rope_scaling = g("rope_scaling")
        self.max_position_embeddings = int(g("max_position_embeddings", 32768))
        self.tie_word_embeddings = bool(g("tie_word_embeddings", False))
        # what the engine's run_conformance expects of a config
        self.num_nextn_predict_layers = 0

    def is_moe_layer(self, layer):
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)


def rope_inv_freq(cfg):
    """-> (inv_freq [Dh/2], attention factor multiplying cos and sin)."""
    dim, base = cfg.head_dim, cfg.rope_theta
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = cfg.rope_scaling
    if not rs:
        return 1.0 / pos_freqs, 1.0
    if rs.get("rope_type", rs.get("type")) != "yarn":
        raise ValueError(f"rope_scaling {rs} not supported")
    factor = float(rs["factor"])
    orig = float(rs.get("original_max_position_embeddings") or cfg.max_position_embeddings)
    beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1.0 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, attention_factor


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class Oracle:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = Config(json.load(f))
        self.ckpt = Checkpoint(model_dir)
        self.inv_freq, self.attention_factor = rope_inv_freq(self.cfg)
        self._cache = {}

    def w(self, name):
        if name not in self._cache:
            self._cache[name] = self.ckpt.get(name)
        return self._cache[name]

    def linear(self, x, name):
        return x @ self.w(name).T

    def mlp(self, x, prefix):
        return self.linear(silu(self.linear(x, prefix + "gate_proj.weight"))
                           * self.linear(x, prefix + "up_proj.weight"), prefix + "down_proj.weight")

    def rope(self, x, positions):
        """x [T, heads, Dh] -> rotated (q·cos + rotate_half(q)·sin, cos/sin = cat(f, f))."""
        angle = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]  # [T, Dh/2]
        emb = np.concatenate([angle, angle], axis=-1)[:, None, :]             # [T, 1, Dh]
        cos = np.cos(emb) * self.attention_factor
        sin = np.sin(emb) * self.attention_factor
        return x * cos + rotate_half(x) * sin

    def attention(self, x, positions, prefix):
        cfg = self.cfg
        t, h, kvh, dh = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        q = rms_norm(self.linear(x, prefix + "q_proj.weight").reshape(t, h, dh),
                     self.w(prefix + "q_norm.weight"), eps)
        k = rms_norm(self.linear(x, prefix + "k_proj.weight").reshape(t, kvh, dh),
                     self.w(prefix + "k_norm.weight"), eps)
        v = self.linear(x, prefix + "v_proj.weight").reshape(t, kvh, dh)
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
        """x [T, D] -> (out [T, D], routing: per token (sorted experts, k-th minus (k+1)-th
        probability, inf))."""
        cfg = self.cfg
        k = cfg.num_experts_per_tok
        probs = softmax(self.linear(x, prefix + "gate.weight"), axis=-1)  # [T, E]
        out = np.zeros_like(x)
        routing = []
        for t in range(x.shape[0]):
            order = order_desc(probs[t])
            chosen = order[:k]
            weights = probs[t][chosen]
            if cfg.norm_topk_prob:
                weights = weights / weights.sum()
            for e, wgt in zip(chosen, weights):
                out[t] += wgt * self.mlp(x[t], f"{prefix}experts.{e}.")
            gap = probs[t][order[k - 1]] - probs[t][order[k]] if k < cfg.num_experts else np.inf
            routing.append((sorted(int(e) for e in chosen), float(gap), np.inf))
        return out, routing

    def forward(self, ids):
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        positions = np.arange(len(ids))
        x = self.w("model.embed_tokens.weight")[np.asarray(ids, dtype=np.int64)]
        routing = {}
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            x = x + self.attention(rms_norm(x, self.w(p + "input_layernorm.weight"), eps),
                                   positions, p + "self_attn.")
            normed = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), eps)
            if cfg.is_moe_layer(layer):
                mlp_out, routing[layer] = self.moe(normed, p + "mlp.")
            else:
                mlp_out = self.mlp(normed, p + "mlp.")
            x = x + mlp_out
        final = rms_norm(x, self.w("model.norm.weight"), eps)
        head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        return {"logits": self.linear(final, head), "final_normed": final, "routing": routing}

    def run(self, ids, with_mtp=False):
        out = self.forward(ids)
        return {"logits": out["logits"], "routing": out["routing"], "mtp_logits": None,
                "mtp_routing": None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    args = ap.parse_args(argv)
    ids = [int(s) for s in args.ids.replace(" ", "").split(",") if s]
    result = Oracle(args.model).run(ids)
    json.dump({"ids": ids, "logits": result["logits"].tolist(),
               "routing": {str(k): [r[0] for r in v] for k, v in result["routing"].items()}},
              sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
