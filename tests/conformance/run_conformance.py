#!/usr/bin/python3
"""Conformance of `xdeepserve generate --compute-dtype f32` against the float64 oracle.

  run_conformance.py --xdeepserve PATH [--case NAME ...] [--keep DIR] [--list]

Per case: make a tiny random checkpoint (`xdeepserve mkmodel`, or the independent
oracle/make_tiny.py writer), pick a seed and prompt with the oracle alone such that every
discrete decision (routing: k-th vs (k+1)-th biased score and topk_group-th vs next group
score; greedy: top-1 vs top-2 logit) has a safe margin, then run the engine greedily and
check against the oracle run on prompt + generated ids:
  - logits: max |engine - oracle| over each row <= 1e-4 * max |oracle row|;
  - greedy tokens: the oracle's argmax at each step is the token the engine produced;
  - routing: the chosen experts per (MoE layer, row) are identical.
The engine decodes with its KV cache while the oracle recomputes everything, so this also
checks "KV-cache decode equals full recompute". Variants (chunked prefill, batching) rerun
the engine on the same checkpoint and prompt and must match the oracle and the one-shot run.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "oracle"))
import ds3_oracle  # noqa: E402
import glm4_oracle  # noqa: E402
import qwen3_oracle  # noqa: E402

LOGIT_RTOL = 1e-4          # contract: per-row max error relative to the row's max |logit|
ARGMAX_MARGIN = 1e-3       # required top-1 minus top-2, relative to the row's max |logit|
ROUTING_MARGIN = 5e-4      # required gap of biased scores (scores are O(1))
PROMPT_LEN = 12
MAX_TOKENS = 8
SEEDS = range(1, 21)
PROMPTS_PER_SEED = 6

# A case: how to make the checkpoint, and which engine variants to run on it.
# maker "engine": xdeepserve mkmodel with these args; "python": oracle/make_tiny.py.
CASES = [
    {"name": "bf16", "maker": "engine", "args": ["--preset", "tiny"],
     "variants": ["oneshot", "chunked", "absorbed", "expanded", "chunked_absorbed", "threads2",
                  "batch"]},
    # 37 prompt tokens + 8: crosses KV blocks (16 tokens) in prefill, chunk edges straddle them.
    {"name": "bf16_long", "maker": "engine", "args": ["--preset", "tiny"], "prompt_len": 37,
     "variants": ["oneshot", "chunked", "expanded", "chunked_absorbed"]},
    # 70 prompt tokens: prefill linears take the engine's many-token (sgemm) path.
    {"name": "fp8_prefill70", "maker": "engine",
     "args": ["--preset", "tiny", "--dtype", "fp8"], "prompt_len": 70,
     "variants": ["oneshot", "chunked_absorbed"]},
    {"name": "fp8_2shards", "maker": "engine",
     "args": ["--preset", "tiny", "--dtype", "fp8", "--shards", "2"], "variants": ["oneshot"]},
    # F16 weights: panels of the checkpoint's fp16 elements (vcvtph2ps in the kernels).
    {"name": "f16", "maker": "engine", "args": ["--preset", "tiny", "--dtype", "f16"],
     "variants": ["oneshot", "absorbed", "expanded"]},
    {"name": "yarn", "maker": "engine", "args": ["--preset", "tiny", "--yarn"],
     "variants": ["oneshot", "chunked"]},
    {"name": "no_q_lora", "maker": "engine", "args": ["--preset", "tiny", "--no-q-lora"],
     "variants": ["oneshot"]},
    # A checkpoint written by an independent writer: the engine's loader must read it too.
    {"name": "indep_fp8_yarn", "maker": "python",
     "args": ["--dtype", "fp8", "--shards", "2", "--yarn"], "variants": ["oneshot"]},
    {"name": "indep_odd_fp8", "maker": "python",
     "args": ["--shape", "odd", "--dtype", "fp8", "--shards", "3"],
     "variants": ["oneshot", "chunked"]},
    {"name": "indep_odd_no_q_lora_bf16", "maker": "python",
     "args": ["--shape", "odd", "--no-q-lora"], "variants": ["oneshot"]},
    {"name": "indep_odd_f16", "maker": "python", "args": ["--shape", "odd", "--dtype", "f16"],
     "variants": ["oneshot", "chunked"]},
    {"name": "indep_softmax_greedy", "maker": "python", "args": ["--gating", "softmax"],
     "variants": ["oneshot"]},
    # W8A8 (compressed-tensors): an RTN copy of the shipped model (mkmodel --from
    # --weights-int8; the seed only picks the prompt). The oracle runs the quantized linears
    # in the stated integer arithmetic (ds3_oracle.w8a8_linear), the rest in float64. Its
    # activations differ from the engine's fp32 ones by ~1e-7 relative, which can move an
    # element across a rounding boundary of the per-token quantization (one step of sx · w,
    # 1-3e-3 of a row's largest logit here where the absorbed attention's sums run in another
    # order; the one-shot run agrees to ~1e-6): hence 5e-3 rather than 1e-4, far below what a
    # wrong scale, offset or packing gives.
    # (A random model amplifies such a step into percents of its logits: the trained one.)
    {"name": "w8a8_kjv", "maker": "engine",
     "args": ["--from", os.path.join(HERE, "..", "..", "models", "kjv-moe-tiny"),
              "--weights-int8"],
     "logit_rtol": 5e-3, "argmax_margin": 1e-2, "routing_margin": 1e-3,
     "drop_files": ["tokenizer.json", "tokenizer_config.json"],  # generate prints ids
     "variants": ["oneshot", "chunked", "absorbed", "expanded"]},
    # The same copy with lm_head and kv_b_proj in int8 too (--int8-head-and-kv-b), against a
    # float64 oracle that multiplies by those dequantized weights (q · scale) and runs the
    # other int8 linears in the integer arithmetic. The engine rounds the inputs of these
    # products to int8 per token (lm_head, the expanded kv_b_proj) or per token and head
    # (the absorbed W_UK on q_nope · scale, W_UV on the attention's latent output): each input
    # element moves by up to half a step, absmax / 254, an error of ~sqrt(n/3)/254 of a
    # product's scale over n columns that does not cancel as a boundary flip does. Measured
    # worst rows 1.4e-2 (one-shot, expanded), 1.2e-2 (absorbed), 9e-3 (chunked): 2e-2 leaves
    # ~1.5x of room; a wrong scale (a missing fold of the W_UK scales into q) moves logits by
    # O(1).
    {"name": "w8a8_head_kv_b_kjv", "maker": "engine",
     "args": ["--from", os.path.join(HERE, "..", "..", "models", "kjv-moe-tiny"),
              "--weights-int8", "--int8-head-and-kv-b"],
     "oracle_dequantized": ["kv_b_proj.weight", "lm_head.weight", "shared_head.head.weight"],
     "logit_rtol": 2e-2, "argmax_margin": 3e-2, "routing_margin": 1e-3,
     "drop_files": ["tokenizer.json", "tokenizer_config.json"],
     "variants": ["oneshot", "chunked", "absorbed", "expanded"]},
]

# The other members of the DeepSeek module family (--suite families): Kimi K2 and DeepSeek-V2 /
# V2-Lite, from mkmodel --arch and from the independent writer, covering q_lora null and set,
# greedy and group_limited_greedy, norm_topk_prob true and false, routed_scaling_factor 1,
# 2.5, 2.827 and 16, and both YaRN variants' mscale.
FAMILY_CASES = [
    {"name": "v2_group_limited_x16", "maker": "engine",
     "args": ["--preset", "tiny", "--arch", "deepseek_v2"],
     "variants": ["oneshot", "chunked", "absorbed", "expanded"]},
    {"name": "v2_lite_greedy_yarn", "maker": "engine",
     "args": ["--preset", "tiny", "--arch", "deepseek_v2", "--no-q-lora", "--yarn"],
     "variants": ["oneshot", "chunked"]},
    {"name": "kimi_k2", "maker": "engine", "args": ["--preset", "tiny", "--arch", "kimi_k2"],
     "variants": ["oneshot", "chunked"]},
    {"name": "indep_v2_group_limited_no_q_lora_norm_x16", "maker": "python",
     "args": ["--family", "deepseek_v2", "--gating", "group_limited_greedy", "--no-q-lora",
              "--norm-topk-prob", "true", "--scaling", "16", "--yarn"],
     "variants": ["oneshot"]},
    {"name": "indep_v2_greedy_q_lora_x2.5", "maker": "python",
     "args": ["--family", "deepseek_v2", "--gating", "greedy", "--scaling", "2.5"],
     "variants": ["oneshot"]},
    {"name": "indep_kimi_k2_fp8", "maker": "python",
     "args": ["--family", "kimi_k2", "--dtype", "fp8", "--shards", "2"],
     "variants": ["oneshot"]},
]
for _case in FAMILY_CASES:
    _case["suite"] = "families"
CASES += FAMILY_CASES
# Qwen3-MoE (family "qwen3_moe", --family qwen3_moe): checkpoints from
# oracle/make_tiny_qwen3.py (its flags in "args"), checked against oracle/qwen3_oracle.py.
# Defaults there: hidden 64, 4 query heads / 2 KV heads of head_dim 24 (not 64 / 4), 8 experts,
# top-2, norm_topk_prob, untied, 3 layers.
QWEN3_CASES = [
    {"name": "qwen3_gqa2", "maker": "qwen3", "args": [],
     "variants": ["oneshot", "chunked", "threads2", "batch"]},
    # GQA 4:1, tied head, unnormalised top-k, every other layer dense (sparse step 2).
    {"name": "qwen3_gqa4_tied_sparse", "maker": "qwen3",
     "args": ["--heads", "8", "--kv-heads", "2", "--head-dim", "16", "--tied", "--no-norm-topk",
              "--sparse-step", "2", "--layers", "4"],
     "variants": ["oneshot", "chunked"]},
    # MHA (1:1), head_dim = hidden / heads, a dense first layer by mlp_only_layers, YaRN,
    # three shards; 37 prompt tokens cross the 16-row KV blocks and the 16-token tiles.
    {"name": "qwen3_mha_yarn_3shards", "maker": "qwen3",
     "args": ["--heads", "4", "--kv-heads", "4", "--head-dim", "16", "--mlp-only", "0",
              "--yarn", "--shards", "3"], "prompt_len": 37,
     "variants": ["oneshot", "chunked"]},
    # mkmodel --arch qwen3_moe --preset tiny: the engine's own writer (head_dim 32 ≠ 64 / 4,
    # a dense layer 0 by mlp_only_layers), read by the oracle's independent reader.
    {"name": "qwen3_mkmodel_tiny", "maker": "engine",
     "args": ["--arch", "qwen3_moe", "--preset", "tiny"], "variants": ["oneshot", "chunked"]},
    # F32 weights, top-1 with norm_topk_prob (weight 1, as transformers normalises it).
    {"name": "qwen3_f32_top1", "maker": "qwen3", "args": ["--dtype", "f32", "--top-k", "1"],
     "variants": ["oneshot"]},
]
for _case in QWEN3_CASES:
    _case["family"] = "qwen3_moe"
CASES += QWEN3_CASES
# GLM-4.5 (family "glm4_moe", --family glm4_moe): checkpoints from oracle/make_tiny_glm4.py
# (its flags in "args"), checked against oracle/glm4_oracle.py. Defaults there: hidden 64, 4
# query / 2 KV heads of head_dim 24 (not 64 / 4) with 12 rotated dims, q/k/v biases, q/k
# norm, 8 experts in 2 groups keeping 1, top-2, normalised, × 2.5, one shared expert, layer 0
# dense, one MTP layer, untied.
GLM4_CASES = [
    {"name": "glm4_bias_qknorm", "maker": "glm4", "args": [],
     "variants": ["oneshot", "chunked", "threads2"]},
    # GLM-4.5-Air's attention (no q/k norm), no biases, GQA 4:1, 4 of 16 dims rotate, two
    # dense layers, top-3 over one group, two shards; 37 prompt tokens cross the KV blocks.
    {"name": "glm4_air_gqa4_partial", "maker": "glm4",
     "args": ["--heads", "8", "--kv-heads", "2", "--head-dim", "16", "--partial", "0.25",
              "--no-qk-norm", "--no-bias", "--groups", "1,1", "--top-k", "3", "--layers", "4",
              "--first-dense", "2", "--shards", "2"], "prompt_len": 37,
     "variants": ["oneshot", "chunked"]},
    # MHA, the whole head rotates, top-1 with norm_topk_prob (weight 1, then × 2.5), two
    # shared experts, 4 groups keeping 2, tied head, F32 weights.
    {"name": "glm4_mha_full_rotary_top1_tied", "maker": "glm4",
     "args": ["--heads", "4", "--kv-heads", "4", "--head-dim", "16", "--partial", "1.0",
              "--top-k", "1", "--shared", "2", "--tied", "--dtype", "f32", "--groups", "4,2"],
     "variants": ["oneshot"]},
    # Unnormalised top-k (weights = scores × 2.5).
    {"name": "glm4_unnormalised", "maker": "glm4", "args": ["--no-norm-topk"],
     "variants": ["oneshot"]},
    # mkmodel --arch glm4_moe --preset tiny: the engine's own writer (head_dim 32 ≠ 64 / 4),
    # read by the oracle's independent reader.
    {"name": "glm4_mkmodel_tiny", "maker": "engine",
     "args": ["--arch", "glm4_moe", "--preset", "tiny"], "variants": ["oneshot", "chunked"]},
    {"name": "glm4_mkmodel_air", "maker": "engine",
     "args": ["--arch", "glm4_moe", "--preset", "tiny", "--no-qk-norm", "--no-attention-bias",
              "--partial-rotary-factor", "0.25"], "variants": ["oneshot"]},
]
for _case in GLM4_CASES:
    _case["family"] = "glm4_moe"
CASES += GLM4_CASES


def make_oracle(case, model):
    if case.get("family") == "qwen3_moe":
        return qwen3_oracle.Oracle(model)
    if case.get("family") == "glm4_moe":
        return glm4_oracle.Oracle(model)
    return ds3_oracle.Oracle(model, dequantized=case.get("oracle_dequantized", ()))


# Engine runs: extra generate args, and the generate --help flag each needs.
VARIANTS = {
    "oneshot": {"args": [], "needs": None},
    "chunked": {"args": ["--prefill-chunk", "3"], "needs": "--prefill-chunk"},
    "absorbed": {"args": ["--attention", "absorbed"], "needs": "--attention"},
    "expanded": {"args": ["--attention", "expanded"], "needs": "--attention"},
    "chunked_absorbed": {"args": ["--prefill-chunk", "5", "--attention", "absorbed"],
                         "needs": "--prefill-chunk"},
    "threads2": {"args": ["--threads", "2"], "needs": "--threads"},
    "batch": {"args": None, "needs": "BATCH"},  # filled in by detect_batch_flag
}


class Failure(Exception):
    pass


def run(cmd, timeout=600):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise Failure(f"command failed ({p.returncode}): {' '.join(cmd)}\n"
                      f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return p.stdout, time.monotonic() - t0


def help_text(xds, sub):
    p = subprocess.run([xds] + ([sub] if sub else []) + ["--help"], capture_output=True,
                       text=True)
    return p.stdout + p.stderr


THREADS = []  # ["--threads", "1"] when generate has the option (frugal, deterministic base)
PYTHON_MAKER = False  # --python-maker: every case uses make_tiny.py (no mkmodel needed)


def make_checkpoint(xds, case, seed, out):
    if case["maker"] == "qwen3":
        cmd = [sys.executable, os.path.join(HERE, "oracle", "make_tiny_qwen3.py"), "--out", out,
               "--seed", str(seed)] + case["args"]
    elif case["maker"] == "glm4":
        cmd = [sys.executable, os.path.join(HERE, "oracle", "make_tiny_glm4.py"), "--out", out,
               "--seed", str(seed)] + case["args"]
    elif case["maker"] == "engine" and not PYTHON_MAKER:
        cmd = [xds, "mkmodel", "--out", out, "--seed", str(seed)] + case["args"]
    else:
        args = [a for a in case["args"] if a not in ("--preset", "tiny")]
        cmd = [sys.executable, os.path.join(HERE, "oracle", "make_tiny.py"), "--out", out,
               "--seed", str(seed)] + args
    run(cmd)
    for name in case.get("drop_files", []):
        os.remove(os.path.join(out, name))


def argmax(row, vocab):
    """Greedy choice: ids < vocab only, ties to the lower id."""
    return int(np.argmax(row[:vocab]))


def argmax_margin(row, vocab):
    top = np.sort(row[:vocab])[::-1]
    return (top[0] - top[1]) / max(np.max(np.abs(row)), 1e-30)


def oracle_greedy(oracle, prompt, n):
    """Greedy continuation by full recompute -> (generated ids, oracle result on all ids)."""
    ids = list(prompt)
    vocab = oracle.cfg.vocab_size
    for _ in range(n):
        ids.append(argmax(oracle.forward(ids)["logits"][-1], vocab))
    return ids[len(prompt):], oracle.run(ids, with_mtp=False)


def margins(result, prompt_len, n, vocab):
    """Smallest margins of the decisions the comparison depends on."""
    logits = result["logits"]
    amin = min(argmax_margin(logits[r], vocab) for r in range(prompt_len - 1, prompt_len + n - 1))
    rmin = np.inf
    for per_token in result["routing"].values():
        for _, egap, ggap in per_token:
            rmin = min(rmin, egap, ggap)
    return amin, rmin


def pick_seed_and_prompt(xds, case, workdir):
    """Scan seeds 1.. and a few prompts per seed with the oracle only."""
    best = None
    amargin = case.get("argmax_margin", ARGMAX_MARGIN)
    rmargin = case.get("routing_margin", ROUTING_MARGIN)
    for seed in SEEDS:
        model = os.path.join(workdir, f"{case['name']}_seed{seed}")
        make_checkpoint(xds, case, seed, model)
        oracle = make_oracle(case, model)
        vocab = oracle.cfg.vocab_size
        for k in range(PROMPTS_PER_SEED):
            rng = np.random.default_rng(1000 * seed + k)
            prompt = [int(v) for v in rng.integers(2, vocab, case.get("prompt_len", PROMPT_LEN))]
            generated, result = oracle_greedy(oracle, prompt, MAX_TOKENS)
            amin, rmin = margins(result, len(prompt), MAX_TOKENS, vocab)
            if best is None or min(amin / amargin, rmin / rmargin) > best[0]:
                best = (min(amin / amargin, rmin / rmargin), seed, k)
            if amin >= amargin and rmin >= rmargin:
                return {"model": model, "seed": seed, "prompt": prompt, "oracle": oracle,
                        "generated": generated, "argmax_margin": amin, "routing_margin": rmin}
        shutil.rmtree(model)
    raise Failure(f"no seed in {SEEDS} with safe margins (best ratio {best})")


def parse_generated(stdout, prompt, n):
    """Generated ids from generate's stdout: comma-separated ids (maybe echoing the prompt),
    then a stats line."""
    ids = []
    for line in stdout.splitlines():
        s = line.strip()
        if s and re.fullmatch(r"\d+(\s*,\s*\d+)*\s*,?", s):
            ids += [int(x) for x in re.findall(r"\d+", s)]
    if not ids:  # ids streamed on the same line as the stats
        m = re.match(r"\s*(\d+(\s*,\s*\d+)*)", stdout)
        ids = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []
    if len(ids) == len(prompt) + n and ids[: len(prompt)] == prompt:
        ids = ids[len(prompt):]
    if len(ids) != n:
        raise Failure(f"expected {n} generated ids on stdout, parsed {ids}:\n{stdout[-2000:]}")
    return ids


def read_routing(path):
    """JSON lines {"layer", "row", "experts"} -> {(layer, row): sorted experts}."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[(int(r["layer"]), int(r["row"]))] = sorted(int(e) for e in r["experts"])
    return out


def run_engine(xds, model, prompt, extra, tmp, tag, want_routing):
    logits_path = os.path.join(tmp, tag + ".logits.f32")
    routing_path = os.path.join(tmp, tag + ".routing.jsonl")
    cmd = [xds, "generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--ignore-eos",
           "--compute-dtype", "f32", "--dump-logits", logits_path] + extra
    if "--threads" not in extra:
        cmd += THREADS
    if want_routing:
        cmd += ["--dump-routing", routing_path]
    stdout, secs = run(cmd)
    generated = parse_generated(stdout, prompt, MAX_TOKENS)
    raw = np.fromfile(logits_path, dtype="<f4").astype(np.float64)
    return {"generated": generated, "raw_logits": raw, "secs": secs,
            "routing": read_routing(routing_path) if want_routing else None}


def compare(oracle, prompt, eng, label, rtol=LOGIT_RTOL):
    """Checks one engine run against the oracle on prompt + the engine's ids."""
    cfg = oracle.cfg
    vocab = cfg.vocab_size
    ids = prompt + eng["generated"]
    ref = oracle.run(ids, with_mtp=False)
    raw = eng["raw_logits"]
    if raw.size % vocab:
        raise Failure(f"{label}: logits file of {raw.size} floats is not [rows, {vocab}]")
    logits = raw.reshape(-1, vocab)
    rows = logits.shape[0]
    if rows not in (len(ids) - 1, len(ids)):
        raise Failure(f"{label}: {rows} logits rows, expected {len(ids) - 1} or {len(ids)}")
    errors = []
    rel = np.max(np.abs(logits - ref["logits"][:rows]), axis=1) / np.max(
        np.abs(ref["logits"][:rows]), axis=1)
    worst = int(np.argmax(rel))
    if rel[worst] > rtol:
        bad = [int(r) for r in np.nonzero(rel > rtol)[0]]
        errors.append(f"logits: rows {bad} exceed {rtol} (worst row {worst}: "
                      f"{rel[worst]:.3e}; first bad row {bad[0]}: {rel[bad[0]]:.3e})")
    for j, tok in enumerate(eng["generated"]):
        want = argmax(ref["logits"][len(prompt) - 1 + j], vocab)
        if tok != want:
            errors.append(f"greedy: step {j} (row {len(prompt) - 1 + j}) engine {tok}, "
                          f"oracle {want}")
            break
    n_routing = 0
    if eng["routing"] is not None:
        for layer, per_token in ref["routing"].items():
            for row in range(rows):
                got = eng["routing"].get((layer, row))
                if got is None:
                    errors.append(f"routing: engine dumped nothing for layer {layer} row {row}")
                elif got != per_token[row][0]:
                    errors.append(f"routing: layer {layer} row {row}: engine {got}, "
                                  f"oracle {per_token[row][0]}")
                n_routing += 1
        extra = sorted({k[0] for k in eng["routing"]} - set(ref["routing"]))
        if [x for x in extra if x < cfg.num_hidden_layers]:
            errors.append(f"routing: engine dumped non-MoE layers {extra}")
    return errors, {"rows": rows, "max_rel_err": float(rel[worst]), "worst_row": worst,
                    "routing_checked": n_routing}


def detect_batch_flag(gen_help):
    """A batch option of generate, if the engine has one (e.g. --batch N / --copies N):
    the prompt is run as N identical sequences in one batch."""
    for flag in ["--batch", "--batch-size", "--copies", "--num-seqs"]:
        if re.search(re.escape(flag) + r"\b", gen_help):
            return [flag, "3"]
    return None


def run_case(xds, case, workdir, gen_help, log):
    t0 = time.monotonic()
    pick = pick_seed_and_prompt(xds, case, workdir)
    log(f"[{case['name']}] seed {pick['seed']}, prompt {pick['prompt']}, oracle greedy "
        f"{pick['generated']}, margins argmax {pick['argmax_margin']:.2e} (rel) routing "
        f"{pick['routing_margin']:.2e} ({time.monotonic() - t0:.1f} s)")
    want_routing = "--dump-routing" in gen_help
    failed = []
    oneshot = None
    for v in case["variants"]:
        spec = VARIANTS[v]
        extra = spec["args"]
        if v == "batch":
            extra = detect_batch_flag(gen_help)
        needs = spec["needs"]
        if extra is None or (needs and needs != "BATCH" and needs not in gen_help):
            log(f"[{case['name']}/{v}] SKIPPED: generate has no {needs} option")
            continue
        label = f"{case['name']}/{v}"
        try:
            eng = run_engine(xds, pick["model"], pick["prompt"], extra, workdir, label.replace(
                "/", "_"), want_routing)
        except Failure as e:
            failed.append(label)
            log(f"[{label}] FAIL: {e}")
            continue
        errors, stats = compare(pick["oracle"], pick["prompt"], eng, label,
                                case.get("logit_rtol", LOGIT_RTOL))
        if oneshot is not None:
            if eng["generated"] != oneshot["generated"]:
                errors.append(f"tokens differ from the one-shot run: {eng['generated']} vs "
                              f"{oneshot['generated']}")
        if v == "oneshot":
            oneshot = eng
        status = "FAIL" if errors else "ok"
        log(f"[{label}] {status}: engine {eng['generated']}, {stats['rows']} rows, max rel err "
            f"{stats['max_rel_err']:.2e} (row {stats['worst_row']}), routing checked "
            f"{stats['routing_checked'] or 'NOT DUMPED'}, engine {eng['secs']:.1f} s")
        for e in errors[:20]:
            log(f"    {e}")
        if errors:
            failed.append(label)
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xdeepserve", required=True, help="path of the xdeepserve binary")
    ap.add_argument("--case", action="append", help="run only these cases")
    ap.add_argument("--suite", default="deepseek_v3", choices=["deepseek_v3", "families"],
                    help="the cases of DeepSeek-V3 checkpoints (default) or of Kimi K2 and "
                         "DeepSeek-V2 ones")
    ap.add_argument("--keep", help="keep checkpoints and dumps in this directory")
    ap.add_argument("--family", default="deepseek_v3",
                    choices=["deepseek_v3", "qwen3_moe", "glm4_moe"],
                    help="run the cases of this model family")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--python-maker", action="store_true",
                    help="make every checkpoint with oracle/make_tiny.py, not mkmodel")
    args = ap.parse_args()
    global PYTHON_MAKER
    PYTHON_MAKER = args.python_maker
    if args.list:
        for c in CASES:
            print(c["name"], c["variants"])
        return 0
    xds = os.path.abspath(args.xdeepserve)
    gen_help = help_text(xds, "generate")
    if not PYTHON_MAKER and "mkmodel" not in help_text(xds, ""):
        print("NOTE: xdeepserve has no mkmodel subcommand; every checkpoint comes from "
              "oracle/make_tiny.py", flush=True)
        PYTHON_MAKER = True
    if "--threads" in gen_help:
        THREADS[:] = ["--threads", "1"]
    workdir = args.keep or tempfile.mkdtemp(prefix="xds_conformance_")
    os.makedirs(workdir, exist_ok=True)
    log = lambda s: print(s, flush=True)
    failed = []
    t0 = time.monotonic()
    try:
        for case in CASES:
            if args.case and case["name"] not in args.case:
                continue
            if not args.case and (case.get("suite", "deepseek_v3") != args.suite or
                                  case.get("family", "deepseek_v3") != args.family):
                continue
            try:
                failed += run_case(xds, case, workdir, gen_help, log)
            except Failure as e:
                failed.append(case["name"])
                log(f"[{case['name']}] FAIL: {e}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"conformance: {'FAILED ' + ', '.join(failed) if failed else 'all passed'} "
        f"({time.monotonic() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
