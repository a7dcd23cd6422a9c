"""Trains kjv-moe-tiny: corpus -> BPE tokenizer -> DeepSeek-V3 model with MTP.

Usage (from the repository root):
    /usr/bin/python3 tools/train_tiny/train.py [--work build/train_tiny] [--steps N]

Deterministic (fixed seeds; batch k is a function of k only) and resumable: a checkpoint is
written to WORK/ckpt.pt every --ckpt-every steps and picked up on restart. Prints one progress
line per --log-every steps (also appended to WORK/train.log).
"""
import argparse
import json
import math
import os
import sys
import time

# Idle OpenMP threads sleep instead of spinning: on an oversubscribed machine spinning
# workers steal the time their partner needs (steps run several times faster under load
# without them: docs/benchmarks.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe      # noqa: E402
import corpus   # noqa: E402
import model    # noqa: E402

SEED = 1234


def prepare(work, vocab_size):
    """Writes WORK/merges.json, WORK/train_ids.npy, WORK/heldout.txt (idempotent)."""
    os.makedirs(work, exist_ok=True)
    ids_path = os.path.join(work, "train_ids.npy")
    merges_path = os.path.join(work, "merges.json")
    if os.path.exists(ids_path) and os.path.exists(merges_path):
        with open(merges_path) as f:
            return bpe.Tokenizer([tuple(m) for m in json.load(f)]), np.load(ids_path)
    chapters = corpus.parse_chapters(corpus.read_bible_dump())
    train, held = corpus.split_chapters(chapters)
    merges = bpe.train_bpe(train, vocab_size)
    tok = bpe.Tokenizer(merges)
    stream = []
    for ch in train:                        # BOS chapter-text EOS, chapters in order
        stream.append(tok.bos_id)
        stream.extend(tok.encode(ch))
        stream.append(tok.eos_id)
    ids = np.asarray(stream, dtype=np.int32)
    with open(os.path.join(work, "heldout.txt"), "w") as f:
        f.write(corpus.heldout_text(held))
    with open(merges_path + ".tmp", "w") as f:
        json.dump([list(m) for m in merges], f)
    np.save(ids_path, ids)
    os.replace(merges_path + ".tmp", merges_path)
    return tok, ids


def batch_for_step(ids, step, batch, seq):
    """Window starts for step `step`: uniform over the stream, seeded by (SEED, step)."""
    rng = np.random.default_rng([SEED, step])
    starts = rng.integers(0, len(ids) - seq - 1, size=batch)
    x = np.stack([ids[s:s + seq + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x)


def lr_at(step, steps, peak, warmup, anneal_from=None, anneal_steps=0, floor_frac=0.1):
    """Linear warm-up, then cosine from peak to floor_frac*peak over `steps`. With
    anneal_from set, from that step on the rate instead falls linearly from its cosine value
    there to the floor in anneal_steps steps (training then ends at anneal_from +
    anneal_steps): the way to shorten a run in flight without changing its past."""
    def cosine(s):
        if s < warmup:
            return peak * (s + 1) / warmup
        p = (s - warmup) / max(1, steps - warmup)
        return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * p)))
    if anneal_from is None or step < anneal_from:
        return cosine(step)
    f = (step - anneal_from + 1) / anneal_steps
    return cosine(anneal_from) * (1 - f) + peak * floor_frac * f


def losses(m, x):
    """Main next-token loss and MTP (t+2) loss on a [B, T+1] batch."""
    inp, tgt = x[:, :-1], x[:, 1:]
    logits, mtp_logits = m(inp)
    v = logits.shape[-1]
    main = F.cross_entropy(logits.reshape(-1, v), tgt.reshape(-1))
    # mtp_logits[:, t] predicts inp[t+2] = x[t+2]; rows t = 0..T-2 -> targets x[2..T].
    mtp = F.cross_entropy(mtp_logits.reshape(-1, v), x[:, 2:].reshape(-1))
    return main, mtp


def update_bias(m, rate):
    """Aux-loss-free balancing: bias_e += rate * sign(mean_load - load_e), per MoE layer."""
    loads = []
    with torch.no_grad():
        for _, moe in m.moe_layers():
            e = moe.gate.e_score_correction_bias.numel()
            load = torch.bincount(moe.last_topk.reshape(-1), minlength=e).float()
            moe.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)
            loads.append((load.max() / load.mean()).item())
    return loads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="build/train_tiny")
    ap.add_argument("--steps", type=int, default=640)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--anneal-from", type=int, default=175)
    ap.add_argument("--anneal-steps", type=int, default=225)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--log-every", type=int, default=5)
    args = ap.parse_args()
    last_step = args.steps
    if args.anneal_from is not None:
        last_step = args.anneal_from + args.anneal_steps
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)

    cfg = model.default_config()
    tok, ids = prepare(args.work, cfg["vocab_size"])
    assert len(tok) == cfg["vocab_size"]
    cfg["_init_seed"] = SEED
    m = model.DeepseekV3(cfg)
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    ckpt = os.path.join(args.work, "ckpt.pt")
    step, elapsed, history = 0, 0.0, []
    if os.path.exists(ckpt):
        st = torch.load(ckpt)
        m.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed, history = st["step"], st["elapsed"], st["history"]
        print(f"resumed at step {step} ({elapsed:.0f} s trained)", flush=True)
    log = open(os.path.join(args.work, "train.log"), "a")
    print(f"params {m.num_params()} train tokens {len(ids)} steps {args.steps} "
          f"batch {args.batch}x{args.seq}", flush=True)
    print(f"last step {last_step}", flush=True)
    m.train()
    t_last = time.time()
    acc = {"main": 0.0, "mtp": 0.0, "n": 0}
    while step < last_step:
        lr = lr_at(step, args.steps, args.lr, args.warmup, args.anneal_from, args.anneal_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_for_step(ids, step, args.batch, args.seq)
        main_l, mtp_l = losses(m, x)
        loss = main_l + args.mtp_weight * mtp_l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        loads = update_bias(m, args.bias_rate)
        step += 1
        now = time.time()
        elapsed += now - t_last
        t_last = now
        acc["main"] += main_l.item()
        acc["mtp"] += mtp_l.item()
        acc["n"] += 1
        if step % args.log_every == 0 or step == last_step:
            mm, mt = acc["main"] / acc["n"], acc["mtp"] / acc["n"]
            history.append({"step": step, "main": mm, "mtp": mt, "elapsed": elapsed})
            acc = {"main": 0.0, "mtp": 0.0, "n": 0}
            rate = step * args.batch * args.seq / elapsed
            eta = (last_step - step) * elapsed / step
            line = (f"step {step}/{last_step} loss {mm:.3f} mtp {mt:.3f} lr {lr:.2e} "
                    f"load max/mean {' '.join(f'{v:.2f}' for v in loads)} "
                    f"{rate:.0f} tok/s elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min")
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        if step % args.ckpt_every == 0 or step == last_step:
            tmp = ckpt + ".tmp"
            torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "history": history, "config": cfg,
                        "args": vars(args)}, tmp)
            os.replace(tmp, ckpt)
    print(f"done: {step} steps, {elapsed / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
