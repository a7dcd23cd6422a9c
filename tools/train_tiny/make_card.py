"""Writes models/kjv-moe-tiny/README.md (the model card) from the exported model, the
training checkpoint's history and evaluate.py's eval.json, and with --mtp2 the second MTP
layer's stage (train_mtp2.py's report.json and acceptance.json).

Usage: /usr/bin/python3 tools/train_tiny/make_card.py [--model models/kjv-moe-tiny]
       [--work build/train_tiny/run] [--mtp2 build/train_tiny/mtp2] [--update]

--update rewrites only the sections that depend on the model file and the second MTP layer
(the opening, Shape, the second layer's section, Reproduce) in the existing card and keeps the
others as they are: for a second MTP layer added to a model whose training checkpoint is not
at hand (the main model and MTP layer 1 are unchanged, so are their sections).
"""
import argparse
import json
import os
import re
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train.py

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus           # noqa: E402
import safetensors_io   # noqa: E402


def layer_of(name):
    """The layer index of a `model.layers.<i>.` tensor, else -1."""
    return int(name.split(".")[2]) if name.startswith("model.layers.") else -1


def param_groups(tensors, cfg):
    n = cfg["num_hidden_layers"]
    groups = {"embedding + lm_head": 0, "attention (MLA)": 0, "dense MLP (layer 0)": 0,
              "routed experts": 0, "shared experts": 0, "gates + norms": 0,
              "MTP extras (eh_proj, enorm, hnorm, head norm)": 0,
              "MTP copies of embedding and head": 0}
    for name, (arr, _) in tensors.items():
        c = int(np.prod(arr.shape))
        if layer_of(name) >= n and (name.endswith("embed_tokens.weight")
                                    or name.endswith("shared_head.head.weight")):
            groups["MTP copies of embedding and head"] += c
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            groups["embedding + lm_head"] += c
        elif ".self_attn." in name and name.endswith("proj.weight"):
            groups["attention (MLA)"] += c
        elif ".mlp.experts." in name:
            groups["routed experts"] += c
        elif ".mlp.shared_experts." in name:
            groups["shared experts"] += c
        elif ".mlp." in name and ".gate." not in name:
            groups["dense MLP (layer 0)"] += c
        elif any(s in name for s in ("eh_proj", "enorm", "hnorm", "shared_head.norm")):
            groups["MTP extras (eh_proj, enorm, hnorm, head norm)"] += c
        else:
            groups["gates + norms"] += c
    return groups


def fmt_load_table(ev, cfg):
    n = cfg["num_hidden_layers"]
    lines = ["| layer | max/mean | min/mean | tokens per expert (16 experts, k = 2 choices per token) |",
             "| --- | --- | --- | --- |"]
    for i, l in ev["expert_load"].items():
        name = f"{i} (MTP)" if int(i) >= n else i
        lines.append(f"| {name} | {l['max_over_mean']:.2f} | {l['min_over_mean']:.2f} | "
                     f"{' '.join(str(c) for c in l['counts'])} |")
    return "\n".join(lines)


def intro_section(cfg):
    k = cfg["num_nextn_predict_layers"]
    mtp = "one MTP layer" if k == 1 else f"{['no', 'one', 'two', 'three'][k]} MTP layers"
    layers = "MTP layer makes" if k == 1 else "MTP layers make"
    return f"""# kjv-moe-tiny

A tiny DeepSeek-V3-architecture model (MLA with q_lora, one dense layer then MoE layers with
sigmoid `noaux_tc` group-limited routing and a shared expert, {mtp}), trained by this
repository's recipe (`tools/train_tiny/`) on the King James Bible. It is xDeepServe's default
model: it writes text in the style of the KJV, its experts carry a real, uneven load, and its
{layers} meaningful draft tokens. It knows nothing else; it was never trained on chat
turns, so the chat template only frames the prompt.

Files: `config.json` (DeepseekV3 field names), `generation_config.json`, `model.safetensors`
(BF16; every `mlp.gate.e_score_correction_bias` is F32, as in the published checkpoint),
`tokenizer.json` + `tokenizer_config.json` (byte-level BPE, DeepSeek-V3-style chat template),
`heldout.txt` (the held-out split, the perplexity test file).

"""


def shape_section(cfg, tensors, size):
    groups = param_groups(tensors, cfg)
    total = sum(groups.values())
    unique = total - groups["MTP copies of embedding and head"]
    d, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    n_moe = cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    n = cfg["num_hidden_layers"]
    k = cfg["num_nextn_predict_layers"]
    mtp_part = sum(int(np.prod(a.shape)) for name, (a, _) in tensors.items()
                   if layer_of(name) >= n)
    routed_main = sum(int(np.prod(a.shape)) for name, (a, _) in tensors.items()
                      if ".mlp.experts." in name and layer_of(name) < n)
    # main model only (MTP layers excluded), embedding and lm_head included
    active = (total - mtp_part - routed_main
              + n_moe * cfg["num_experts_per_tok"] * 3 * d * inter)
    group_rows = "\n".join(f"| {g} | {v:,} |" for g, v in groups.items())
    mtp_layers = (f"1 MTP layer (index {n}, MoE)" if k == 1
                  else f"{k} MTP layers (indices {n}-{n + k - 1}, MoE)")
    whose = "MTP layer's" if k == 1 else "MTP layers'"
    excluded = "MTP layer" if k == 1 else "MTP layers"
    return f"""## Shape

| field | value |
| --- | --- |
| vocab_size | {cfg['vocab_size']} |
| hidden_size | {d} |
| num_hidden_layers | {n} (layer 0 dense, layers 1-{cfg['num_hidden_layers'] - 1} MoE) + {mtp_layers} |
| attention | MLA, {cfg['num_attention_heads']} heads, q_lora_rank {cfg['q_lora_rank']}, kv_lora_rank {cfg['kv_lora_rank']}, qk_nope_head_dim {cfg['qk_nope_head_dim']}, qk_rope_head_dim {cfg['qk_rope_head_dim']}, v_head_dim {cfg['v_head_dim']} |
| rope | plain (no YaRN), interleaved pairs, rope_theta {cfg['rope_theta']:g}, max_position_embeddings {cfg['max_position_embeddings']} |
| dense MLP | intermediate_size {cfg['intermediate_size']} |
| MoE | {cfg['n_routed_experts']} routed experts (moe_intermediate_size {inter}) + {cfg['n_shared_experts']} shared, top-{cfg['num_experts_per_tok']}, n_group {cfg['n_group']}, topk_group {cfg['topk_group']}, sigmoid scores, noaux_tc, norm_topk_prob {str(cfg['norm_topk_prob']).lower()}, routed_scaling_factor {cfg['routed_scaling_factor']} |
| rms_norm_eps | {cfg['rms_norm_eps']:g} |
| parameters | {total:,} stored ({unique:,} distinct: the {whose} `embed_tokens` and `shared_head.head` are copies of `model.embed_tokens` and `lm_head`, tied in training); about {active:,} active per token in the main model ({excluded} excluded; embedding and lm_head included) |
| model.safetensors | {size:,} bytes |

| part | parameters |
| --- | --- |
{group_rows}

"""


def mtp2_section(mtp2_dir, cfg):
    """The second MTP layer's training and the acceptance per draft position."""
    with open(os.path.join(mtp2_dir, "report.json")) as f:
        rep = json.load(f)
    with open(os.path.join(mtp2_dir, "acceptance.json")) as f:
        acc = json.load(f)
    n = cfg["num_hidden_layers"]
    last = rep["history"][-1]

    def row(name, a):
        return (f"| {name} | {a['draft1']:.3f} | {a['draft2']:.3f} | {a['draft2_given1']:.3f} | "
                f"{1 + a['draft1']:.3f} | {a['tokens_per_step_k2']:.3f} |")
    reuse, trained = acc["reuse"], acc["trained"]
    return f"""## Second MTP layer: acceptance per draft position, k = 2

MTP layer {n + 1} (`model.layers.{n + 1}.*`, `num_nextn_predict_layers` 2) drafts token 2 of a
speculative step (P083). `tools/train_tiny/train_mtp2.py` trained it with the main model and
MTP layer {n} frozen: their tensors are byte for byte those of the one-MTP-layer model, so
every number above still holds. It starts as a copy of layer {n}; its embedding and head are
tied to the main model's (exported as copies, as layer {n}'s). Data: {rep['samples']} texts
the model sampled itself at temperature 1 through the engine,
`{rep['generate_command']}`, prompt P = the heading and the first three words of verse 1 of
training chapter S, S = 0..{rep['samples'] - 1} ({rep['sample_tokens']:,} tokens as
`BOS P text`, the text encoded again). Chain (as `model/speculative_decode.h` runs it): draft
2's row t, at position t+1, is layer {n}'s residual output at t (before `shared_head.norm`)
with the embedding of token t+2; it attends layer {n + 1}'s teacher-forced rows (main hidden at
s, token s+1) at positions 0..t and predicts token t+3. Loss: cross-entropy against the main
model's distribution of token t+3 (its top {rep['top_k']} renormalised), since a draft counts
when it is what the main model would pick. {rep['steps']} steps of {rep['batch']} samples x
{rep['rows']} random rows, AdamW (peak lr {rep['lr']:g}, {rep['warmup']} warm-up steps, cosine to
10%), seed-determined batches; {rep['train_minutes']:.1f} minutes on one thread of 2 shared
cores; last {rep.get('log_every', 10)} steps' loss {last['loss']:.3f}, agreement with the
main model's top token on the batch {last['agree']:.3f}.

Teacher-forced acceptance on `heldout.txt` (the windows above; greedy: a draft is accepted
when it equals the main model's argmax), measured by the engine in f32; reuse: draft 2 runs
layer {n} again, as the paper did with DeepSeek-V3's one layer:

```sh
{trained['command']}   # trained
{reuse['command']}   # reuse
```

| draft 2 by | position 1 | position 2 | position 2 given position 1 | tokens per step, k = 1 | tokens per step, k = 2 |
| --- | --- | --- | --- | --- | --- |
{row(f"reuse of layer {n}", reuse)}
{row(f"trained layer {n + 1}", trained)}

Position 1: the MTP agreement above ({reuse['rows1']:,} rows). Position 2: for every window
row t = 0..n-4, draft 2 (built from the true token t+2) against the main model's argmax at t+2
({reuse['rows2']:,} rows); given position 1: over the rows whose draft 1 agreed (the
acceptance rate of position 2 in a speculative step). Tokens per step: k = 1, 1 + position 1;
k = 2, the mean over the position-2 rows of 1 + [draft 1 accepted] + [drafts 1 and 2 accepted].
Position-2 acceptance given position 1 rises by
{trained['draft2_given1'] - reuse['draft2_given1']:+.3f} with the trained layer
({trained['draft2'] - reuse['draft2']:+.3f} over all rows).

"""


def reproduce_section(with_mtp2):
    mtp2, card_flags = "", ""
    if with_mtp2:
        mtp2 = ("/usr/bin/python3 tools/train_tiny/train_mtp2.py --xdeepserve BIN --samples 750 "
                "--steps 400\n")
        card_flags = " --mtp2 build/train_tiny/mtp2"
    return f"""## Reproduce

```sh
/usr/bin/python3 tools/train_tiny/train.py          # ~40-60 min on 2 cores, resumable
/usr/bin/python3 tools/train_tiny/export.py
/usr/bin/python3 tools/train_tiny/evaluate.py
/usr/bin/python3 tools/train_tiny/conformance.py
{mtp2}/usr/bin/python3 tools/train_tiny/make_card.py{card_flags}
```
License: the KJV text is in the public domain (Debian's bible-kjv-text); the weights are
released with this repository.
"""


def splice(card, sections):
    """card with the `## ` sections whose heading starts with a key of `sections` replaced by
    its value (the text before the first `## ` has key ""); a key not in the card is inserted
    after the section named by sections["after " + key]."""
    blocks = re.split(r"(?m)^(?=## )", card)

    def key_of(block):
        return next((k for k in sections if not k.startswith("after ") and
                     (block.startswith(k) if k else not block.startswith("## "))), None)
    present = {key_of(b) for b in blocks}
    out = []
    for b in blocks:
        key = key_of(b)
        out.append(sections[key] if key is not None else b)
        for k, v in sections.items():
            if k.startswith("after ") and k[6:] not in present and b.startswith(v):
                out.append(sections[k[6:]])
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/kjv-moe-tiny")
    ap.add_argument("--work", default="build/train_tiny/run")
    ap.add_argument("--mtp2", default=None, help="train_mtp2.py's --work (second MTP layer)")
    ap.add_argument("--update", action="store_true",
                    help="rewrite only the model-file and second-layer sections of the card")
    args = ap.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    tensors, _ = safetensors_io.read(os.path.join(args.model, "model.safetensors"))
    size = os.path.getsize(os.path.join(args.model, "model.safetensors"))
    sections = {"": intro_section(cfg), "## Shape": shape_section(cfg, tensors, size),
                "## Reproduce": reproduce_section(args.mtp2 is not None)}
    if args.mtp2:
        sections["## Second MTP layer"] = mtp2_section(args.mtp2, cfg)
        sections["after ## Second MTP layer"] = "## MTP top-1 agreement"
    path = os.path.join(args.model, "README.md")
    if args.update:
        with open(path, encoding="utf-8") as f:
            card = splice(f.read(), sections)
        with open(path, "w", encoding="utf-8") as f:
            f.write(card)
        print(f"updated {path}")
        return
    with open(os.path.join(args.work, "eval.json")) as f:
        ev = json.load(f)
    st = torch.load(os.path.join(args.work, "ckpt.pt"))
    targs, hist = st["args"], st["history"]
    n_train_tokens = int(np.load(os.path.join(args.work, "train_ids.npy"), mmap_mode="r").shape[0])
    biases = {k: safetensors_io.to_float32(*v) for k, v in tensors.items()
              if k.endswith("e_score_correction_bias")}
    bias_lines = "\n".join(f"| {k.split('.')[2]} | {float(b.min()):+.3f} | {float(b.max()):+.3f} |"
                           for k, b in sorted(biases.items(), key=lambda kv: int(kv[0].split('.')[2])))
    last = hist[-1]
    tokens_seen = st["step"] * targs["batch"] * targs["seq"]
    held_chapters = corpus.HELDOUT_EVERY
    samples = "\n\n".join(
        f"**{s['mode']}**, prompt `{s['prompt']!r}`:\n\n```text\n{s['text']}\n```"
        for s in ev["samples"])

    card = f"""## Corpus and split

The King James Version as shipped by Debian 12's `bible-kjv-text` 4.38 (`/usr/lib/bible.data`,
printed by the `bible` program of the `bible-kjv` package:
`bible -l100000 Genesis1:1-Revelation22:21`). Each chapter becomes its heading line
(`Genesis 1`) followed by one line per verse, `N text` (e.g. `1 In the beginning God created
the heaven and the earth.`), each line ending in `\\n`. The 1189 chapters are numbered 0..1188
in canonical order (Genesis 1 = 0); **chapter k is held out iff k mod {held_chapters} = {held_chapters - 1}**
(59 chapters: Genesis 20, Genesis 40, Exodus 10, ...), the other 1130 are for training.
`heldout.txt` is the held-out chapters joined by one blank line (`\\n`), {os.path.getsize(os.path.join(args.model, 'heldout.txt')):,} bytes.

## Tokenizer

Byte-level BPE with {cfg['vocab_size']} ids, trained by the recipe on the training chapters:
ids 0-3 are the special tokens `<｜begin▁of▁sentence｜>` (BOS), `<｜end▁of▁sentence｜>` (EOS),
`<｜User｜>`, `<｜Assistant｜>`; ids 4-259 the 256 bytes (byte b = id 4 + b); ids 260-4095 the
merges in the order learned. Pre-tokenizer: Split with the GPT-2 pattern (Isolated), then
ByteLevel (no prefix space, no regex); decoder ByteLevel; the post-processor adds BOS
(`add_bos_token` true). The npm package `@huggingface/tokenizers` (an independent
implementation) loads these files and gives the same ids as the recipe's encoder on the whole
held-out file and on the Unicode test strings of `tools/train_tiny/check_tokenizer.py`.
The training chapters are encoded as `BOS chapter EOS`, concatenated:
{n_train_tokens:,} tokens.

## Training

`/usr/bin/python3 tools/train_tiny/train.py` (see `tools/train_tiny/README.md`), seed 1234:
{st['step']} steps of {targs['batch']} random windows x {targs['seq']} tokens
({tokens_seen:,} tokens, {tokens_seen / n_train_tokens:.2f} epochs), AdamW (betas 0.9/0.95,
weight decay 0.1 on matrices), peak learning rate {targs['lr']:g}, {targs['warmup']} warm-up
steps, then cosine towards 10% over a {targs['steps']}-step horizon until step
{targs.get('anneal_from')}, then linear to 10% at step {st['step']} (the run was shortened in flight to fit
the time budget; the flags reproduce it exactly), gradient clipping 1.0, float32 on CPU with
{targs['threads']} threads.
Loss = main next-token cross-entropy + {targs['mtp_weight']} x MTP (token t+2) cross-entropy.
Aux-loss-free balancing: after every step, per MoE layer, bias_e += {targs['bias_rate']:g} x
sign(mean load - load_e) over the batch's choices; the bias enters the selection only.

Training time: **{st['elapsed'] / 60:.1f} minutes** on 2 shared CPU cores.
Final losses (mean over the last {targs['log_every']} steps): **main {last['main']:.3f}, MTP {last['mtp']:.3f}**.

Final correction biases:

| layer | min | max |
| --- | --- | --- |
{bias_lines}

## Held-out perplexity: **{ev['perplexity']:.2f}**

Definition (the one `xdeepserve perplexity --model models/kjv-moe-tiny --file models/kjv-moe-tiny/heldout.txt` implements):

1. Tokens: the tokenizer's ids for the UTF-8 bytes of the file, **no BOS or EOS added**
   (HF: `encode(text, add_special_tokens=False)`): {ev['heldout_tokens']:,} tokens.
2. Windows: consecutive non-overlapping slices `tokens[k*{ev['window']}:(k+1)*{ev['window']}]`, W = {ev['window']}; the last
   one may be shorter and counts if it has at least 2 tokens. Each window is evaluated on its
   own, from rope position 0, with no state carried over from the previous window.
3. In each window of n tokens, positions i = 1..n-1 are predicted from tokens 0..i-1 of the
   same window ({ev['predicted_tokens']:,} predicted tokens in all).
4. Perplexity = exp(sum of -ln softmax(logits)[token_i] / number of predicted tokens), with
   the logits of the main model (not MTP) over the full vocabulary.

Measured with the exported BF16 weights widened to float32 and the recipe's float32 PyTorch
forward: mean NLL {ev['mean_nll']:.4f} nats, perplexity {ev['perplexity']:.3f}; next-token top-1
accuracy {ev['main_top1_accuracy']:.3f}.

## MTP top-1 agreement: **{ev['mtp_top1_agreement']:.3f}**

Over the same windows, for every t = 0..n-3: the MTP layer's row t (main final-normed hidden
at t + embedding of token t+1, rope position t) predicts token t+2; so does the main model's
logits at position t+1 given the true token t+1. Agreement = fraction of rows where the two
argmaxes (ties to the lower id) are the same token. This is the greedy acceptance rate of a
one-token MTP draft under teacher forcing. The MTP head's own top-1 accuracy against the
true token t+2 is {ev['mtp_top1_accuracy']:.3f}.

## Expert load on held-out text

Chosen (token, expert) pairs per expert over all held-out window positions (for the MTP
layer, over its rows); max/mean = 1 would be perfectly even.

{fmt_load_table(ev, cfg)}

## Sample generations (PyTorch, exported weights; BOS + prompt; at most 60 new tokens)

{samples}

Limitations: less than one epoch on 2 shared CPU cores, so the model is weak: it has the
KJV's vocabulary, verse layout and cadence, but little sense; greedy decoding soon falls into
loops ("and the LORD, and the LORD"); sampling reads better. Layer 3 and the MTP layer each
route about a quarter of all choices to one expert (the bias moved 1e-3 per step for only
{st['step']} steps, not enough to even that out), a real imbalance for load-balancing demonstrations.

"""
    card = splice(sections[""] + sections["## Shape"] + card + sections["## Reproduce"], sections)
    with open(path, "w", encoding="utf-8") as f:
        f.write(card)
    print(f"wrote {os.path.join(args.model, 'README.md')}")


if __name__ == "__main__":
    main()
