#!/usr/bin/python3
"""End to end: `xdeepserve serve` over real HTTP with the shipped model.

Starts the server (gateway + instance with --dp N), then:
  - runs tests/e2e/openai_e2e.mjs through the official `openai` npm client (streamed and
    non-streamed chat and completions, token-id prompts, logprobs, stop strings, n=2, 32
    concurrent clients, cancellation by disconnect);
  - compares the greedy completion with `xdeepserve generate` (an independent path: one
    process, no scheduler, no HTTP);
  - checks every error case with plain HTTP (status, OpenAI error object);
  - checks that /metrics moved and that the cancelled request freed its seat;
  - stops the server with SIGTERM and checks that it exits cleanly and leaves no process.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, key=None, raw=None, timeout=60):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


class Served:
    """`xdeepserve serve` on free ports (`--port`, `--instance-port`), its stdout and stderr
    gathered by a thread into `output` (a list of lines)."""

    def __init__(self, xdeepserve, model, extra):
        self.port, iport = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [xdeepserve, "serve", "--model", model, "--port", str(self.port),
             "--instance-port", str(iport)] + list(extra),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = []
        self.reader = threading.Thread(target=lambda: self.output.extend(self.process.stdout),
                                       daemon=True)
        self.reader.start()


def wait_healthy(base, server, timeout_s=120):
    """True once GET base/health answers 200; False when `server` (a Popen) exits first or
    timeout_s passes."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and server.poll() is None:
        try:
            if http("GET", base + "/health", timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def metric(text, name):
    """Sum of every sample of `name` (any labels)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def expert_tokens(text):
    """xdeepserve_expert_routed_tokens_total as {layer: {expert: tokens}}."""
    out = {}
    for m in re.finditer(r'^xdeepserve_expert_routed_tokens_total\{layer="(\d+)",expert="(\d+)"\} (\S+)$',
                         text, re.M):
        out.setdefault(int(m.group(1)), {})[int(m.group(2))] = float(m.group(3))
    return out



def alive(pid):
    """True while `pid` runs (exists and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def comm(pid):
    """The process's name as ps shows it (/proc/PID/comm), "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def descendants(pid):
    """Pids whose parent chain reaches pid (from /proc)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--node-modules", required=True)
    ap.add_argument("--dp", type=int, default=1)
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.node_modules, "openai")):
        print(f"SKIP-FAIL: the openai npm client is not installed in {args.node_modules} "
              "(tools/install_deps.sh installs it)", file=sys.stderr)
        return 1

    port, iport = free_port(), free_port()
    key = "e2e-key"
    base = f"http://127.0.0.1:{port}"
    cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
           "--instance-port", str(iport), "--api-key", key, "--dp", str(args.dp),
           "--max-num-seqs", "16", "--kv-memory", "64M", "--threads-per-device", "1",
           "--served-model-name", "kjv"]
    shm_before = set(os.listdir("/dev/shm"))
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        healthy = wait_healthy(base, server)
        check(healthy, "server became healthy")
        if not healthy:
            return 1

        status, body, _ = http("GET", base + "/v1/models", key=key)
        check(status == 200 and json.loads(body)["data"][0]["id"] == "kjv", "/v1/models")

        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_e2e.mjs")
        r = subprocess.run(["node", script, base + "/v1", key, "kjv"],
                           capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, f"openai client checks: {r.stderr.strip()[-2000:]}")
        observed = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}

        # The greedy completion equals `xdeepserve generate` (one process, no engine).
        g = subprocess.run([args.xdeepserve, "generate", "--model", args.model, "--prompt",
                            "In the beginning God created", "--max-tokens", "24",
                            "--temperature", "0", "--ignore-eos", "--threads", "1"],
                           capture_output=True, text=True, timeout=300)
        check(g.returncode == 0, f"generate ran: {g.stderr[-500:]}")
        if observed:
            # generate ends its stream with one newline of its own.
            check(observed["greedy_text"] == g.stdout[:-1],
                  f"served greedy text equals generate: {observed['greedy_text']!r} vs "
                  f"{g.stdout!r}")

        # Errors: status and an OpenAI error object naming the problem.
        url = base + "/v1/completions"
        ok_body = {"model": "kjv", "prompt": "In the beginning", "max_tokens": 4}

        def expect_error(status_want, what, body=None, raw=None, key_=key, param=None):
            status, text, headers = http("POST", url, body=body, raw=raw, key=key_)
            check(status == status_want, f"{what}: status {status} (want {status_want}): {text}")
            try:
                err = json.loads(text)["error"]
                check(isinstance(err.get("message"), str) and err["message"], f"{what}: message")
                check("type" in err and "code" in err and "param" in err, f"{what}: fields")
                if param:
                    check(err.get("param") == param, f"{what}: param {err.get('param')}")
            except (ValueError, KeyError, TypeError):
                check(False, f"{what}: body is not an OpenAI error: {text}")
            return headers

        expect_error(400, "malformed JSON", raw=b"{not json")
        expect_error(404, "unknown model", body=dict(ok_body, model="nope"))
        expect_error(400, "prompt longer than the context",
                     body=dict(ok_body, prompt=[5] * 100000))
        expect_error(400, "temperature out of range", body=dict(ok_body, temperature=-1),
                     param="temperature")
        expect_error(400, "logit_bias unsupported", body=dict(ok_body, logit_bias={"5": 10}),
                     param="logit_bias")
        expect_error(400, "n = 0", body=dict(ok_body, n=0), param="n")
        expect_error(401, "missing API key", body=ok_body, key_=None)
        expect_error(401, "wrong API key", body=ok_body, key_="wrong")
        status, _, _ = http("POST", url, body=ok_body, key=key)
        check(status == 200, "the server still serves after the bad requests")

        # /metrics moved; the cancelled stream freed its seat.
        time.sleep(1.5)
        status, text, _ = http("GET", base + "/metrics")
        check(status == 200, "/metrics")
        check(metric(text, "xdeepserve_requests_total") >= 40, "requests counted")
        check(metric(text, "xdeepserve_time_to_first_token_seconds_count") >= 40, "TTFT observed")
        check(metric(text, "xdeepserve_requests_running") == 0,
              "no request running after the clients finished (the cancelled one freed)")
        # Tokens routed per expert: every token passes every decoder MoE layer and picks
        # num_experts_per_tok distinct experts there (config.json), so each such layer's total
        # is the same multiple of k.
        with open(os.path.join(args.model, "config.json")) as f:
            cfg = json.load(f)
        k, n_experts = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
        moe_layers = range(cfg.get("first_k_dense_replace", 0), cfg["num_hidden_layers"])
        routed = expert_tokens(text)
        check(all(l in routed and len(routed[l]) == n_experts for l in moe_layers),
              f"expert counts for every MoE layer and expert: {sorted(routed)}")
        totals = {l: sum(routed.get(l, {}).values()) for l in moe_layers}
        check(len(set(totals.values())) == 1 and min(totals.values()) > 0,
              f"every MoE layer routed the same tokens: {totals}")
        check(all(t % k == 0 for t in totals.values()), f"totals are multiples of k={k}")
    finally:
        family = descendants(server.pid)
        check(len(family) >= 1 + 2 * args.dp, f"instance, devices and output processes: {family}")
        # Every process names itself: the gateway (serve's own process), the instance's shell,
        # and per DP group r its device "xds-dp<r>" and output process "xds-out<r>".
        names = [comm(p) for p in [server.pid] + family]
        want = ["xds-gateway", "xds-shell"] + [f"xds-{kind}{r}" for r in range(args.dp)
                                               for kind in ("dp", "out")]
        check(all(w in names for w in want), f"process names {sorted(names)} hold {want}")
        server.send_signal(signal.SIGTERM)
        try:
            out, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
            check(False, "server did not stop within 60 s of SIGTERM")
        check(server.returncode == 0, f"server exit code {server.returncode}")
        time.sleep(0.5)
        left = [p for p in family if os.path.exists(f"/proc/{p}")]
        check(not left, f"processes left behind: {left}")
        check(set(os.listdir("/dev/shm")) <= shm_before, "nothing left in /dev/shm")
        if FAILURES:
            print(out[-4000:], file=sys.stderr)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("serve e2e: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
