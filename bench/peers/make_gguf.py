#!/usr/bin/env python3
"""Writes a GGUF ("deepseek2" architecture, MLA) of a DeepSeek-V3 config.json's exact shape,
with random weights: every matrix Q8_0 (or, --type q8_k_r8, every matrix but the token
embedding Q8_K_R8, ik_llama.cpp's row-interleaved 8-bit type with a scale per 256; or, --type
bf16, every matrix BF16), norms / router / router bias F32. The peer's 4-bit types are made
from the Q8_0 file by its own llama-quantize (bench/peers/run.sh).

    make_gguf.py --config MODEL/config.json --gguf-py SRC/gguf-py --out model-q8_0.gguf \
        [--type q8_0|q8_k_r8|bf16]

Random weights are enough for throughput: each matrix has the shape and the bytes of the
real one, and the router, being random too, spreads tokens over the experts as a trained
one roughly does. A Q8_0 block is 34 bytes: an f16 scale, then 32 int8 (k along a row);
the scales are set so that every matrix has weights of std ~ 1/sqrt(k) (activations stay
finite through the layers). A Q8_K_R8 block holds 8 rows x 256: 8 f16 scales, then 2048
int8 (4 of each row in turn); it is written directly (rows and k multiples of 8 and 256),
as llama-quantize would write it. The vocabulary is 32000 placeholder tokens (<0x00>..<0xFF>
as SPM byte tokens, then "t<id>").
"""
import argparse
import json
import math
import sys

import numpy as np


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--gguf-py", required=True, help="the peer tree's gguf-py directory")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--type", choices=["q8_0", "q8_k_r8", "bf16"], default="q8_0")
    return p.parse_args()


def main():
    a = parse()
    sys.path.insert(0, a.gguf_py)
    import gguf  # the peer tree's own writer

    c = json.load(open(a.config))
    rng = np.random.default_rng(a.seed)
    Q8 = gguf.GGMLQuantizationType.Q8_0

    def q8(*shape):
        """Random Q8_0 matrix of numpy shape (..., rows, k): bytes (..., rows, k/32*34)."""
        *lead, k = shape
        assert k % 32 == 0, shape
        nblk = math.prod(lead) * (k // 32)
        q = np.frombuffer(rng.bytes(nblk * 32), dtype=np.int8).reshape(nblk, 32)
        # int8 uniform on [-128, 127] has std ~74: scale so that weights have std 1/sqrt(k).
        d = np.full((nblk, 1), 1.0 / (74.0 * math.sqrt(k)), dtype=np.float16)
        blk = np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=1)
        return blk.reshape(*lead, (k // 32) * 34)

    def q8_k_r8(*shape):
        """Random Q8_K_R8 matrix of numpy shape (..., rows, k): bytes (..., rows, k/256*258)."""
        *lead, rows, k = shape
        assert k % 256 == 0 and rows % 8 == 0, shape
        nblk = math.prod(lead) * (rows // 8) * (k // 256)
        q = np.frombuffer(rng.bytes(nblk * 2048), dtype=np.int8).reshape(nblk, 2048)
        d = np.full((nblk, 8), 1.0 / (74.0 * math.sqrt(k)), dtype=np.float16)
        blk = np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=1)
        return blk.reshape(*lead, rows, (k // 256) * 258)

    def bf16(*shape):
        """Random BF16 matrix of numpy shape (..., rows, k), std 1/sqrt(k): bytes (..., rows, 2k)."""
        *lead, k = shape
        x = rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(k))
        hi = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation: random either way
        return hi.view(np.uint8).reshape(*lead, 2 * k)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    H = c["hidden_size"]
    L = c["num_hidden_layers"]
    nh = c["num_attention_heads"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    qr, kvr = c["q_lora_rank"], c["kv_lora_rank"]
    E, topk, ffe = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    nsh, ff, dense = c["n_shared_experts"], c["intermediate_size"], c["first_k_dense_replace"]
    V = c["vocab_size"]

    w = gguf.GGUFWriter(a.out, "deepseek2")
    w.add_name("bench-shape-random-" + a.type)
    w.add_context_length(c.get("max_position_embeddings", 8192))
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nh)
    w.add_rope_freq_base(c.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_leading_dense_block_count(dense)
    w.add_q_lora_rank(qr)
    w.add_kv_lora_rank(kvr)
    w.add_key_length(nope + rope)
    w.add_value_length(vd)
    w.add_rope_dimension_count(rope)
    w.add_vocab_size(V)
    w.add_expert_feed_forward_length(ffe)
    w.add_expert_count(E)
    w.add_expert_used_count(topk)
    w.add_expert_shared_count(nsh)
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_weights_norm(bool(c.get("norm_topk_prob", True)))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID
                             if c.get("scoring_func") == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type({"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "q8_k_r8": gguf.LlamaFileType.MOSTLY_Q8_K_R8,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[a.type])

    tokens = [f"<0x{i:02X}>" for i in range(256)] + [f"t{i}" for i in range(256, V)]
    types = [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (V - 256)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(c.get("bos_token_id", 0) or 0)
    w.add_eos_token_id(c.get("eos_token_id", 1) or 1)

    def mat(name, *shape):  # numpy order: (..., out rows, in k)
        if a.type == "bf16":
            w.add_tensor(name, bf16(*shape), raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif a.type == "q8_k_r8":
            w.add_tensor(name, q8_k_r8(*shape), raw_dtype=gguf.GGMLQuantizationType.Q8_K_R8)
        else:
            w.add_tensor(name, q8(*shape), raw_dtype=Q8)

    if a.type == "bf16":
        w.add_tensor("token_embd.weight", bf16(V, H), raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor("token_embd.weight", q8(V, H), raw_dtype=Q8)  # rows are looked up: Q8_0
    w.add_tensor("output_norm.weight", ones(H))
    mat("output.weight", V, H)
    for i in range(L):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(H))
        w.add_tensor(b + "attn_q_a_norm.weight", ones(qr))
        w.add_tensor(b + "attn_kv_a_norm.weight", ones(kvr))
        mat(b + "attn_q_a.weight", qr, H)
        mat(b + "attn_q_b.weight", nh * (nope + rope), qr)
        mat(b + "attn_kv_a_mqa.weight", kvr + rope, H)
        mat(b + "attn_kv_b.weight", nh * (nope + vd), kvr)
        mat(b + "attn_output.weight", H, nh * vd)
        w.add_tensor(b + "ffn_norm.weight", ones(H))
        if i < dense:
            mat(b + "ffn_gate.weight", ff, H)
            mat(b + "ffn_up.weight", ff, H)
            mat(b + "ffn_down.weight", H, ff)
            continue
        router = rng.standard_normal((E, H), dtype=np.float32) / math.sqrt(H)
        w.add_tensor(b + "ffn_gate_inp.weight", router)
        w.add_tensor(b + "exp_probs_b.bias", np.zeros(E, dtype=np.float32))
        mat(b + "ffn_gate_exps.weight", E, ffe, H)
        mat(b + "ffn_up_exps.weight", E, ffe, H)
        mat(b + "ffn_down_exps.weight", E, H, ffe)
        mat(b + "ffn_gate_shexp.weight", ffe * nsh, H)
        mat(b + "ffn_up_shexp.weight", ffe * nsh, H)
        mat(b + "ffn_down_shexp.weight", H, ffe * nsh)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


if __name__ == "__main__":
    main()
