"""Writes the conformance reference for the engine: the PyTorch forward of the EXPORTED bf16
weights (widened exactly, run in float64) on a few held-out token rows.

Usage: /usr/bin/python3 tools/train_tiny/conformance.py [--model models/kjv-moe-tiny]
       [--out tests/conformance/kjv_moe_tiny]
File formats: see the README.md written next to the files.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train.py

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe      # noqa: E402
import export   # noqa: E402

ROWS = 3
ROW_LEN = 64


CANDIDATES_PER_THIRD = 16
SAFE_MARGIN = 2e-4


def pick_rows(m, cfg, ids):
    """One row from each third of the held-out tokens: the first of CANDIDATES_PER_THIRD
    evenly spaced starts whose smallest routing margin (all MoE layers, MTP included) is at
    least SAFE_MARGIN, so that f32 rounding cannot change an expert choice."""
    third = (len(ids) - ROW_LEN) // 3
    starts, margins = [], []
    for part in range(3):
        cands = [part * third + j * (third // CANDIDATES_PER_THIRD)
                 for j in range(CANDIDATES_PER_THIRD)]
        x = torch.tensor([ids[s:s + ROW_LEN] for s in cands])
        _, _, marg = run_with_margins(m, cfg, x)
        per_row = torch.stack([v.view(len(cands), -1).min(-1).values for v in marg.values()])
        per_row = per_row.min(0).values
        ok = [j for j in range(len(cands)) if per_row[j] >= SAFE_MARGIN]
        j = ok[0] if ok else int(per_row.argmax())
        starts.append(cands[j])
        margins.append(float(per_row[j]))
    return starts, margins


def run_with_margins(m, cfg, x):
    """Forward of rows x [B, T]; returns (logits, mtp_logits, {layer: margins [B*T']})."""
    captured = {}
    hooks = []
    for i, moe in m.moe_layers():
        def hook(mod, inp, out, i=i):
            h = inp[0].reshape(-1, inp[0].shape[-1])
            captured[i] = routing_margin(torch.sigmoid(h @ mod.gate.weight.t()),
                                         mod.gate.e_score_correction_bias, cfg)
        hooks.append(moe.register_forward_hook(hook))
    with torch.no_grad():
        logits, mtp_logits = m(x)
    for h in hooks:
        h.remove()
    return logits, mtp_logits, captured


def routing_margin(scores, bias, cfg):
    """Per token: the smallest gap that decides the selection (float64): between the k-th and
    (k+1)-th biased score among experts of the kept groups, and between the topk_group-th and
    next group score. A gap near 0 would make the chosen set sensitive to rounding."""
    n, e = scores.shape
    b = scores + bias[None, :]
    grp = torch.sort(b.view(n, cfg["n_group"], -1), dim=-1, descending=True).values
    gs = torch.sort(grp[..., :2].sum(-1), dim=-1, descending=True).values
    kg = cfg["topk_group"]
    gmargin = gs[:, kg - 1] - gs[:, kg]
    keep = torch.sort(grp[..., :2].sum(-1), dim=-1, descending=True, stable=True).indices[:, :kg]
    mask = torch.zeros(n, cfg["n_group"], dtype=torch.bool)
    mask.scatter_(1, keep, True)
    bm = b.masked_fill(~mask[:, :, None].expand(n, cfg["n_group"], e // cfg["n_group"])
                       .reshape(n, e), float("-inf"))
    sb = torch.sort(bm, dim=-1, descending=True).values
    k = cfg["num_experts_per_tok"]
    return torch.minimum(gmargin, sb[:, k - 1] - sb[:, k])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/kjv-moe-tiny")
    ap.add_argument("--out", default="tests/conformance/kjv_moe_tiny")
    args = ap.parse_args()
    torch.set_num_threads(2)
    m, cfg = export.load_exported(args.model, dtype=torch.float64)
    with open(os.path.join(args.model, "tokenizer.json"), encoding="utf-8") as f:
        tok = bpe.load_tokenizer_json(f.read())
    with open(os.path.join(args.model, "heldout.txt"), encoding="utf-8") as f:
        ids = tok.encode(f.read())
    starts, row_margins = pick_rows(m, cfg, ids)
    rows = np.array([ids[s:s + ROW_LEN] for s in starts], dtype=np.int32)
    os.makedirs(args.out, exist_ok=True)
    logits, mtp_logits, captured = run_with_margins(m, cfg,
                                                    torch.from_numpy(rows.astype(np.int64)))
    n = cfg["num_hidden_layers"]
    k = cfg["num_experts_per_tok"]
    main_moe = [i for i, _ in m.moe_layers() if i < n]
    routing = np.stack([m.model.layers[i].mlp.last_topk.numpy().reshape(ROWS, ROW_LEN, k)
                        for i in main_moe]).astype(np.int32)
    mtp_routing = m.model.layers[n].mlp.last_topk.numpy().reshape(ROWS, ROW_LEN - 1, k) \
        .astype(np.int32)
    margins = {str(i): float(v.min()) for i, v in captured.items()}
    v = cfg["vocab_size"]

    def write(name, arr, dtype):
        arr = np.ascontiguousarray(arr, dtype=dtype)
        arr.tofile(os.path.join(args.out, name))
        return list(arr.shape)

    meta = {
        "model": "models/kjv-moe-tiny",
        "compute": "float64 forward of the exported bf16 weights (widened exactly), "
                   "stored as float32",
        "rows": ROWS, "row_len": ROW_LEN, "vocab_size": v,
        "row_starts_in_heldout_tokens": starts,
        "row_min_routing_margin": row_margins,
        "moe_layers": main_moe, "mtp_layer": n, "num_experts_per_tok": k,
        "files": {
            "tokens.i32": write("tokens.i32", rows, "<i4"),
            "logits.f32": write("logits.f32", logits.reshape(ROWS * ROW_LEN, v).numpy(), "<f4"),
            "mtp_logits.f32": write("mtp_logits.f32",
                                    mtp_logits.reshape(ROWS * (ROW_LEN - 1), v).numpy(), "<f4"),
            "routing.i32": write("routing.i32", routing, "<i4"),
            "mtp_routing.i32": write("mtp_routing.i32", mtp_routing, "<i4"),
        },
        "min_routing_margin_per_layer": margins,
        "main_argmax_first_row": [int(a) for a in logits[0].argmax(-1)[:16]],
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
