"""Measures an exported model for its card: held-out perplexity, MTP agreement, expert load,
sample generations. Loads the EXPORTED bf16 weights (widened exactly to float32) and runs the
PyTorch forward of model.py in float32.

Usage: /usr/bin/python3 tools/train_tiny/evaluate.py [--model models/kjv-moe-tiny]
       [--out build/train_tiny/run/eval.json]

Definitions (also in the model card):
  tokens  = the tokenizer's ids for the UTF-8 bytes of heldout.txt, no BOS/EOS added.
  windows = consecutive non-overlapping slices tokens[k*W:(k+1)*W], W = 512; the last one
            may be shorter and counts if it has >= 2 tokens. Each window is run alone from
            rope position 0 (no state carried between windows).
  perplexity = exp(sum of -log p(tokens_i | window prefix) over every window and every
               position i = 1..len-1 of it / number of such positions).
  MTP top-1 agreement = over every window and t = 0..len-3: argmax of the MTP logits of row t
               (which predicts token t+2 from the main hidden at t and token t+1) equals the
               argmax of the main logits at position t+1 (which also predicts token t+2);
               argmax ties to the lower id.
  expert load = per MoE layer, the number of (token, chosen expert) pairs per expert over all
               window positions (the MTP layer: all of its rows); reported as max/mean.
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train.py

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe      # noqa: E402
import export   # noqa: E402

WINDOW = 512


def heldout_windows(tok, text, window=WINDOW):
    ids = tok.encode(text)
    wins = [ids[i:i + window] for i in range(0, len(ids), window)]
    return ids, [w for w in wins if len(w) >= 2]


@torch.no_grad()
def measure(m, cfg, windows):
    nll, count = 0.0, 0
    agree, agree_n, mtp_hit, main_hit = 0, 0, 0, 0
    moe = m.moe_layers()
    loads = {i: torch.zeros(cfg["n_routed_experts"], dtype=torch.float64) for i, _ in moe}
    for w in windows:
        x = torch.tensor([w])
        logits, mtp_logits = m(x)
        lp = F.log_softmax(logits[0].double(), dim=-1)
        tgt = x[0, 1:]
        nll -= lp[:-1].gather(1, tgt[:, None]).sum().item()
        count += len(w) - 1
        for i, layer in moe:
            loads[i] += torch.bincount(layer.last_topk.reshape(-1),
                                       minlength=cfg["n_routed_experts"]).double()
        if mtp_logits is not None and len(w) >= 3:
            mtp_arg = mtp_logits[0, :-1].argmax(-1)          # rows t = 0..len-3
            main_arg = logits[0, 1:-1].argmax(-1)            # positions t+1
            agree += (mtp_arg == main_arg).sum().item()
            mtp_hit += (mtp_arg == x[0, 2:]).sum().item()
            main_hit += (logits[0, :-1].argmax(-1) == tgt).sum().item()
            agree_n += len(w) - 2
    return {
        "heldout_tokens": sum(len(w) for w in windows),
        "predicted_tokens": count,
        "mean_nll": nll / count,
        "perplexity": math.exp(nll / count),
        "mtp_top1_agreement": agree / agree_n,
        "mtp_top1_accuracy": mtp_hit / agree_n,
        "main_top1_accuracy": main_hit / count,
        "expert_load": {str(i): {"counts": [int(v) for v in l.tolist()],
                                 "max_over_mean": (l.max() / l.mean()).item(),
                                 "min_over_mean": (l.min() / l.mean()).item()}
                        for i, l in loads.items()},
    }


@torch.no_grad()
def generate(m, tok, prompt, n_new, temperature, top_p=1.0, seed=0):
    """BOS + prompt, then n_new tokens (stops at EOS). Recomputes the full prefix each step."""
    g = torch.Generator().manual_seed(seed)
    ids = tok.encode(prompt, add_bos=True)
    for _ in range(n_new):
        logits, _ = m(torch.tensor([ids]), mtp=False)
        z = logits[0, -1].double()
        if temperature == 0:
            nxt = int(torch.argmax(z))
        else:
            p = torch.softmax(z / temperature, -1)
            sp, si = torch.sort(p, descending=True)
            keep = torch.cumsum(sp, 0) - sp < top_p
            sp = sp * keep
            nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=g)])
        ids.append(nxt)
        if nxt == tok.eos_id:
            break
    return tok.decode(ids[1:])


PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "Blessed are the",
           "Psalms 23\n1"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/kjv-moe-tiny")
    ap.add_argument("--out", default="build/train_tiny/run/eval.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-tokens", type=int, default=60)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    m, cfg = export.load_exported(args.model)
    with open(os.path.join(args.model, "tokenizer.json"), encoding="utf-8") as f:
        tok = bpe.load_tokenizer_json(f.read())
    with open(os.path.join(args.model, "heldout.txt"), encoding="utf-8") as f:
        text = f.read()
    _, windows = heldout_windows(tok, text)
    res = measure(m, cfg, windows)
    res["window"] = WINDOW
    res["samples"] = []
    for i, p in enumerate(PROMPTS):
        res["samples"].append({"prompt": p, "mode": "greedy",
                               "text": generate(m, tok, p, args.gen_tokens, 0.0)})
        res["samples"].append({"prompt": p, "mode": "temperature 0.8, top-p 0.95, seed %d" % i,
                               "text": generate(m, tok, p, args.gen_tokens, 0.8, 0.95, seed=i)})
    res["eval_seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k not in ("samples", "expert_load")},
                     indent=1))
    for i, l in res["expert_load"].items():
        print(f"layer {i}: max/mean {l['max_over_mean']:.2f} min/mean {l['min_over_mean']:.2f}")
    for s in res["samples"]:
        print(f"--- {s['mode']}: {s['prompt']!r}\n{s['text']}")


if __name__ == "__main__":
    main()
