#!/usr/bin/python3
"""MTP speculative decoding served end to end: `xdeepserve serve --speculative-tokens k`.

The reference is `xdeepserve generate` without speculation (one process, one sequence, no
scheduler, f32, greedy) and a server with k = 0 for logprobs. For each k the server must give,
greedy: exactly the reference text for concurrent requests, for a long prompt served twice
(the second from the prefix cache), streamed, when max_tokens, a stop string or EOS ends the
output inside an accepted run of drafts; the main model's logprobs; reproducible sampled
outputs for a fixed seed; /metrics with drafts proposed and accepted; and once idle, no KV
block held by anything but the prefix cache (the rejected drafts' blocks were given back).
The shipped model's greedy margins are wide, so f32 outputs agree exactly.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import free_port, http, metric, wait_healthy  # noqa: E402

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed is the man",
           "And it came to pass", "Now the serpent", "Thou shalt not", "Hear, O Israel"]
LONG = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters. And God said, Let there be light: and there was "
        "light.")
MAX_TOKENS = 40
EOS_PROMPT = "Blessed is the man"

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def generate(args, prompt, max_tokens, ignore_eos=True):
    cmd = [args.xdeepserve, "generate", "--model", args.model, "--prompt", prompt,
           "--max-tokens", str(max_tokens), "--temperature", "0", "--threads", "1"]
    if ignore_eos:
        cmd.append("--ignore-eos")
    g = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(g.returncode == 0, f"generate: {g.stderr[-300:]}")
    # generate ends its stream with one newline of its own.
    return g.stdout[:-1] if g.stdout.endswith("\n") else g.stdout


class Server:
    def __init__(self, args, k):
        self.port, iport = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(self.port),
               "--instance-port", str(iport), "--dp", str(args.dp), "--kv-memory", "16M",
               "--threads-per-device", "1", "--compute-dtype", "f32"]
        if k > 0:
            cmd += ["--speculative-tokens", str(k)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        check(wait_healthy(self.base, self.proc), f"k={k}: the server did not become healthy")

    def complete(self, **body):
        status, text, _ = http("POST", self.base + "/v1/completions", body=body, timeout=600)
        check(status == 200, f"completion {body}: {status} {text[:300]}")
        return json.loads(text) if status == 200 else {"choices": [{}], "usage": {}}

    def stream(self, **body):
        body["stream"] = True
        req = urllib.request.Request(self.base + "/v1/completions",
                                     data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        text, finish = "", None
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for c in json.loads(line[6:]).get("choices", []):
                    text += c.get("text", "")
                    finish = c.get("finish_reason") or finish
        return text, finish

    def metrics(self):
        return http("GET", self.base + "/metrics")[1]

    def stop(self):
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        check(self.proc.returncode == 0, f"server exit {self.proc.returncode}: {out[-500:]}")


def check_server(args, k, ref, ref_long, ref_len, ref_eos, ref_logprobs):
    s = Server(args, k)
    try:
        greedy = {"temperature": 0, "ignore_eos": True}

        def ask(p):
            return p, s.complete(prompt=p, max_tokens=MAX_TOKENS, **greedy)

        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            for p, r in pool.map(ask, PROMPTS):
                check(r["choices"][0].get("text") == ref[p],
                      f"k={k} {p!r}: {r['choices'][0].get('text')!r} != {ref[p]!r}")

        cached = []
        for attempt in range(2):
            r = s.complete(prompt=LONG, max_tokens=MAX_TOKENS, **greedy)
            check(r["choices"][0].get("text") == ref_long,
                  f"k={k} long prompt, run {attempt}: {r['choices'][0].get('text')!r}")
            cached.append(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
        # With several groups the second run may be placed on the other group's cache.
        check(cached[0] == 0 and (cached[1] >= 16 or args.dp > 1),
              f"k={k}: cached prompt tokens {cached} (the second run should hit the cache)")

        text, finish = s.stream(prompt=PROMPTS[0], max_tokens=MAX_TOKENS, **greedy)
        check(text == ref[PROMPTS[0]] and finish == "length", f"k={k} streamed: {text!r} {finish}")

        for m, expected in ref_len.items():  # max_tokens inside an accepted run
            r = s.complete(prompt=PROMPTS[0], max_tokens=m, **greedy)
            c = r["choices"][0]
            check(c.get("text") == expected and c.get("finish_reason") == "length" and
                  r["usage"].get("completion_tokens") == m,
                  f"k={k} max_tokens {m}: {c.get('text')!r} {c.get('finish_reason')} "
                  f"{r['usage']}")

        full = ref[PROMPTS[1]]
        stop = full[len(full) // 2:len(full) // 2 + 5]
        r = s.complete(prompt=PROMPTS[1], max_tokens=MAX_TOKENS, stop=[stop], **greedy)
        c = r["choices"][0]
        check(c.get("text") == full[:full.index(stop)] and c.get("finish_reason") == "stop",
              f"k={k} stop {stop!r}: {c.get('text')!r} {c.get('finish_reason')}")

        r = s.complete(prompt=EOS_PROMPT, max_tokens=200, temperature=0)
        c = r["choices"][0]
        check(c.get("text") == ref_eos and c.get("finish_reason") == "stop",
              f"k={k} eos: {c.get('text')!r} {c.get('finish_reason')}")

        r = s.complete(prompt=PROMPTS[2], max_tokens=16, logprobs=2, **greedy)
        lp = r["choices"][0].get("logprobs") or {}
        check(lp.get("tokens") == ref_logprobs["tokens"], f"k={k} logprob tokens differ")
        for a, b in zip(lp.get("token_logprobs", []), ref_logprobs["token_logprobs"]):
            check(abs(a - b) <= 2e-3, f"k={k} logprob {a} != {b} (k=0)")

        sampled = {"prompt": PROMPTS[3], "max_tokens": 32, "temperature": 0.8, "seed": 7,
                   "ignore_eos": True}
        a, b = s.complete(**sampled), s.complete(**sampled)
        check(a["choices"][0].get("text") == b["choices"][0].get("text") and
              a["usage"].get("completion_tokens") == 32,
              f"k={k} sampled with a seed is not reproducible")
        r = s.complete(n=2, **sampled)
        check(len(r["choices"]) == 2 and r["usage"].get("completion_tokens") == 64,
              f"k={k} n=2: {r['usage']}")

        time.sleep(1.5)  # the groups' load reports
        text = s.metrics()
        drafted = metric(text, 'xdeepserve_spec_decode_draft_tokens_total{position="1"}')
        accepted = metric(text, 'xdeepserve_spec_decode_accepted_tokens_total{position="1"}')
        if k > 0:
            check(drafted > 0 and 0 < accepted <= drafted,
                  f"k={k}: drafts {drafted}, accepted {accepted} at position 1")
            acc = [metric(text, f'xdeepserve_spec_decode_accepted_tokens_total{{position="{i}"}}')
                   for i in range(1, k + 1)]
            # A draft is accepted only after every draft before it was.
            check(all(acc[i + 1] <= acc[i] for i in range(k - 1)), f"k={k}: accepted {acc}")
            check(metric(text, "xdeepserve_spec_decode_tokens_per_step") > 1.0,
                  f"k={k}: no step gave more than one token")
        check(metric(text, "xdeepserve_kv_cache_usage_ratio") == 0.0,
              f"k={k}: KV blocks still held once idle")
        check(metric(text, "xdeepserve_requests_running") == 0.0, f"k={k}: requests running")
    finally:
        s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--k", default="1,2,3", help="draft counts to serve with, comma-separated")
    args = ap.parse_args()

    ref = {p: generate(args, p, MAX_TOKENS) for p in PROMPTS}
    ref_long = generate(args, LONG, MAX_TOKENS)
    ref_len = {m: generate(args, PROMPTS[0], m) for m in (1, 2, 3, 5)}
    ref_eos = generate(args, EOS_PROMPT, 200, ignore_eos=False)
    check(len(ref_eos) < len(generate(args, EOS_PROMPT, 200)),
          "the EOS prompt's reference does not stop at EOS")

    base = Server(args, 0)
    try:
        r = base.complete(prompt=PROMPTS[2], max_tokens=16, logprobs=2, temperature=0,
                          ignore_eos=True)
        ref_logprobs = r["choices"][0].get("logprobs") or {"tokens": [], "token_logprobs": []}
    finally:
        base.stop()

    for k in [int(x) for x in args.k.split(",")]:
        check_server(args, k, ref, ref_long, ref_len, ref_eos, ref_logprobs)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
