#!/usr/bin/python3
"""The shipped model's second MTP layer is wired as the recipe trained it: the engine's
chained draft 2 (`xdeepserve perplexity --mtp-agreement`, teacher forcing) against the
recipe's own PyTorch chain (tools/train_tiny/model.py, DeepseekV3.forward_drafts, float64),
two independent implementations of speculative decoding's chain (model/speculative_decode.h):
draft 2's row t sits at position t+1, is built from MTP layer 1's residual output at t and
token t+2, attends the layer's teacher-forced rows 0..t, and predicts token t+3.

  test_mtp2_wiring.py --xdeepserve BIN [--model DIR] [--bytes N]

On the first N bytes of heldout.txt (windows of 512 tokens, as perplexity), for the trained
second layer (default) and for reuse (--speculative-mtp-layers 1), the engine's counts of
draft-1 agreements, draft-2 agreements and draft-2 agreements where draft 1 agreed must equal
the PyTorch ones within max(2, 0.2% of the rows): an argmax with a top-2 margin below the
float32 rounding of the engine may fall either way, nothing else may differ. The PyTorch
counts of the trained layer and of reuse must differ (else the check could not tell them
apart).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "train_tiny"))
import bpe      # noqa: E402
import export   # noqa: E402

WINDOW = 512
LINE = re.compile(r"draft 1 ([0-9.]+) over (\d+) rows; draft 2 \(MTP layer (\d+)(, reused)?\) "
                  r"([0-9.]+) over (\d+) rows, ([0-9.]+) over the (\d+) rows whose draft 1 agreed")


def engine_counts(xds, model_dir, path, mtp_layers):
    cmd = [xds, "perplexity", "--model", model_dir, "--file", path, "--mtp-agreement",
           "--speculative-mtp-layers", str(mtp_layers), "--compute-dtype", "f32",
           "--threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"engine failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr[-2000:]}")
    m = LINE.search(p.stdout)
    if not m:
        raise SystemExit(f"no agreement line in: {p.stdout}")
    rows1, rows2, rows21 = int(m.group(2)), int(m.group(6)), int(m.group(8))
    return {"layer2": int(m.group(3)),
            "rows1": rows1, "agree1": round(float(m.group(1)) * rows1),
            "rows2": rows2, "agree2": round(float(m.group(5)) * rows2),
            "rows2_given1": rows21, "agree2_given1": round(float(m.group(7)) * rows21)}


@torch.no_grad()
def torch_counts(m, windows, k2):
    c = {"layer2": k2, "rows1": 0, "agree1": 0, "rows2": 0, "agree2": 0, "rows2_given1": 0,
         "agree2_given1": 0}
    for w in windows:
        n = len(w)
        if n < 4:
            continue
        logits, d1, d2 = m.forward_drafts(torch.tensor([w]), k2)
        top = logits[0].argmax(-1)                           # [n]
        agreed = d1[0, :n - 2].argmax(-1) == top[1:n - 1]    # rows t = 0..n-3
        ok2 = d2[0, :n - 3].argmax(-1) == top[2:n - 1]       # rows t = 0..n-4
        c["rows1"] += n - 2
        c["agree1"] += int(agreed.sum())
        c["rows2"] += n - 3
        c["agree2"] += int(ok2.sum())
        c["rows2_given1"] += int(agreed[:n - 3].sum())
        c["agree2_given1"] += int((ok2 & agreed[:n - 3]).sum())
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "kjv-moe-tiny"))
    ap.add_argument("--bytes", type=int, default=6000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    m, cfg = export.load_exported(args.model, dtype=torch.float64)
    if cfg["num_nextn_predict_layers"] < 2:
        print(f"FAIL: {args.model} has {cfg['num_nextn_predict_layers']} MTP layer(s), want 2")
        return 1
    with open(os.path.join(args.model, "tokenizer.json"), encoding="utf-8") as f:
        tok = bpe.load_tokenizer_json(f.read())
    with open(os.path.join(args.model, "heldout.txt"), "rb") as f:
        text = f.read()[:args.bytes].decode("utf-8", errors="ignore")
    ids = tok.encode(text)
    windows = [ids[i:i + WINDOW] for i in range(0, len(ids), WINDOW)]
    errors = []
    with tempfile.TemporaryDirectory(prefix="xds_mtp2_") as tmp:
        path = os.path.join(tmp, "text.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        results = {}
        for name, cap, k2 in (("trained", 0, 1), ("reuse", 1, 0)):
            got = engine_counts(os.path.abspath(args.xdeepserve), args.model, path, cap)
            want = torch_counts(m, windows, k2)
            results[name] = want
            print(f"{name}: engine {got}\n{' ' * len(name)}  torch  {want}", flush=True)
            for key, w in want.items():
                g = got[key]
                tol = 0 if key in ("rows1", "rows2", "layer2") else max(2, want["rows1"] // 500)
                if abs(g - w) > tol:
                    errors.append(f"{name} {key}: engine {g}, torch {w} (tolerance {tol})")
        if results["trained"]["agree2"] == results["reuse"]["agree2"]:
            errors.append("the trained layer and reuse give the same draft-2 count")
    for e in errors:
        print("FAIL: " + e)
    print("mtp2 wiring: " + ("FAILED" if errors else "passed"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
