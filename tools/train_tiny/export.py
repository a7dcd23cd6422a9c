"""Exports a training checkpoint to the Hugging Face layout in models/<name>/.

Usage: /usr/bin/python3 tools/train_tiny/export.py [--work build/train_tiny/run]
                                                    [--out models/kjv-moe-tiny]
Writes config.json, generation_config.json, model.safetensors (BF16; the
e_score_correction_bias vectors F32), tokenizer.json, tokenizer_config.json and heldout.txt.
The MTP layer's embed_tokens and shared_head.head are tied to the main model's during
training and written as copies under their published names.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe              # noqa: E402
import model            # noqa: E402
import safetensors_io   # noqa: E402


def export_tensors(state, cfg):
    out = {}
    for name, t in state.items():
        dtype = "F32" if name.endswith("e_score_correction_bias") else "BF16"
        out[name] = (t, dtype)
    n = cfg["num_hidden_layers"]
    for k in range(cfg["num_nextn_predict_layers"]):
        out[f"model.layers.{n + k}.embed_tokens.weight"] = (state["model.embed_tokens.weight"],
                                                           "BF16")
        out[f"model.layers.{n + k}.shared_head.head.weight"] = (state["lm_head.weight"], "BF16")
    return out


def public_config(cfg):
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def load_exported(model_dir, dtype=torch.float32):
    """Builds the PyTorch model from an exported directory (bf16 weights widened exactly)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors, _ = safetensors_io.read(os.path.join(model_dir, "model.safetensors"))
    m = model.DeepseekV3(cfg)
    state = {k: safetensors_io.to_float32(a, d) for k, (a, d) in tensors.items()}
    n = cfg["num_hidden_layers"]
    for k in range(cfg["num_nextn_predict_layers"]):
        # Training ties these; the exported copies must equal the main tensors.
        assert torch.equal(state.pop(f"model.layers.{n + k}.embed_tokens.weight"),
                           state["model.embed_tokens.weight"])
        assert torch.equal(state.pop(f"model.layers.{n + k}.shared_head.head.weight"),
                           state["lm_head.weight"])
    m.load_state_dict(state, strict=True)
    m = m.to(dtype)
    m.eval()
    return m, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="build/train_tiny/run")
    ap.add_argument("--out", default="models/kjv-moe-tiny")
    args = ap.parse_args()
    st = torch.load(os.path.join(args.work, "ckpt.pt"))
    cfg = st["config"]
    os.makedirs(args.out, exist_ok=True)
    size = safetensors_io.write(os.path.join(args.out, "model.safetensors"),
                                export_tensors(st["model"], cfg), {"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(public_config(cfg), f, indent=2)
        f.write("\n")
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
           "do_sample": True, "temperature": 0.8, "top_p": 0.95}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.work, "merges.json")) as f:
        tok = bpe.Tokenizer([tuple(m) for m in json.load(f)])
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(bpe.dumps_tokenizer_json(tok))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(bpe.tokenizer_config(cfg["max_position_embeddings"]), f, indent=2,
                  ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.work, "heldout.txt")) as fi, \
            open(os.path.join(args.out, "heldout.txt"), "w") as fo:
        fo.write(fi.read())
    print(f"exported step {st['step']} to {args.out}: model.safetensors {size} bytes")


if __name__ == "__main__":
    main()
