#!/usr/bin/python3
"""Writes a tiny random-weight DeepSeek-V3 checkpoint in the published Hugging Face layout,
independently of `xdeepserve mkmodel` (used to develop and self-check the oracle's reader);
with --family, a Kimi K2 or DeepSeek-V2 one in its published layout (config fields as in
moonshotai/Kimi-K2-Instruct and deepseek-ai/DeepSeek-V2[-Lite]).

  make_tiny.py --out DIR [--dtype bf16|f16|fp8] [--shards N] [--yarn] [--no-q-lora] [--seed S]
               [--family deepseek_v3|kimi_k2|deepseek_v2] [--gating METHOD]
               [--norm-topk-prob true|false] [--scaling F]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds3_oracle import FP8_E4M3FN_TABLE  # noqa: E402

TINY = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "hidden_act": "silu",
    "bos_token_id": 0, "eos_token_id": 1,
}

# Awkward shapes: fp8 weights of several 128-blocks with partial edges (hidden 160,
# intermediate 200), 3 heads, 12 experts in 3 groups, top-3, 2 shared experts; norms are
# stored as F32 and the embedding as F16 to exercise those dtypes.
ODD = dict(TINY, vocab_size=300, hidden_size=160, intermediate_size=200,
           moe_intermediate_size=40, num_attention_heads=3, num_key_value_heads=3,
           n_shared_experts=2, n_routed_experts=12, num_experts_per_tok=3, n_group=3,
           topk_group=2, q_lora_rank=48, kv_lora_rank=40, qk_nope_head_dim=16,
           qk_rope_head_dim=8, v_head_dim=24, routed_scaling_factor=1.5)


def to_bf16_bytes(x):
    """float -> bf16 (round to nearest even) as uint16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


FP8_POSITIVE = FP8_E4M3FN_TABLE[:0x7F]  # codes 0..126, increasing, finite


def to_fp8_codes(x):
    """float (|x| <= 448) -> nearest e4m3fn code (uint8)."""
    mag = np.abs(x)
    idx = np.clip(np.searchsorted(FP8_POSITIVE, mag), 1, FP8_POSITIVE.size - 1)
    lower = FP8_POSITIVE[idx - 1]
    upper = FP8_POSITIVE[idx]
    code = np.where(mag - lower <= upper - mag, idx - 1, idx).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def quantize_fp8(w, block=128):
    """w [R, C] -> (codes uint8 [R, C], scale_inv f32 [ceil(R/b), ceil(C/b)])."""
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    scale = np.zeros((sr, sc), dtype=np.float32)
    codes = np.zeros((rows, cols), dtype=np.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = np.float32(max(np.abs(blk).max(), 1e-12) / 448.0)
            scale[i, j] = s
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = to_fp8_codes(blk / s)
    return codes, scale


def tensor_shapes(cfg):
    """name -> (shape, kind): kind 'proj' (fp8-able), 'norm', 'bf16', 'bias'."""
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv, c = (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"],
                     cfg["kv_lora_rank"])
    q, v = cfg["q_lora_rank"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": ([v, d], "bf16"), "model.norm.weight": ([d], "norm"),
           "lm_head.weight": ([v, d], "bf16")}
    n_layers = cfg["num_hidden_layers"]
    for layer in range(n_layers + cfg.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = ([d], "norm")
        out[p + "post_attention_layernorm.weight"] = ([d], "norm")
        a = p + "self_attn."
        if q:
            out[a + "q_a_proj.weight"] = ([q, d], "proj")
            out[a + "q_a_layernorm.weight"] = ([q], "norm")
            out[a + "q_b_proj.weight"] = ([h * (dn + dr), q], "proj")
        else:
            out[a + "q_proj.weight"] = ([h * (dn + dr), d], "proj")
        out[a + "kv_a_proj_with_mqa.weight"] = ([c + dr, d], "proj")
        out[a + "kv_a_layernorm.weight"] = ([c], "norm")
        out[a + "kv_b_proj.weight"] = ([h * (dn + dv), c], "proj")
        out[a + "o_proj.weight"] = ([d, h * dv], "proj")
        m = p + "mlp."
        if layer < cfg["first_k_dense_replace"]:
            i = cfg["intermediate_size"]
            out.update({m + "gate_proj.weight": ([i, d], "proj"),
                        m + "up_proj.weight": ([i, d], "proj"),
                        m + "down_proj.weight": ([d, i], "proj")})
        else:
            i = cfg["moe_intermediate_size"]
            out[m + "gate.weight"] = ([cfg["n_routed_experts"], d], "gate")
            out[m + "gate.e_score_correction_bias"] = ([cfg["n_routed_experts"]], "bias")
            for e in range(cfg["n_routed_experts"]):
                x = f"{m}experts.{e}."
                out.update({x + "gate_proj.weight": ([i, d], "proj"),
                            x + "up_proj.weight": ([i, d], "proj"),
                            x + "down_proj.weight": ([d, i], "proj")})
            s = i * cfg["n_shared_experts"]
            out.update({m + "shared_experts.gate_proj.weight": ([s, d], "proj"),
                        m + "shared_experts.up_proj.weight": ([s, d], "proj"),
                        m + "shared_experts.down_proj.weight": ([d, s], "proj")})
        if layer >= n_layers:
            out[p + "enorm.weight"] = ([d], "norm")
            out[p + "hnorm.weight"] = ([d], "norm")
            out[p + "eh_proj.weight"] = ([d, 2 * d], "bf16")
            out[p + "shared_head.norm.weight"] = ([d], "norm")
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array of the raw element type)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(np.uint64(len(text)).tobytes())
        f.write(text)
        for b in blobs:
            f.write(b)


def family_config(cfg, family, gating, norm_topk_prob, scaling):
    """The published fields of Kimi K2 / DeepSeek-V2 over the tiny shapes."""
    if family == "kimi_k2":  # DeepSeek-V3's class, one expert group, x 2.827, YaRN x 32
        cfg.update(model_type="kimi_k2", n_group=1, topk_group=1, routed_scaling_factor=2.827,
                   num_nextn_predict_layers=0, rope_theta=50000.0,
                   rope_scaling={"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0,
                                 "mscale": 1.0, "mscale_all_dim": 1.0,
                                 "original_max_position_embeddings": 128, "type": "yarn"})
    elif family == "deepseek_v2":  # softmax, greedy / group_limited_greedy, no bias, no MTP
        del cfg["num_nextn_predict_layers"]
        cfg.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                   scoring_func="softmax", aux_loss_alpha=0.001, seq_aux=True,
                   topk_method=gating if gating != "noaux_tc" else "greedy",
                   norm_topk_prob=False, routed_scaling_factor=16.0)
        if cfg["topk_method"] == "greedy":
            cfg.update(n_group=1, topk_group=1)
    if norm_topk_prob is not None:
        cfg["norm_topk_prob"] = norm_topk_prob
    if scaling is not None:
        cfg["routed_scaling_factor"] = scaling


def make(out, dtype="bf16", shards=1, yarn=False, q_lora=True, seed=1, shape="tiny",
         gating="noaux_tc", family="deepseek_v3", norm_topk_prob=None, scaling=None):
    cfg = dict(TINY if shape == "tiny" else ODD)
    if gating == "softmax":  # softmax scores, plain top-k, no bias, weights not renormalised
        cfg.update(scoring_func="softmax", topk_method="greedy", n_group=1, topk_group=1,
                   norm_topk_prob=False)
    if not q_lora:
        cfg["q_lora_rank"] = None
    if yarn:
        v2 = family == "deepseek_v2"  # V2 publishes mscale = mscale_all_dim = 0.707
        cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 64, "beta_fast": 32,
                               "beta_slow": 1, "mscale": 0.707 if v2 else 1.0,
                               "mscale_all_dim": 0.707}
    family_config(cfg, family, gating, norm_topk_prob, scaling)
    if dtype == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                      "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, (dims, kind) in tensor_shapes(cfg).items():
        if kind == "norm":
            w = 1.0 + 0.1 * rng.standard_normal(dims)
        elif kind == "bias":
            if cfg["topk_method"] != "noaux_tc":
                continue
            tensors[name] = ("F32", (0.05 * rng.standard_normal(dims)).astype(np.float32))
            continue
        elif kind == "gate":
            w = rng.standard_normal(dims) * (2.0 / np.sqrt(dims[1]))
        elif name.endswith("embed_tokens.weight"):
            w = rng.standard_normal(dims)
        else:
            w = rng.standard_normal(dims) / np.sqrt(dims[1])
        if kind == "proj" and dtype == "fp8":
            codes, scale = quantize_fp8(w)
            tensors[name] = ("F8_E4M3", codes)
            tensors[name + "_scale_inv"] = ("F32", scale)
        elif dtype == "f16":  # as fp16 checkpoints publish them: every tensor but the bias
            tensors[name] = ("F16", w.astype(np.float16))
        elif shape == "odd" and kind == "norm":
            tensors[name] = ("F32", w.astype(np.float32))
        elif shape == "odd" and name.endswith("embed_tokens.weight"):
            tensors[name] = ("F16", w.astype(np.float16))
        else:
            tensors[name] = ("BF16", to_bf16_bytes(w))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    names = sorted(tensors)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        return
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for k, n in enumerate(names) if k % shards == s}
        write_safetensors(os.path.join(out, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "fp8"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--yarn", action="store_true")
    ap.add_argument("--no-q-lora", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shape", default="tiny", choices=["tiny", "odd"])
    ap.add_argument("--gating", default="noaux_tc",
                    choices=["noaux_tc", "softmax", "greedy", "group_limited_greedy"])
    ap.add_argument("--family", default="deepseek_v3",
                    choices=["deepseek_v3", "kimi_k2", "deepseek_v2"])
    ap.add_argument("--norm-topk-prob", choices=["true", "false"])
    ap.add_argument("--scaling", type=float, help="routed_scaling_factor")
    a = ap.parse_args()
    norm = None if a.norm_topk_prob is None else a.norm_topk_prob == "true"
    make(a.out, a.dtype, a.shards, a.yarn, not a.no_q_lora, a.seed, a.shape, a.gating,
         a.family, norm, a.scaling)


if __name__ == "__main__":
    main()
