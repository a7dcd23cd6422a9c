#!/usr/bin/python3
"""GLM-4.5 end to end: `xdeepserve generate` and `xdeepserve serve` on a tiny random GLM-4.5
checkpoint in the published layout with one MTP layer (tests/conformance/oracle/
make_tiny_glm4.py) and the shipped model's tokenizer.

  - generate runs greedily without speculation (its numbers are checked against the float64
    oracle by conformance.glm4_f32, the MTP layer's by model_forward.*Glm4Oracle*);
  - generate with --speculative-tokens 1 and 2 gives the same text;
  - serve's greedy completion (temperature 0, ignore_eos) is that text with --dp 1, --dp 2
    (expert parallelism), --speculative-tokens 2 (MTP drafts verified by the main model) on
    one and two devices, and prefill/decode disaggregation.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_qwen3_test import FAILURES, PROMPT, check, post, free_port  # noqa: E402,F401
import serve_qwen3_test  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "conformance", "oracle")


def generate(xds, model, extra):
    g = subprocess.run([xds, "generate", "--model", model, "--prompt", PROMPT,
                        "--max-tokens", "12", "--temperature", "0", "--ignore-eos",
                        "--threads", "1"] + extra, capture_output=True, text=True, timeout=300)
    check(g.returncode == 0, f"generate {' '.join(extra)} ran: {g.stderr[-500:]}")
    return g.stdout[:-1] if g.stdout.endswith("\n") else g.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--tokenizer-from", required=True, help="a model dir with tokenizer.json")
    args = ap.parse_args()
    xds = os.path.abspath(args.xdeepserve)
    work = tempfile.mkdtemp(prefix="xds_glm4_")
    try:
        model = os.path.join(work, "glm4-tiny")
        with open(os.path.join(args.tokenizer_from, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        subprocess.run([sys.executable, os.path.join(ORACLE, "make_tiny_glm4.py"), "--out",
                        model, "--vocab", str(vocab), "--layers", "2", "--seed", "3"],
                       check=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer_from, name), model)

        text = generate(xds, model, [])
        for k in ("1", "2"):
            spec = generate(xds, model, ["--speculative-tokens", k])
            check(spec == text, f"generate --speculative-tokens {k} greedy text equals without: "
                  f"{spec!r} vs {text!r}")
        for extra in (["--dp", "1"], ["--dp", "2"], ["--speculative-tokens", "2"],
                      ["--dp", "2", "--speculative-tokens", "2"],
                      ["--prefill-instances", "1", "--decode-instances", "1"]):
            served, log = serve_qwen3_test.served_completion(xds, model, extra)
            check(served == text, f"serve {' '.join(extra)} greedy text equals generate: "
                  f"{served!r} vs {text!r} {log}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("serve_glm4: " + ("FAILED: " + "; ".join(FAILURES) if FAILURES else "all passed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
