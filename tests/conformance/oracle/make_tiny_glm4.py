#!/usr/bin/python3
"""Writes a tiny random-weight GLM-4.5 checkpoint in the published Hugging Face layout,
independently of `xdeepserve mkmodel` (Glm4MoeForCausalLM tensor names and config keys,
the MTP layers at model.layers.{num_hidden_layers + i}, safetensors, an index when sharded).

  make_tiny_glm4.py --out DIR [--seed S] [--layers L] [--hidden D] [--heads H] [--kv-heads KV]
                    [--head-dim DH] [--partial F] [--no-bias] [--no-qk-norm] [--mtp N]
                    [--groups G,TG] [--top-k K] [--first-dense N] [--shared N] [--tied]
                    [--no-norm-topk] [--shards N] [--dtype bf16|f32]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny import to_bf16_bytes, write_safetensors  # noqa: E402


def config(a):
    n_group, topk_group = (int(x) for x in a.groups.split(","))
    return {
        "architectures": ["Glm4MoeForCausalLM"], "attention_bias": not a.no_bias,
        "attention_dropout": 0.0, "pad_token_id": 1, "eos_token_id": [1],
        "head_dim": a.head_dim, "hidden_act": "silu", "hidden_size": a.hidden,
        "partial_rotary_factor": a.partial, "initializer_range": 0.02,
        "intermediate_size": 80, "max_position_embeddings": 4096, "model_type": "glm4_moe",
        "moe_intermediate_size": 24, "norm_topk_prob": not a.no_norm_topk,
        "num_attention_heads": a.heads, "n_group": n_group, "topk_group": topk_group,
        "n_routed_experts": 8, "n_shared_experts": a.shared, "routed_scaling_factor": 2.5,
        "num_experts_per_tok": a.top_k, "first_k_dense_replace": a.first_dense,
        "num_hidden_layers": a.layers, "num_key_value_heads": a.kv_heads, "rms_norm_eps": 1e-5,
        "rope_scaling": None, "rope_theta": 1000000.0, "num_nextn_predict_layers": a.mtp,
        "tie_word_embeddings": a.tied, "torch_dtype": "bfloat16", "use_cache": True,
        "use_qk_norm": not a.no_qk_norm, "vocab_size": a.vocab,
    }


def layer_tensors(cfg, layer, out):
    d, dh = cfg["hidden_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    p = f"model.layers.{layer}."
    out[p + "input_layernorm.weight"] = ([d], "norm")
    out[p + "post_attention_layernorm.weight"] = ([d], "norm")
    for name, rows in (("q_proj", h * dh), ("k_proj", kv * dh), ("v_proj", kv * dh)):
        out[p + f"self_attn.{name}.weight"] = ([rows, d], "proj")
        if cfg["attention_bias"]:
            out[p + f"self_attn.{name}.bias"] = ([rows], "bias")
    out[p + "self_attn.o_proj.weight"] = ([d, h * dh], "proj")
    if cfg["use_qk_norm"]:
        out[p + "self_attn.q_norm.weight"] = ([dh], "norm")
        out[p + "self_attn.k_norm.weight"] = ([dh], "norm")
    mlp = lambda q, i: out.update({q + "gate_proj.weight": ([i, d], "proj"),
                                   q + "up_proj.weight": ([i, d], "proj"),
                                   q + "down_proj.weight": ([d, i], "proj")})
    if layer < cfg["first_k_dense_replace"]:
        mlp(p + "mlp.", cfg["intermediate_size"])
        return
    e, i = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    out[p + "mlp.gate.weight"] = ([e, d], "gate")
    out[p + "mlp.gate.e_score_correction_bias"] = ([e], "score_bias")
    for x in range(e):
        mlp(f"{p}mlp.experts.{x}.", i)
    if cfg["n_shared_experts"]:
        mlp(p + "mlp.shared_experts.", i * cfg["n_shared_experts"])


def tensor_shapes(cfg):
    """name -> (shape, kind) of every tensor a GLM-4.5 checkpoint stores."""
    d, v, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out = {"model.embed_tokens.weight": ([v, d], "embed"), "model.norm.weight": ([d], "norm")}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = ([v, d], "proj")
    for layer in range(L):
        layer_tensors(cfg, layer, out)
    for k in range(cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{L + k}."
        out[p + "enorm.weight"] = ([d], "norm")
        out[p + "hnorm.weight"] = ([d], "norm")
        out[p + "eh_proj.weight"] = ([d, 2 * d], "proj")
        out[p + "shared_head.norm.weight"] = ([d], "norm")
        out[p + "shared_head.head.weight"] = ([v, d], "proj")
        layer_tensors(cfg, L + k, out)
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
        elif kind == "bias":
            w = 0.3 * rng.standard_normal(dims)
        elif kind == "score_bias":
            w = 0.05 * rng.standard_normal(dims)
        else:
            w = rng.standard_normal(dims) / np.sqrt(dims[1])
        if a.dtype == "f32" or kind == "score_bias":  # the correction bias is F32 as published
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
    ap.add_argument("--partial", type=float, default=0.5)
    ap.add_argument("--no-bias", action="store_true")
    ap.add_argument("--no-qk-norm", action="store_true")
    ap.add_argument("--mtp", type=int, default=1)
    ap.add_argument("--groups", default="2,1", help="n_group,topk_group")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--first-dense", type=int, default=1)
    ap.add_argument("--shared", type=int, default=1)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--no-norm-topk", action="store_true")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    make(ap.parse_args())


if __name__ == "__main__":
    main()
