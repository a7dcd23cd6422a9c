#!/usr/bin/python3
"""Preemption: a KV cache too small for the concurrent requests preempts the newest ones and
recomputes them later; every request still gets exactly the tokens of an uninterrupted run.

The reference is `xdeepserve generate` (one process, one sequence, no scheduler), greedy, for
each prompt. The server runs with a few dozen KV blocks and 12 concurrent requests whose KV
together needs more than that, placed at once (--kv-reserve-ratio 0.25); /metrics must show preemptions, and every output must equal
the reference (the tiny model's greedy margins are wide; f32).
"""
import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import free_port, http, metric, wait_healthy  # noqa: E402

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed is the man",
           "And it came to pass", "Now the serpent", "Thou shalt not", "Hear, O Israel",
           "In my Father's house", "For God so loved", "Let there be light", "And Adam knew"]
MAX_TOKENS = 48


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kv-memory", default="1200K")
    ap.add_argument("--speculative-tokens", default="0",
                    help="MTP drafts per step (their lookahead blocks make preemption likelier)")
    args = ap.parse_args()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print(f"FAILED: {what}", file=sys.stderr)

    reference = {}
    for p in PROMPTS:
        g = subprocess.run([args.xdeepserve, "generate", "--model", args.model, "--prompt", p,
                            "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
                            "--ignore-eos", "--threads", "1"],
                           capture_output=True, text=True, timeout=300)
        check(g.returncode == 0, f"generate: {g.stderr[-300:]}")
        # generate ends its stream with one newline of its own.
        reference[p] = g.stdout[:-1] if g.stdout.endswith("\n") else g.stdout

    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
         "--instance-port", str(iport), "--max-num-seqs", "16", "--kv-memory", args.kv_memory,
         "--threads-per-device", "1", "--max-num-batched-tokens", "64",
         # Placement counts a quarter of max_tokens: all 12 requests are placed at once
         # (12 x ceil((5 + 12) / 16) = 24 of the 33 blocks of 1200K); from position 33 on
         # they hold 3 blocks each (36 > 33), so the newest are preempted.
         "--kv-reserve-ratio", "0.25", "--speculative-tokens", args.speculative_tokens],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        check(wait_healthy(base, server), "the server did not become healthy")

        def ask(p):
            status, body, _ = http("POST", base + "/v1/completions",
                                   body={"prompt": p, "max_tokens": MAX_TOKENS,
                                         "temperature": 0, "ignore_eos": True}, timeout=600)
            return p, status, body

        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            results = list(pool.map(ask, PROMPTS))
        for p, status, body in results:
            check(status == 200, f"{p!r}: status {status}: {body[:300]}")
            if status == 200:
                text = json.loads(body)["choices"][0]["text"]
                check(text == reference[p], f"{p!r}: {text!r} != generate's {reference[p]!r}")
        time.sleep(0.5)
        _, text, _ = http("GET", base + "/metrics")
        check(metric(text, "xdeepserve_preemptions_total") > 0,
              "the small KV cache preempted requests (else the test proves nothing)")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            out, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
        if failures:
            print(out[-3000:], file=sys.stderr)
    if failures:
        return 1
    print("preemption: every output equals the uninterrupted run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
