#!/usr/bin/python3
"""Qwen3-MoE end to end: `xdeepserve generate` and `xdeepserve serve` (one device, and two
devices with expert parallelism) on a tiny random Qwen3-MoE checkpoint in the published
layout (tests/conformance/oracle/make_tiny_qwen3.py) with the shipped model's tokenizer.

  - generate runs greedily (its numbers are checked against the float64 oracle by
    conformance.qwen3_f32);
  - serve's greedy completion (temperature 0, ignore_eos) is the text generate prints, with
    --dp 1, --dp 2, and prefill/decode disaggregation (the GQA cache's blocks pulled by the
    decode instance);
  - generate runs with --kv-cache-dtype int8;
  - the paths the family does not take yet fail in one line naming it: --speculative-tokens,
    quantize.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "conformance", "oracle")
FAILURES = []
PROMPT = "In the beginning God created"


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read().decode())


def served_completion(xds, model, extra):
    port, iport = free_port(), free_port()
    cmd = [xds, "serve", "--model", model, "--port", str(port), "--instance-port", str(iport),
           "--max-num-seqs", "4", "--kv-memory", "16M", "--threads-per-device", "1",
           "--served-model-name", "q3"] + extra
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        if server.poll() is not None:
            return None, server.stdout.read()[-2000:]
        r = post(base + "/v1/completions", {"model": "q3", "prompt": PROMPT, "max_tokens": 12,
                                            "temperature": 0, "ignore_eos": True})
        return r["choices"][0]["text"], ""
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def one_line_error(cmd, want):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    err = p.stderr.strip()
    check(p.returncode != 0 and want in err and len(err.splitlines()) <= 2,
          f"{' '.join(os.path.basename(c) for c in cmd[1:3])} ... refused in one line naming "
          f"{want!r}: {err[-300:]!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--tokenizer-from", required=True, help="a model dir with tokenizer.json")
    args = ap.parse_args()
    xds = os.path.abspath(args.xdeepserve)
    work = tempfile.mkdtemp(prefix="xds_qwen3_")
    try:
        model = os.path.join(work, "qwen3-tiny")
        with open(os.path.join(args.tokenizer_from, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        subprocess.run([sys.executable, os.path.join(ORACLE, "make_tiny_qwen3.py"), "--out",
                        model, "--vocab", str(vocab), "--layers", "2", "--seed", "3"],
                       check=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer_from, name), model)

        g = subprocess.run([xds, "generate", "--model", model, "--prompt", PROMPT,
                            "--max-tokens", "12", "--temperature", "0", "--ignore-eos",
                            "--threads", "1"], capture_output=True, text=True, timeout=300)
        check(g.returncode == 0, f"generate ran: {g.stderr[-500:]}")
        text = g.stdout[:-1] if g.stdout.endswith("\n") else g.stdout
        for extra in (["--dp", "1"], ["--dp", "2"],
                      ["--prefill-instances", "1", "--decode-instances", "1"]):
            served, log = served_completion(xds, model, extra)
            check(served == text, f"serve {' '.join(extra)} greedy text equals generate: "
                  f"{served!r} vs {text!r} {log}")

        g8 = subprocess.run([xds, "generate", "--model", model, "--prompt", PROMPT,
                             "--max-tokens", "4", "--temperature", "0", "--kv-cache-dtype",
                             "int8", "--threads", "1"], capture_output=True, text=True,
                            timeout=300)
        check(g8.returncode == 0 and "KV cache I8" in g8.stderr,
              f"generate with the INT8 GQA cache: {g8.stderr[-300:]}")
        one_line_error([xds, "generate", "--model", model, "--prompt", PROMPT,
                        "--max-tokens", "2", "--speculative-tokens", "1"], "MTP")
        calib = os.path.join(work, "calibration.txt")
        with open(calib, "w") as f:
            f.write(PROMPT + "\n")
        one_line_error([xds, "quantize", "--model", model, "--out", os.path.join(work, "q"),
                        "--calibration", calib], "qwen3_moe")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("serve_qwen3: " + ("FAILED: " + "; ".join(FAILURES) if FAILURES else "all passed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
