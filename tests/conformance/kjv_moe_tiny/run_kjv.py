#!/usr/bin/python3
"""Conformance on the trained default model models/kjv-moe-tiny, three ways.

  run_kjv.py --xdeepserve BIN [--model DIR] [--ref DIR]

The reference here (README.md: the training recipe's PyTorch forward in float64, stored as
float32) and our float64 oracle are two independent implementations of
docs/design/deepseek_v3_forward.md; the engine (--compute-dtype f32) is a third. Checks:
  - oracle vs reference: main and MTP logits (per row, max error <= 1e-5 x the row's max
    |logit|: both are float64, the reference rounded to float32), main and MTP routing (sets);
  - engine vs reference: logits <= 1e-4 x the row's max |logit|; routing identical.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
import ds3_oracle  # noqa: E402

ORACLE_RTOL = 1e-5
ENGINE_RTOL = 1e-4


def load(ref, name, dtype, shape):
    a = np.fromfile(os.path.join(ref, name), dtype=dtype)
    if a.size != int(np.prod(shape)):
        raise SystemExit(f"{name}: {a.size} values, expected shape {shape}")
    return a.reshape(shape)


def row_errors(got, want):
    """per-row max |got - want| / max |want|."""
    return np.max(np.abs(got - want), axis=1) / np.max(np.abs(want), axis=1)


def check_rows(label, got, want, rtol, errors):
    rel = row_errors(got, want)
    worst = int(np.argmax(rel))
    print(f"{label}: max rel err {rel[worst]:.2e} (row {worst})", flush=True)
    if rel[worst] > rtol:
        bad = np.nonzero(rel > rtol)[0]
        errors.append(f"{label}: {bad.size} rows exceed {rtol}, first row {int(bad[0])} "
                      f"({rel[bad[0]]:.2e}), worst row {worst} ({rel[worst]:.2e})")


def check_routing(label, got, want, errors):
    """got, want: {(layer, row): sorted experts}; every key of want must match."""
    bad = [(k, got.get(k), v) for k, v in sorted(want.items()) if got.get(k) != v]
    print(f"{label}: {len(want) - len(bad)}/{len(want)} (layer, row) expert sets equal", flush=True)
    if bad:
        k, g, w = bad[0]
        errors.append(f"{label}: {len(bad)} differ; first layer {k[0]} row {k[1]}: {g} vs {w}")


def run_engine(xds, model, ids, tmp, r):
    logits_path = os.path.join(tmp, f"seq{r}.f32")
    routing_path = os.path.join(tmp, f"seq{r}.jsonl")
    cmd = [xds, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
           "--max-tokens", "1", "--temperature", "0", "--ignore-eos", "--compute-dtype", "f32",
           "--dump-logits", logits_path, "--dump-routing", routing_path, "--threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"engine failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    logits = np.fromfile(logits_path, dtype="<f4").astype(np.float64)
    routing = {}
    with open(routing_path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                routing[(int(d["layer"]), int(d["row"]))] = sorted(d["experts"])
    return logits, routing


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xdeepserve", help="engine binary (omit: oracle vs reference only)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "kjv-moe-tiny"))
    ap.add_argument("--ref", default=HERE)
    args = ap.parse_args()
    with open(os.path.join(args.ref, "meta.json")) as f:
        meta = json.load(f)
    oracle = ds3_oracle.Oracle(args.model)
    cfg = oracle.cfg
    vocab = cfg.vocab_size
    tokens = np.fromfile(os.path.join(args.ref, "tokens.i32"), dtype="<i4")
    n_seq = int(meta["rows"])
    tokens = tokens.reshape(n_seq, -1)
    t = tokens.shape[1]
    ref_logits = load(args.ref, "logits.f32", "<f4", (n_seq, t, vocab)).astype(np.float64)
    ref_mtp = None
    if os.path.exists(os.path.join(args.ref, "mtp_logits.f32")):
        ref_mtp = load(args.ref, "mtp_logits.f32", "<f4", (n_seq, t - 1, vocab)).astype(np.float64)
    moe_layers = [layer for layer in range(cfg.num_hidden_layers) if cfg.is_moe_layer(layer)]
    k = cfg.num_experts_per_tok
    ref_routing = load(args.ref, "routing.i32", "<i4", (len(moe_layers), n_seq, t, k))
    mtp_layer = cfg.num_hidden_layers
    ref_mtp_routing = None
    if cfg.num_nextn_predict_layers and cfg.is_moe_layer(mtp_layer) and os.path.exists(
            os.path.join(args.ref, "mtp_routing.i32")):
        ref_mtp_routing = load(args.ref, "mtp_routing.i32", "<i4", (n_seq, t - 1, k))

    errors = []
    tmp = tempfile.mkdtemp(prefix="xds_kjv_")
    for r in range(n_seq):
        ids = [int(x) for x in tokens[r]]
        want_routing = {(layer, row): sorted(int(e) for e in ref_routing[i, r, row])
                        for i, layer in enumerate(moe_layers) for row in range(t)}
        res = oracle.run(ids, with_mtp=ref_mtp is not None)
        check_rows(f"seq {r} oracle vs reference logits", res["logits"], ref_logits[r],
                   ORACLE_RTOL, errors)
        oracle_routing = {(layer, row): per[row][0] for layer, per in res["routing"].items()
                          for row in range(t)}
        check_routing(f"seq {r} oracle vs reference routing", oracle_routing, want_routing,
                      errors)
        if ref_mtp is not None:
            check_rows(f"seq {r} oracle vs reference MTP logits", res["mtp_logits"], ref_mtp[r],
                       ORACLE_RTOL, errors)
        if ref_mtp_routing is not None and res["mtp_routing"] is not None:
            got = {(mtp_layer, row): res["mtp_routing"][row][0] for row in range(t - 1)}
            want = {(mtp_layer, row): sorted(int(e) for e in ref_mtp_routing[r, row])
                    for row in range(t - 1)}
            check_routing(f"seq {r} oracle vs reference MTP routing", got, want, errors)
        if args.xdeepserve:
            logits, routing = run_engine(os.path.abspath(args.xdeepserve), args.model, ids, tmp, r)
            if logits.size % vocab or logits.size // vocab < t:
                errors.append(f"seq {r}: engine logits of {logits.size} floats, want >= {t} rows")
                continue
            check_rows(f"seq {r} engine vs reference logits", logits.reshape(-1, vocab)[:t],
                       ref_logits[r], ENGINE_RTOL, errors)
            check_routing(f"seq {r} engine vs reference routing", routing, want_routing, errors)
    for e in errors:
        print("FAIL: " + e)
    print("kjv_moe_tiny conformance: " + ("FAILED" if errors else "passed"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
