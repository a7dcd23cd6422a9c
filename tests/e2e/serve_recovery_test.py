#!/usr/bin/python3
"""Faults under load, recovered (docs/design/reliability.md): `xdeepserve serve --dp 2` with the
shipped model serves 16 concurrent streamed greedy completions while a fault strikes; every
stream must end exactly as in a run without the fault -- the same text, no token repeated or
missing, no error event -- and the server must go on serving.

One server (f32, --group-timeout 2, --fault-injection) takes, in turn:
  kill -9 of DP group 1 (xds-dp1), SIGSTOP of DP group 0 (a hang: no process dies, the shell's
  heartbeat finds it), kill -9 of the instance's shell (xds-shell: the whole incarnation goes,
  the supervisor starts another), and the same through POST /admin/faults (kill after 4
  steps, hang after 3 steps); then 3 KV blocks retired under the running requests (recomputed
  inside their group, no restart), and an injected exchange error (the step rolled back on
  both groups and run again: no restart, no recomputation).
For each: the streams' texts against the fault-free batch, /health answering 503 while the
instance recovers and 200 after, /metrics counting the restart and the recomputed requests,
GET /admin/faults listing what followed, and the time from the fault to the next token
(printed, for docs/benchmarks.md). Then a server with --max-restarts 0: a killed DP group ends
the instance, the streams end with an error naming it, serve exits non-zero and leaves no
process behind.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import (FAILURES, Served, alive, check, comm, descendants, http,  # noqa: E402
                            metric, wait_healthy)

PROMPTS = [
    "In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the meek",
    "And it came to pass", "Now the serpent was", "Let there be light", "In my Father's house",
    "And the earth was", "Thou shalt not", "The heavens declare", "And Moses said",
    "Hear, O Israel", "For God so loved", "And Jesus answered", "Vanity of vanities",
]
MAX_TOKENS = 40


class Stream:
    """One streamed greedy completion in a thread: its text, finish reason, errors, and the
    arrival time of every chunk that carried text."""

    def __init__(self, base, prompt):
        self.text, self.finish, self.errors, self.times = "", None, [], []
        self.thread = threading.Thread(target=self._run, args=(base, prompt))
        self.thread.start()

    def _run(self, base, prompt):
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                "stream": True}
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=180) as r:
                for line in r:
                    line = line.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.errors.append(event["error"])
                        continue
                    for c in event.get("choices", []):
                        if c.get("text"):
                            self.text += c["text"]
                            self.times.append(time.time())
                        if c.get("finish_reason"):
                            self.finish = c["finish_reason"]
        except Exception as e:  # noqa: BLE001 -- a dropped connection is an outcome too
            self.errors.append(f"exception: {e}")


def batch(base):
    return [Stream(base, p) for p in PROMPTS]


def wait_all_started(streams, min_chunks=2, timeout_s=120):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if all(len(s.times) >= min_chunks or s.finish for s in streams):
            return True
        time.sleep(0.05)
    return False


def only(server, name):
    pids = [p for p in descendants(server.pid) if comm(p) == name]
    check(len(pids) == 1, f"one process named {name}: {pids}")
    return pids[0] if pids else None


def check_recovered(what, served, reference, strike, restarts_expected=1):
    """A batch of streams, `strike()` once every stream has tokens; then the checks."""
    base, server = served.base, served.process
    before = http("GET", base + "/metrics")[1]
    streams = batch(base)
    check(wait_all_started(streams), f"{what}: the streams did not start")
    struck_at = time.time()
    strike()
    # /health says 503 while the instance recovers (it may recover before a probe sees it).
    saw_503, healthy_again = False, False
    deadline = time.time() + 120
    while time.time() < deadline and server.poll() is None:
        try:
            status, body, _ = http("GET", base + "/health", timeout=10)
        except OSError:
            status, body = 0, ""
        if status == 503 and ("recovering" in body or "failed" in body):
            saw_503 = True
        if status == 200 and (saw_503 or time.time() - struck_at > 15):
            healthy_again = True
            break
        time.sleep(0.1)
    for s in streams:
        s.thread.join(180)
    check(server.poll() is None, f"{what}: serve exited ({server.poll()})")
    check(healthy_again, f"{what}: /health did not answer 200 again")
    # Each stream's longest stall after the fault (the gap between two of its tokens, or from
    # the fault to its first token): what a client saw of the fault.
    def stall(s):
        times = [struck_at] + [t for t in s.times if t > struck_at]
        return max((b - a for a, b in zip(times, times[1:])), default=999.0)
    waits = sorted(stall(s) for s in streams)
    for s, prompt in zip(streams, PROMPTS):
        check(not s.thread.is_alive(), f"{what}: '{prompt}' still streams")
        check(not s.errors, f"{what}: '{prompt}' got errors {s.errors}")
        check(s.finish == "length", f"{what}: '{prompt}' finished with {s.finish}")
        check(s.text == reference[prompt],
              f"{what}: '{prompt}' streamed {s.text!r}, without the fault {reference[prompt]!r}")
    after = http("GET", base + "/metrics")[1]
    restarts = metric(after, "xdeepserve_instance_restarts_total") - \
        metric(before, "xdeepserve_instance_restarts_total")
    recomputed = metric(after, "xdeepserve_requests_recomputed_total") - \
        metric(before, "xdeepserve_requests_recomputed_total")
    check(restarts == restarts_expected,
          f"{what}: instance restarts {restarts} (want {restarts_expected})")
    if restarts_expected:
        check(recomputed >= 1, f"{what}: requests recomputed {recomputed}")
    errors = metric(after, 'xdeepserve_requests_total{outcome="error"}')
    check(errors == 0, f"{what}: requests counted as errors: {errors}")
    # The gateway's own figure: from the instance's failure to each recomputed request's first
    # token (xdeepserve_fault_recovery_seconds).
    n = metric(after, "xdeepserve_fault_recovery_seconds_count") - \
        metric(before, "xdeepserve_fault_recovery_seconds_count")
    total = metric(after, "xdeepserve_fault_recovery_seconds_sum") - \
        metric(before, "xdeepserve_fault_recovery_seconds_sum")
    figures = {"stall_median_s": round(waits[len(waits) // 2], 3),
               "stall_max_s": round(waits[-1], 3),
               "failure_to_token_mean_s": round(total / n, 3) if n else None,
               "recomputed": int(recomputed), "health_503_seen": saw_503}
    print(f"{what}: {json.dumps(figures)}")
    return figures


def post_fault(base, fault):
    status, body, _ = http("POST", base + "/admin/faults", fault)
    check(status == 202, f"POST /admin/faults {fault}: {status} {body}")


def check_restart_limit(args):
    """--max-restarts 0: the first death ends the instance; streams end with an error naming
    it, serve exits non-zero, nothing is left behind."""
    what = "--max-restarts 0"
    served = Served(args.xdeepserve, args.model,
                    ["--dp", "2", "--kv-memory", "16M", "--threads-per-device", "1",
                     "--max-restarts", "0"])
    server = served.process
    try:
        check(wait_healthy(served.base, server), f"{what}: not healthy")
        started = descendants(server.pid)
        streams = batch(served.base)[:2]
        check(wait_all_started(streams), f"{what}: no tokens")
        victim = only(server, "xds-dp1")
        if victim:
            os.kill(victim, signal.SIGKILL)
        for s in streams:
            s.thread.join(60)
            check(not s.thread.is_alive(), f"{what}: a stream still waits")
            check(any("DP group 1" in str(e) and "signal 9" in str(e) for e in s.errors) or
                  s.finish == "length",
                  f"{what}: the stream ends with an error naming DP group 1: {s.errors}")
        try:
            code = server.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        check(code not in (None, 0), f"{what}: serve exit code {code} (want an error)")
        served.reader.join(5)
        log = "".join(served.output)
        check("DP group 1" in log and "restart" in log, f"{what}: the log: {log[-800:]}")
        deadline = time.time() + 10  # under load the orphans take a moment to die
        while True:
            left = [p for p in started if alive(p)]
            if not left or time.time() > deadline:
                break
            time.sleep(0.1)
        check(not left, f"{what}: processes left behind: {[(p, comm(p)) for p in left]}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    served = Served(args.xdeepserve, args.model,
                    ["--dp", "2", "--kv-memory", "16M", "--threads-per-device", "1",
                     "--compute-dtype", "f32", "--group-timeout", "2", "--instance-timeout", "5",
                     "--max-restarts", "10", "--fault-injection"])
    server, base = served.process, served.base
    timings = {}
    try:
        check(wait_healthy(base, server), "the server did not become healthy")
        streams = batch(base)
        for s in streams:
            s.thread.join(180)
        reference = {p: s.text for p, s in zip(PROMPTS, streams)}
        check(all(s.finish == "length" and not s.errors for s in streams),
              "the fault-free batch did not finish cleanly")

        def kill(name, sig):
            return lambda: os.kill(only(server, name), sig)

        timings["kill -9 DP group"] = check_recovered(
            "kill -9 xds-dp1", served, reference, kill("xds-dp1", signal.SIGKILL))
        stopped = []

        def stop_dp0():
            pid = only(server, "xds-dp0")
            stopped.append(pid)
            os.kill(pid, signal.SIGSTOP)

        timings["SIGSTOP of a DP group"] = check_recovered(
            "SIGSTOP xds-dp0", served, reference, stop_dp0)
        timings["kill -9 of the shell"] = check_recovered(
            "kill -9 xds-shell", served, reference, kill("xds-shell", signal.SIGKILL))
        timings["injected kill"] = check_recovered(
            "POST /admin/faults kill", served, reference,
            lambda: post_fault(base, {"kind": "kill", "group": 1, "after_steps": 4}))
        timings["injected hang"] = check_recovered(
            "POST /admin/faults hang", served, reference,
            lambda: post_fault(base, {"kind": "hang", "group": 0, "after_steps": 3}))
        # Bad memory: blocks retired under the running requests, which are recomputed inside the
        # group (preempted), without a restart; the blocks are counted.
        timings["retired KV blocks"] = check_recovered(
            "POST /admin/faults retire_kv_blocks", served, reference,
            lambda: post_fault(base, {"kind": "retire_kv_blocks", "group": 1, "blocks": 3}),
            restarts_expected=0)
        retired = metric(http("GET", base + "/metrics")[1], "xdeepserve_kv_blocks_retired_total")
        check(retired == 3, f"KV blocks retired: {retired} (want 3)")
        # A transient exchange error: the step is rolled back on both groups and run again --
        # no restart, nothing recomputed, the same text.
        rollbacks_before = metric(http("GET", base + "/metrics")[1],
                                  "xdeepserve_step_rollbacks_total")
        timings["exchange error"] = check_recovered(
            "POST /admin/faults exchange_error", served, reference,
            lambda: post_fault(base, {"kind": "exchange_error", "group": 0, "after_steps": 2}),
            restarts_expected=0)
        deadline = time.time() + 10  # the groups' loads reach the gateway about once a second
        while True:
            rollbacks = metric(http("GET", base + "/metrics")[1],
                               "xdeepserve_step_rollbacks_total") - rollbacks_before
            if rollbacks >= 2 or time.time() > deadline:
                break
            time.sleep(0.2)
        check(rollbacks == 2, f"step rollbacks counted {rollbacks} (want 2: one per group)")
        status, body, _ = http("GET", base + "/admin/faults")
        faults = json.loads(body).get("faults", []) if status == 200 else []
        check(len(faults) == 4 and all(any("restarted" in e["event"] for e in f["after"])
                                       for f in faults[:2]) and
              any("rolled a step back" in e["event"] for e in faults[3]["after"]),
              f"GET /admin/faults lists the faults and what followed: {status} {body[:900]}")
        status, _, _ = http("POST", base + "/admin/faults", {"kind": "explode"})
        check(status == 400, f"an unknown fault kind: {status} (want 400)")
        for pid in stopped:  # the frozen group was killed by the restart; nothing to resume
            check(not os.path.exists(f"/proc/{pid}") or comm(pid) == "",
                  f"the frozen DP group {pid} is still there")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    check(server.returncode == 0, f"serve exit code {server.returncode} after SIGTERM")
    print(json.dumps({"fault_figures": timings}))
    check_restart_limit(args)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
