#!/usr/bin/python3
"""MoE/attention disaggregation end to end: `xdeepserve serve --attention-dp A --expert-devices X
[--dp-domains D] [--microbatches M]` on the shipped model (16 routed experts, top-2, three MoE
layers), f32, against a colocated `serve --dp 1` of the same model.

  - three concurrent greedy completions (temperature 0, ignore_eos) over real HTTP give the
    same texts as the colocated instance, for: A=2 X=3 D=1 M=1 (X does not divide the 16
    experts; two trampolines forward to a third device), A=2 X=3 D=2 M=1 (one group per
    domain, one trampoline forwarding to every expert device: the domains take turns),
    A=2 X=3 D=1 M=2 and A=2 X=2 D=2 M=2 (microbatches), and A=2 X=3 D=2 M=2 with
    --no-trampoline (each group dispatches to every expert device itself);
  - every expert device's expert<k>.json (--ae-trace-dir, written when it stops): zero
    controller round trips, a busy fraction in (0, 1], and a trace whose turns follow the
    pure order layer -> domain -> microbatch (engine/ae_schedule.h), one after another in
    time, every (domain, layer, microbatch) of the shape present;
  - --dp beside --attention-dp is refused in one line.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

FAILURES = []
PROMPTS = ["In the beginning God created", "And the LORD said unto Moses",
           "Blessed are the meek: for they"]
MOE_LAYERS = [1, 2, 3]  # first_k_dense_replace = 1 of 4 layers


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read().decode())


def served_texts(xds, model, extra):
    """Starts serve, sends PROMPTS concurrently, stops it (SIGTERM: drains); the texts."""
    port, iport = free_port(), free_port()
    cmd = [xds, "serve", "--model", model, "--port", str(port), "--instance-port", str(iport),
           "--max-num-seqs", "4", "--kv-memory", "16M", "--threads-per-device", "1",
           "--served-model-name", "m"] + extra
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    texts = [None] * len(PROMPTS)
    log = ""
    try:
        deadline = time.time() + 300
        while time.time() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        if server.poll() is not None:
            return None, server.stdout.read()[-3000:]

        def one(i):
            try:
                r = post(base + "/v1/completions",
                         {"model": "m", "prompt": PROMPTS[i], "max_tokens": 12,
                          "temperature": 0, "ignore_eos": True})
                texts[i] = r["choices"][0]["text"]
            except Exception as e:  # reported as a mismatch below
                texts[i] = f"<error {e}>"

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.terminate()
        try:
            out, _ = server.communicate(timeout=120)
            log = out[-3000:]
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
            log = out[-3000:]
    return texts, log


def check_trace(trace_dir, a, x, d, m, label):
    for k in range(x):
        path = os.path.join(trace_dir, f"expert{k}.json")
        if not os.path.exists(path):
            check(False, f"{label}: {path} written")
            continue
        with open(path) as f:
            s = json.load(f)
        check(s["controller_round_trips"] == 0 and s["steps"] > 0,
              f"{label}: expert {k} ran {s['steps']} steps with "
              f"{s['controller_round_trips']} controller round trips")
        check(0 < s["busy_fraction"] <= 1.0,
              f"{label}: expert {k} busy fraction {s['busy_fraction']:.4f} in (0, 1]")
        trace = s["trace"]
        want = [(l, dom, mb) for l in MOE_LAYERS for dom in range(d) for mb in range(m)]
        steps = sorted({e["step"] for e in trace})
        in_order = True
        for st in steps:
            got = [(e["layer"], e["domain"], e["microbatch"]) for e in trace if e["step"] == st]
            in_order = in_order and got == want
        check(len(steps) == s["steps"] and in_order,
              f"{label}: expert {k}'s turns of every step are layer -> domain -> microbatch "
              f"({len(steps)} steps traced)")
        serial = all(trace[i]["begin_ns"] >= trace[i - 1]["end_ns"] and
                     trace[i]["end_ns"] >= trace[i]["begin_ns"] for i in range(1, len(trace)))
        check(serial, f"{label}: expert {k}'s turns follow one another in time")
        rows = sum(e["rows"] for e in trace)
        check(rows == s["rows"], f"{label}: expert {k}'s traced rows add up ({rows})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    xds = os.path.abspath(args.xdeepserve)
    model = os.path.abspath(args.model)
    work = tempfile.mkdtemp(prefix="xds_ae_")
    try:
        ref, log = served_texts(xds, model, ["--dp", "1"])
        check(ref is not None and all(t and not t.startswith("<error") for t in ref),
              f"colocated --dp 1 served: {ref} {'' if ref else log}")
        shapes = [(2, 3, 1, 1, True), (2, 3, 2, 1, True), (2, 3, 1, 2, True),
                  (2, 2, 2, 2, True), (2, 3, 2, 2, False)]
        for a, x, d, m, trampoline in shapes:
            label = f"A={a} X={x} D={d} M={m}" + ("" if trampoline else " no trampoline")
            trace_dir = os.path.join(work, f"a{a}x{x}d{d}m{m}{'' if trampoline else 'direct'}")
            os.makedirs(trace_dir)
            texts, log = served_texts(xds, model, [
                "--attention-dp", str(a), "--expert-devices", str(x), "--dp-domains", str(d),
                "--microbatches", str(m), "--ae-trace-dir", trace_dir] +
                ([] if trampoline else ["--no-trampoline"]))
            check(texts == ref, f"{label}: greedy texts equal the colocated ones: {texts} vs "
                  f"{ref} {'' if texts == ref else log}")
            check_trace(trace_dir, a, x, d, m, label)
        p = subprocess.run([xds, "serve", "--model", model, "--dp", "2", "--attention-dp", "2",
                            "--expert-devices", "2"], capture_output=True, text=True, timeout=120)
        err = p.stderr.strip()
        check(p.returncode != 0 and "--dp cannot be given" in err and len(err.splitlines()) <= 2,
              f"--dp beside --attention-dp refused in one line: {err[-300:]!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("serve_ae: " + ("FAILED: " + "; ".join(FAILURES) if FAILURES else "all passed"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
