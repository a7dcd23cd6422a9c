"""Trains a second MTP layer for an exported model (the paper's P083 recipe: the main model
and MTP layer 1 frozen, layer 2 trained on text the model itself samples at temperature 1).

Usage (from the repository root):
    /usr/bin/python3 tools/train_tiny/train_mtp2.py --xdeepserve build/release/src/cli/xdeepserve
        [--model models/kjv-moe-tiny] [--work build/train_tiny/mtp2] [--steps N] ...

Stages, each resumable (its output in --work is reused when present):
  sample  one sample per training chapter: `xdeepserve generate --model MODEL --prompt P
          --max-tokens 384 --temperature 1 --top-p 1 --top-k 0 --seed S --threads 1`, P = the
          chapter's heading line and the first three words of its verse 1 (e.g.
          "Genesis 1\\n1 In the"), S = the chapter's index among the training chapters;
          -> WORK/samples.jsonl (generate prints text, so the ids are the text encoded again).
  cache   each sample as BOS + encode(P + generated text) (at most max_position_embeddings
          tokens) through the frozen model (model.py, float32, the exported bf16 weights):
          the main final-normed hidden, MTP layer 1's residual outputs and the main model's
          top-K next-token distribution -> WORK/cache.pt.
  train   MTP layer 2 (initialised from a copy of layer 1; embedding and head tied to the
          main model's and frozen) on the chain speculative decoding runs
          (model.DeepseekV3.draft2_residual): its row t at position t+1 is (layer 1's
          residual output at t, token t+2) and predicts token t+3, attending layer 2's
          teacher-forced rows (main hidden at s, token s+1) at positions s <= t. Loss: cross-
          entropy against the main model's distribution of token t+3 (its top-K renormalised;
          the draft is accepted when it matches the main model). -> WORK/ckpt.pt.
  export  the model directory again with num_nextn_predict_layers 2: every existing tensor
          written back with its stored bytes unchanged, plus model.layers.{L+1}.* (BF16; the
          e_score_correction_bias F32; embed_tokens and shared_head.head as copies, as layer
          L has).
  measure teacher-forced acceptance per draft position on heldout.txt by the engine
          (`xdeepserve perplexity --mtp-agreement`), draft 2 by reuse and by the trained
          layer -> WORK/acceptance.json (make_card.py --mtp2 WORK puts it in the card).
Deterministic: fixed seeds; batch k is a function of k only; torch with --threads threads.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train.py
# One OpenMP thread unless told otherwise: on a shared machine with few cores torch's default
# pool makes a step's wall time several times longer (torch.set_num_threads(1) alone does not
# help; docs/benchmarks.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe              # noqa: E402
import corpus           # noqa: E402
import export           # noqa: E402
import model            # noqa: E402
import safetensors_io   # noqa: E402

SEED = 4321
MAX_NEW = 384


def prompt_of(chapter):
    """The chapter's heading line and the first three words of its verse 1."""
    lines = chapter.split("\n")
    return lines[0] + "\n" + " ".join(lines[1].split()[:3])


def generate_command(xds, model_dir, prompt, seed):
    return [xds, "generate", "--model", model_dir, "--prompt", prompt,
            "--max-tokens", str(MAX_NEW), "--temperature", "1", "--top-p", "1", "--top-k", "0",
            "--seed", str(seed), "--threads", "1"]


def sample(args):
    path = os.path.join(args.work, "samples.jsonl")
    done = 0
    if os.path.exists(path):
        with open(path) as f:
            done = sum(1 for _ in f)
    train, _ = corpus.split_chapters(corpus.parse_chapters(corpus.read_bible_dump()))
    train = train[:args.samples] if args.samples else train
    if done >= len(train):
        return path
    t0 = time.time()
    with open(path, "a") as f:
        for i in range(done, len(train)):
            p = prompt_of(train[i])
            r = subprocess.run(generate_command(args.xdeepserve, args.model, p, i), check=True,
                               capture_output=True, text=True)
            f.write(json.dumps({"chapter": i, "seed": i, "prompt": p, "text": r.stdout}) + "\n")
            f.flush()
            if (i + 1) % 50 == 0:
                print(f"sample {i + 1}/{len(train)} {time.time() - t0:.0f} s", flush=True)
    return path


@torch.no_grad()
def build_cache(args, m, cfg, tok):
    path = os.path.join(args.work, "cache.pt")
    if os.path.exists(path):
        return torch.load(path)
    t0 = time.time()
    rows = []
    with open(os.path.join(args.work, "samples.jsonl")) as f:
        samples = [json.loads(line) for line in f]
    for s in samples:
        text = s["text"][:-1] if s["text"].endswith("\n") else s["text"]  # generate's last \n
        ids = tok.encode(s["prompt"] + text, add_bos=True)[:cfg["max_position_embeddings"]]
        if len(ids) < 4:
            continue
        x = torch.tensor([ids])
        emb, hmain, logits = m.main_hidden(x)
        g1 = m.draft1_residual(emb, hmain)
        top = torch.topk(logits[0, 2:].float(), args.top_k, dim=-1)   # rows t+2, t = 0..T-3
        rows.append({"ids": x[0], "hmain": hmain[0].clone(), "g1": g1[0].clone(),
                     "top_ids": top.indices.to(torch.int16),
                     "top_logits": top.values.to(torch.float16),
                     "lse": torch.logsumexp(logits[0, 2:].double(), -1).float()})
    torch.save(rows, path)
    print(f"cache: {len(rows)} samples, {sum(len(r['ids']) for r in rows)} tokens, "
          f"{time.time() - t0:.0f} s", flush=True)
    return rows


def collate(rows, idx, d):
    """Pads the chosen samples to one length: ids [B, T], hmain [B, T, D], g1 [B, T-1, D],
    teacher top ids/probabilities [B, T-2, K] and the valid mask of the draft rows [B, T-2]."""
    t = max(len(rows[i]["ids"]) for i in idx)
    b, k = len(idx), rows[idx[0]]["top_ids"].shape[1]
    ids = torch.ones(b, t, dtype=torch.long)
    hmain = torch.zeros(b, t, d)
    g1 = torch.zeros(b, t - 1, d)
    top_ids = torch.zeros(b, t - 2, k, dtype=torch.long)
    top_p = torch.zeros(b, t - 2, k)
    mask = torch.zeros(b, t - 2, dtype=torch.bool)
    for j, i in enumerate(idx):
        r, n = rows[i], len(rows[i]["ids"])
        ids[j, :n] = r["ids"]
        hmain[j, :n] = r["hmain"]
        g1[j, :n - 1] = r["g1"]
        top_ids[j, :n - 2] = r["top_ids"].long()
        p = torch.softmax(r["top_logits"].float(), -1)   # top-K renormalised
        top_p[j, :n - 2] = p
        mask[j, :n - 2] = True
    return ids, hmain, g1, top_ids, top_p, mask


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def mtp2_model(m1, cfg):
    """A model with two MTP layers: m1's weights, layer L+1 a copy of layer L (m1 may have a
    layer L+1; it is replaced)."""
    cfg2 = dict(cfg, num_nextn_predict_layers=2)
    m2 = model.DeepseekV3(cfg2)
    state = m1.state_dict()
    n = cfg["num_hidden_layers"]
    for k, v in list(state.items()):
        if k.startswith(f"model.layers.{n}."):
            state[k.replace(f"model.layers.{n}.", f"model.layers.{n + 1}.", 1)] = v.clone()
    m2.load_state_dict(state, strict=True)
    return m2, cfg2


def train(args, m, cfg, rows):
    ckpt = os.path.join(args.work, "ckpt.pt")
    layer = m.mtp_layer(1)
    for p in m.parameters():
        p.requires_grad_(False)
    params = [p for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    step, elapsed, history = 0, 0.0, []
    if os.path.exists(ckpt):
        st = torch.load(ckpt)
        layer.load_state_dict(st["layer"])
        opt.load_state_dict(st["opt"])
        step, elapsed, history = st["step"], st["elapsed"], st["history"]
        print(f"resumed at step {step}", flush=True)
    d = cfg["hidden_size"]
    n_rows = len(rows)
    acc = {"loss": 0.0, "agree": 0.0, "n": 0}
    t_last = time.time()
    m.train()
    while step < args.steps:
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        rng = np.random.default_rng([SEED, step])
        idx = rng.choice(n_rows, size=args.batch, replace=False).tolist()
        ids, hmain, g1, top_ids, top_p, mask = collate(rows, idx, d)
        # --rows draft rows t per step (the same for the batch; those past a sample's end
        # masked): the chain's rows are independent given the teacher-forced context.
        n_t = ids.shape[1] - 2
        sel = torch.from_numpy(np.sort(rng.choice(n_t, size=min(args.rows, n_t), replace=False)))
        top_ids, top_p, mask = top_ids[:, sel], top_p[:, sel], mask[:, sel]   # [B, R, ...]
        emb = m.model.embed_tokens(ids)
        g2 = m.draft2_residual(1, emb, hmain, g1, sel)                   # [B, R, D]
        logp = F.log_softmax(m.mtp_head(1, g2).float(), -1)              # [B, R, V]
        ce = -(logp.gather(-1, top_ids) * top_p).sum(-1)                 # [B, R]
        loss = ce[mask].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            agree = (logp.argmax(-1) == top_ids[..., 0])[mask].float().mean().item()
            moe = layer.mlp
            chosen = moe.last_topk.view(args.batch, -1, moe.last_topk.shape[-1])[mask]
            e = moe.gate.e_score_correction_bias.numel()
            load = torch.bincount(chosen.reshape(-1), minlength=e).float()
            moe.gate.e_score_correction_bias += args.bias_rate * torch.sign(load.mean() - load)
        step += 1
        now = time.time()
        elapsed += now - t_last
        t_last = now
        acc["loss"] += loss.item()
        acc["agree"] += agree
        acc["n"] += 1
        if step % args.log_every == 0 or step == args.steps:
            h = {"step": step, "loss": acc["loss"] / acc["n"], "agree": acc["agree"] / acc["n"],
                 "elapsed": elapsed}
            history.append(h)
            acc = {"loss": 0.0, "agree": 0.0, "n": 0}
            balance = (load.max() / load.mean()).item()
            print(f"step {step}/{args.steps} loss {h['loss']:.4f} batch agreement "
                  f"{h['agree']:.3f} lr {lr:.2e} load max/mean {balance:.2f} "
                  f"elapsed {elapsed / 60:.1f} min", flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            tmp = ckpt + ".tmp"
            torch.save({"layer": layer.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "history": history, "args": vars(args)}, tmp)
            os.replace(tmp, ckpt)
    m.eval()
    return history, elapsed


def export_layer(args, m, cfg2):
    """Rewrites MODEL/model.safetensors and config.json with layer L+1 added; every existing
    tensor keeps its stored bytes."""
    st_path = os.path.join(args.out, "model.safetensors")
    tensors, meta = safetensors_io.read(os.path.join(args.model, "model.safetensors"))
    n = cfg2["num_hidden_layers"]
    pre = f"model.layers.{n + 1}."
    tensors = {k: v for k, v in tensors.items() if not k.startswith(pre)}
    state = m.state_dict()
    new = {}
    for k, v in state.items():
        if k.startswith(pre):
            new[k] = (v, "F32" if k.endswith("e_score_correction_bias") else "BF16")
    new[pre + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
    new[pre + "shared_head.head.weight"] = tensors["lm_head.weight"]
    out = dict(tensors)
    out.update(new)
    size = safetensors_io.write(st_path, out, meta)
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    cfg["num_nextn_predict_layers"] = 2
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return size


PPL_LINE = re.compile(r"draft 1 ([0-9.]+) over (\d+) rows; draft 2 \(MTP layer (\d+)(, reused)?\) "
                      r"([0-9.]+) over (\d+) rows, ([0-9.]+) over the (\d+) rows whose draft 1 "
                      r"agreed; tokens per step at k = 2: ([0-9.]+)")


def measure_command(xds, model_dir, mtp_layers):
    return [xds, "perplexity", "--model", model_dir, "--file",
            os.path.join(model_dir, "heldout.txt"), "--mtp-agreement",
            "--speculative-mtp-layers", str(mtp_layers), "--compute-dtype", "f32",
            "--threads", "1"]


def measure(args):
    """Teacher-forced acceptance on heldout.txt by the engine, draft 2 by reuse
    (--speculative-mtp-layers 1) and by the trained layer (0: all) -> WORK/acceptance.json."""
    res = {}
    for name, cap in (("reuse", 1), ("trained", 0)):
        cmd = measure_command(args.xdeepserve, args.out, cap)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        m = PPL_LINE.search(out)
        assert m, out
        res[name] = {"command": " ".join(measure_command("xdeepserve", "models/kjv-moe-tiny", cap)),
                     "draft1": float(m.group(1)), "rows1": int(m.group(2)),
                     "layer2": int(m.group(3)), "draft2": float(m.group(5)),
                     "rows2": int(m.group(6)), "draft2_given1": float(m.group(7)),
                     "rows2_given1": int(m.group(8)), "tokens_per_step_k2": float(m.group(9)),
                     "perplexity_line": out.strip().splitlines()[0]}
        print(f"{name}: {res[name]}", flush=True)
    with open(os.path.join(args.work, "acceptance.json"), "w") as f:
        json.dump(res, f, indent=2)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True, help="the xdeepserve binary")
    ap.add_argument("--model", default="models/kjv-moe-tiny")
    ap.add_argument("--out", default=None, help="model directory to write (default: --model)")
    ap.add_argument("--work", default="build/train_tiny/mtp2")
    ap.add_argument("--samples", type=int, default=0, help="first N training chapters (0: all)")
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rows", type=int, default=64, help="draft rows per sample and step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--stage", choices=["sample", "train", "measure", "all"], default="all")
    args = ap.parse_args()
    args.out = args.out or args.model
    os.makedirs(args.work, exist_ok=True)
    if args.stage == "measure":
        measure(args)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    sample(args)
    if args.stage == "sample":
        return
    m1, cfg = export.load_exported(args.model)
    # A model that has a second layer already (this stage run before) gets it trained afresh
    # from layer L: only layer L+1 is written, so the rest stays as it was.
    assert cfg["num_nextn_predict_layers"] in (1, 2), cfg["num_nextn_predict_layers"]
    with open(os.path.join(args.model, "tokenizer.json"), encoding="utf-8") as f:
        tok = bpe.load_tokenizer_json(f.read())
    rows = build_cache(args, m1, cfg, tok)
    m2, cfg2 = mtp2_model(m1, cfg)
    history, elapsed = train(args, m2, cfg2, rows)
    size = export_layer(args, m2, cfg2)
    report = {"samples": len(rows), "sample_tokens": sum(len(r["ids"]) for r in rows),
              "steps": args.steps, "batch": args.batch, "rows": args.rows, "lr": args.lr,
              "warmup": args.warmup,
              "top_k": args.top_k, "log_every": args.log_every, "train_minutes": elapsed / 60,
              "history": history,
              "generate_command": " ".join(generate_command("xdeepserve", "models/kjv-moe-tiny",
                                                            "P", "S")),
              "model_safetensors_bytes": size}
    with open(os.path.join(args.work, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"exported {args.out}: model.safetensors {size} bytes", flush=True)
    if args.stage == "all":
        measure(args)


if __name__ == "__main__":
    main()
