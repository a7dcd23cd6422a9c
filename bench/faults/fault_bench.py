#!/usr/bin/python3
"""Time from a fault to the next token, per fault kind (docs/design/reliability.md).

Starts `xdeepserve serve --dp 2 --fault-injection` on MODEL, and for each fault: N concurrent
streamed greedy completions, the fault once every stream has tokens, then
  - stall: each stream's longest wait for a token after the fault (median and max over the
    streams: what a client saw of it),
  - recovery: the gateway's own figure, from the failure it saw to the first token of each
    recomputed request (xdeepserve_fault_recovery_seconds, mean),
  - requests recomputed and requests failed (xdeepserve_requests_recomputed_total,
    xdeepserve_requests_total{outcome="error"}).
Prints a table and writes JSON (--out). The physical floor beside it: the instance's start
(`load_s`, /health from a cold start of serve, weights in the page cache) -- a restart cannot
be faster than loading the model again.

With --backup the instance runs with copies of every expert on the other group
(--redundant-slots experts/2 --expert-backup): a lost group is left out (scale-down, no
restart, only its requests recomputed) and joins again before the next fault; the faults are
then kill -9 of a group, an injected hang and an injected exchange error (rolled back).

    bench/faults/fault_bench.py --xdeepserve build/release/src/cli/xdeepserve \\
        --model models/kjv-moe-tiny [--backup] [--streams 16] [--max-tokens 64] [--out F.json]
        [-- FLAGS]
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the meek",
           "And it came to pass", "Now the serpent was", "Let there be light", "And the earth was",
           "Thou shalt not", "The heavens declare", "And Moses said", "Hear, O Israel",
           "For God so loved", "And Jesus answered", "Vanity of vanities", "In my Father's house"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=30):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def children(pid):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def named(pid, name):
    for p in children(pid):
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == name:
                    return p
        except OSError:
            pass
    return None


class Stream(threading.Thread):
    def __init__(self, base, prompt, max_tokens):
        super().__init__()
        self.base, self.prompt, self.max_tokens = base, prompt, max_tokens
        self.times, self.finish, self.error = [], None, None
        self.start()

    def run(self):
        body = {"prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        req = urllib.request.Request(self.base + "/v1/completions", data=json.dumps(body).encode(),
                                     method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=900) as r:
                for line in r:
                    line = line.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = event["error"]
                    for c in event.get("choices", []):
                        if c.get("text") or c.get("token_ids"):
                            self.times.append(time.time())
                        self.finish = c.get("finish_reason") or self.finish
        except Exception as e:  # noqa: BLE001
            self.error = str(e)


def start_serve(argv, base):
    """Starts `serve` (argv) and waits for its /health: (the process, seconds to healthy)."""
    started = time.time()
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        if server.poll() is not None:
            sys.exit(f"serve exited with {server.returncode}")
        try:
            if http("GET", base + "/health", timeout=5)[0] == 200:
                return server, time.time() - started
        except OSError:
            pass
        time.sleep(0.2)


def stop_serve(server):
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(120)
    except subprocess.TimeoutExpired:
        server.kill()


def prompt(i, ids):
    """Stream i's prompt: text, or 8 token ids for a model without a tokenizer."""
    if ids:
        return [(i * 37 + k * 11) % 1000 + 10 for k in range(8)]
    return PROMPTS[i % len(PROMPTS)]


def measure(base, server, fault, strike, streams_n, max_tokens, ids):
    before = http("GET", base + "/metrics")[1]
    streams = [Stream(base, prompt(i, ids), max_tokens) for i in range(streams_n)]
    deadline = time.time() + 600
    while time.time() < deadline and not all(len(s.times) >= 2 or s.finish or s.error
                                             for s in streams):
        time.sleep(0.02)
    struck = time.time()
    strike()
    for s in streams:
        s.join()
    after = http("GET", base + "/metrics")[1]

    def stall(s):
        t = [struck] + [x for x in s.times if x > struck]
        return max((b - a for a, b in zip(t, t[1:])), default=float("nan"))

    stalls = sorted(stall(s) for s in streams)
    d = {k: metric(after, k) - metric(before, k) for k in
         ["xdeepserve_fault_recovery_seconds_sum", "xdeepserve_fault_recovery_seconds_count",
          "xdeepserve_requests_recomputed_total", "xdeepserve_instance_restarts_total",
          "xdeepserve_instance_scale_downs_total", "xdeepserve_step_rollbacks_total"]}
    errors = metric(after, 'xdeepserve_requests_total{outcome="error"}') - \
        metric(before, 'xdeepserve_requests_total{outcome="error"}')
    n = d["xdeepserve_fault_recovery_seconds_count"]
    return {"fault": fault, "stall_median_s": stalls[len(stalls) // 2], "stall_max_s": stalls[-1],
            "recovery_mean_s": d["xdeepserve_fault_recovery_seconds_sum"] / n if n else None,
            "recomputed": int(d["xdeepserve_requests_recomputed_total"]), "failed": int(errors),
            "restarts": int(d["xdeepserve_instance_restarts_total"]),
            "scale_downs": int(d["xdeepserve_instance_scale_downs_total"]),
            "rollbacks": int(d["xdeepserve_step_rollbacks_total"]),
            "unfinished": sum(1 for s in streams if s.finish != "length")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--group-timeout", default="2")
    ap.add_argument("--only", help="run only the faults whose name contains this")
    ap.add_argument("--backup", action="store_true",
                    help="copies of every expert on the other group: scale-down, not restart")
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*", help="more serve flags (after --)")
    a = ap.parse_args()
    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [a.xdeepserve, "serve", "--model", a.model, "--port", str(port), "--instance-port",
            str(iport), "--dp", "2", "--fault-injection", "--group-timeout", a.group_timeout,
            "--max-restarts", "20"] + a.extra
    ids = not os.path.exists(os.path.join(a.model, "tokenizer.json"))  # prompts as token ids
    if a.backup:
        with open(os.path.join(a.model, "config.json")) as f:
            experts = json.load(f)["n_routed_experts"]
        argv += ["--redundant-slots", str(experts // 2), "--expert-backup"]
    server, load_s = start_serve(argv, base)
    rows = []
    try:
        sp = server.pid

        def post(body):
            return lambda: http("POST", base + "/admin/faults", body)

        def eplb_version():
            return json.loads(http("GET", base + "/admin/eplb")[1]).get("map_version", 0)

        def groups_and_backup(version):
            """Both groups serve and the backup copies are in force: map `version` or newer
            (a rejoin puts the identity map at v + 2 in force, the copies come with v + 4)."""
            while True:
                groups = metric(http("GET", base + "/metrics")[1], "xdeepserve_instance_groups")
                state = json.loads(http("GET", base + "/admin/eplb")[1])
                if groups in (0, 2) and state.get("map_version", 0) >= version and \
                        state.get("phase") == "idle" and "stopped" not in state:
                    return
                time.sleep(0.2)

        faults = [
            ("kill -9 of a DP group", lambda: os.kill(named(sp, "xds-dp1"), signal.SIGKILL)),
            ("SIGSTOP of a DP group (hang)", lambda: os.kill(named(sp, "xds-dp0"), signal.SIGSTOP)),
            ("kill -9 of the shell", lambda: os.kill(named(sp, "xds-shell"), signal.SIGKILL)),
            ("injected kill", post({"kind": "kill", "group": 1, "after_steps": 4})),
            ("injected hang", post({"kind": "hang", "group": 0, "after_steps": 4})),
            ("retired KV blocks (4)", post({"kind": "retire_kv_blocks", "group": 0, "blocks": 4})),
            ("exchange error (rollback)", post({"kind": "exchange_error", "group": 0,
                                                "after_steps": 4})),
        ]
        if a.backup:
            faults = [
                ("kill -9 of a DP group, scale-down",
                 lambda: os.kill(named(sp, "xds-dp1"), signal.SIGKILL)),
                ("injected hang, scale-down", post({"kind": "hang", "group": 0, "after_steps": 4})),
                ("exchange error (rollback)", post({"kind": "exchange_error", "group": 1,
                                                    "after_steps": 4})),
            ]
            groups_and_backup(3)
        print(f"serve's cold start to /health: {load_s:.2f} s", flush=True)
        for name, strike in faults:
            if a.only and a.only not in name:
                continue
            version = eplb_version() if a.backup else 0
            rows.append(measure(base, server, name, strike, a.streams, a.max_tokens, ids))
            print(json.dumps(rows[-1]), flush=True)
            while http("GET", base + "/health", timeout=10)[0] != 200:
                time.sleep(0.2)
            if a.backup and "scale-down" in name:
                groups_and_backup(version + 4)
    finally:
        stop_serve(server)
    load = os.getloadavg()[0]
    print(f"model {a.model}, {a.streams} streams x {a.max_tokens} tokens, --dp 2"
          f"{' with backup copies' if a.backup else ''}, "
          f"--group-timeout {a.group_timeout} s; serve's cold start to /health {load_s:.2f} s; "
          f"load average {load:.2f}")
    print(f"| {'fault':34} | stall median s | stall max s | failure->token mean s | "
          f"recomputed | failed | restarts | scale-downs | rollbacks |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        rec = f"{r['recovery_mean_s']:.2f}" if r["recovery_mean_s"] is not None else "-"
        print(f"| {r['fault']:34} | {r['stall_median_s']:.2f} | {r['stall_max_s']:.2f} | {rec} | "
              f"{r['recomputed']} | {r['failed'] + r['unfinished']} | {r['restarts']} | "
              f"{r['scale_downs']} | {r['rollbacks']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "backup": a.backup, "streams": a.streams,
                       "max_tokens": a.max_tokens,
                       "load_s": load_s, "load_average": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
