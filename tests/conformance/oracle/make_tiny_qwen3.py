#!/usr/bin/python3
"""Writes a tiny random-weight Qwen3-MoE checkpoint in the published Hugging Face layout,
independently of `xdeepserve mkmodel` (Qwen3MoeForCausalLM tensor names, safetensors, an
index when sharded).

  make_tiny_qwen3.py --out DIR [--seed S] [--vocab V] [--layers L] [--heads H] [--kv-heads KV] [--head-dim DH]
                     [--hidden D] [--tied] [--no-norm-topk] [--sparse-step N]
                     [--mlp-only L,...] [--shards N] [--yarn] [--dtype bf16|f32] [--top-k K]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny import to_bf16_bytes, write_safetensors  # noqa: E402


def config(a):
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": 80,
        "moe_intermediate_size": 24, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim, "num_experts": 8, "num_experts_per_tok": a.top_k,
        "decoder_sparse_step": a.sparse_step,
        "mlp_only_layers": [int(x) for x in a.mlp_only.split(",") if x],
        "norm_topk_prob": not a.no_norm_topk, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_scaling": None, "max_position_embeddings": 4096,
        "tie_word_embeddings": a.tied, "hidden_act": "silu", "attention_bias": False,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": a.layers,
        "output_router_logits": False, "router_aux_loss_coef": 0.001,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    }
    if a.yarn:
        cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32}
    return cfg


def is_moe_layer(cfg, layer):
    return (layer not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0
            and (layer + 1) % cfg["decoder_sparse_step"] == 0)


def tensor_shapes(cfg):
    """name -> (shape, kind) of every tensor Qwen3MoeForCausalLM stores."""
    d, dh = cfg["hidden_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {"model.embed_tokens.weight": ([cfg["vocab_size"], d], "embed"),
           "model.norm.weight": ([d], "norm")}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = ([cfg["vocab_size"], d], "proj")
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = ([d], "norm")
        out[p + "post_attention_layernorm.weight"] = ([d], "norm")
        out[p + "self_attn.q_proj.weight"] = ([h * dh, d], "proj")
        out[p + "self_attn.k_proj.weight"] = ([kv * dh, d], "proj")
        out[p + "self_attn.v_proj.weight"] = ([kv * dh, d], "proj")
        out[p + "self_attn.o_proj.weight"] = ([d, h * dh], "proj")
        out[p + "self_attn.q_norm.weight"] = ([dh], "norm")
        out[p + "self_attn.k_norm.weight"] = ([dh], "norm")
        if is_moe_layer(cfg, layer):
            out[p + "mlp.gate.weight"] = ([cfg["num_experts"], d], "gate")
            i = cfg["moe_intermediate_size"]
            for e in range(cfg["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                out[q + "gate_proj.weight"] = ([i, d], "proj")
                out[q + "up_proj.weight"] = ([i, d], "proj")
                out[q + "down_proj.weight"] = ([d, i], "proj")
        else:
            i = cfg["intermediate_size"]
            out[p + "mlp.gate_proj.weight"] = ([i, d], "proj")
            out[p + "mlp.up_proj.weight"] = ([i, d], "proj")
            out[p + "mlp.down_proj.weight"] = ([d, i], "proj")
    return out


def make(a):
    cfg = config(a)
    rng = np.random.default_rng(a.seed)
    tensors = {}
    for name, (dims, kind) in tensor_shapes(cfg).items():
        if kind == "norm":
            w = 1.0 + 0.1 * rng.standard_normal(dims)
        elif kind == "gate":
            w = rng.standard_normal(dims) * (2.0 / np.sqrt(dims[1]))
        elif kind == "embed":
            w = rng.standard_normal(dims)
        else:
            w = rng.standard_normal(dims) / np.sqrt(dims[1])
        if a.dtype == "f32":
            tensors[name] = ("F32", w.astype(np.float32))
        else:
            tensors[name] = ("BF16", to_bf16_bytes(w))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    names = sorted(tensors)
    if a.shards == 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)
        return
    weight_map = {}
    for s in range(a.shards):
        fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        part = {n: tensors[n] for k, n in enumerate(names) if k % a.shards == s}
        write_safetensors(os.path.join(a.out, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=24)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--no-norm-topk", action="store_true")
    ap.add_argument("--sparse-step", type=int, default=1)
    ap.add_argument("--mlp-only", default="")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--yarn", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    make(ap.parse_args())


if __name__ == "__main__":
    main()
