#!/usr/bin/python3
"""Scale-down instead of restart, and rejoin (P119, docs/design/reliability.md): `xdeepserve
serve --dp 2 --redundant-slots 8 --expert-backup` with the shipped model (16 experts: each
group's 8 are copied into the other group's redundant slots once both are up). Under 16
concurrent streamed greedy completions:

  1. kill -9 of DP group 1: the instance goes on with group 0 alone -- no restart, only the
     requests group 1 held are recomputed (some, not all), every stream ends with the
     fault-free text, /health stays 200; /metrics counts the scale-down, EPLB and faults for
     the lost group are refused meanwhile. Group 1 starts again and joins group 0 (under load:
     every group leaves the fabric at one step boundary), the backup copies come back.
  2. a batch on the two groups again: the same texts.
  3. an injected hang of group 0: the heartbeat finds it, the shell kills it and group 1 goes
     on alone (renumbered: rank 0 of the new fabric), texts unchanged; group 0 rejoins.
Then SIGTERM ends serve with 0 although groups were lost on the way. (Without copies a loss
restarts the instance: e2e.serve_recovery.)
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import FAILURES, Served, check, http, metric, wait_healthy  # noqa: E402
from serve_recovery_test import PROMPTS, batch, only, post_fault, wait_all_started  # noqa: E402


def eplb_version(base):
    status, body, _ = http("GET", base + "/admin/eplb")
    return json.loads(body).get("map_version", 0) if status == 200 else 0


def wait_backup(base, above=1, timeout_s=120):
    """True once a map newer than `above` (the backup copies) is in force on every group."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status, body, _ = http("GET", base + "/admin/eplb")
        if status == 200:
            state = json.loads(body)
            if state.get("map_version", 0) > above and state.get("phase") == "idle" and \
                    "stopped" not in state:
                return True
        time.sleep(0.2)
    return False


def wait_groups(base, n, timeout_s=120):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if metric(http("GET", base + "/metrics")[1], "xdeepserve_instance_groups") == n:
            return True
        time.sleep(0.1)
    return False


def run_batch(what, served, reference, strike=None, health_stays_up=False):
    """16 streams; `strike()` once all have tokens; every stream must end as `reference`.
    Returns (restarts, scale-downs, recomputed) counted meanwhile."""
    base = served.base
    before = http("GET", base + "/metrics")[1]
    streams = batch(base)
    check(wait_all_started(streams), f"{what}: the streams did not start")
    health = []
    if strike:
        strike()
        deadline = time.time() + 20
        while time.time() < deadline and any(s.thread.is_alive() for s in streams):
            health.append(http("GET", base + "/health", timeout=10)[0])
            time.sleep(0.2)
    for s in streams:
        s.thread.join(180)
    for s, prompt in zip(streams, PROMPTS):
        check(not s.thread.is_alive(), f"{what}: '{prompt}' still streams")
        check(not s.errors, f"{what}: '{prompt}' got errors {s.errors}")
        check(s.finish == "length", f"{what}: '{prompt}' finished with {s.finish}")
        if reference is not None:
            check(s.text == reference[prompt],
                  f"{what}: '{prompt}' streamed {s.text!r}, without the fault "
                  f"{reference[prompt]!r}")
    if health_stays_up:
        check(all(h == 200 for h in health), f"{what}: /health answered {sorted(set(health))}")
    after = http("GET", base + "/metrics")[1]
    d = [metric(after, n) - metric(before, n) for n in (
        "xdeepserve_instance_restarts_total", "xdeepserve_instance_scale_downs_total",
        "xdeepserve_requests_recomputed_total")]
    print(f"{what}: restarts {d[0]:.0f}, scale-downs {d[1]:.0f}, recomputed {d[2]:.0f}")
    return {p: s.text for p, s in zip(PROMPTS, streams)}, d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    served = Served(args.xdeepserve, args.model,
                    ["--dp", "2", "--kv-memory", "16M", "--threads-per-device", "1",
                     "--compute-dtype", "f32", "--redundant-slots", "8", "--expert-backup",
                     "--group-timeout", "4", "--max-restarts", "5", "--fault-injection"])
    server, base = served.process, served.base
    try:
        check(wait_healthy(base, server), "the server did not become healthy")
        check(wait_backup(base), "the backup copies did not come into force")
        reference, _ = run_batch("fault-free", served, None)
        killed = []

        def kill_dp1():
            killed.append(only(server, "xds-dp1"))
            os.kill(killed[0], signal.SIGKILL)
            check(wait_groups(base, 1, 30), "instance_groups did not drop to 1")
            # While group 1 is out (it is loading again): EPLB stopped, faults for it refused.
            status, body, _ = http("POST", base + "/admin/eplb/rebalance", {})
            check(status == 409 and "lost" in body, f"EPLB while scaled down: {status} {body}")
            status, body, _ = http("POST", base + "/admin/faults", {"kind": "kill", "group": 1})
            check(status == 400 and "lost" in body, f"a fault for the lost group: {status} {body}")

        version = eplb_version(base)
        _, (restarts, downs, recomputed) = run_batch(
            "kill -9 xds-dp1", served, reference, kill_dp1, health_stays_up=True)
        check(restarts == 0 and downs == 1, f"kill -9 xds-dp1: restarts {restarts}, "
              f"scale-downs {downs} (want 0 and 1)")
        check(1 <= recomputed <= 15, f"only group 1's requests are recomputed: {recomputed}")
        check(wait_groups(base, 2), "group 1 did not join again")
        check(wait_backup(base, version), "the backup copies did not come back after the rejoin")
        again = only(server, "xds-dp1")
        check(again is not None and again not in killed, f"a new xds-dp1: {again} {killed}")

        _, (restarts, downs, recomputed) = run_batch("after the rejoin", served, reference)
        check(restarts == 0 and downs == 0 and recomputed == 0,
              f"after the rejoin: restarts {restarts}, scale-downs {downs}, recomputed "
              f"{recomputed}")

        version = eplb_version(base)
        _, (restarts, downs, recomputed) = run_batch(
            "injected hang of group 0", served, reference,
            lambda: post_fault(base, {"kind": "hang", "group": 0, "after_steps": 2}))
        check(restarts == 0 and downs == 1 and recomputed >= 1,
              f"hang: restarts {restarts}, scale-downs {downs}, recomputed {recomputed}")
        log = "".join(served.output)
        check("goes on with DP groups 1" in log, "the log names the group that goes on")
        check(wait_groups(base, 2), "group 0 did not join again")
        check(wait_backup(base, version), "the backup copies did not come back (group 0)")
        status, body, _ = http("GET", base + "/admin/faults")
        events = [e["event"] for f in json.loads(body).get("faults", []) for e in f["after"]] \
            if status == 200 else []
        check(any("scaled down" in e for e in events) and any("joined again" in e for e in events),
              f"GET /admin/faults: {events}")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    check(server.returncode == 0, f"serve exit code {server.returncode} after SIGTERM "
          f"(log tail: {''.join(served.output)[-1500:]})")
    if FAILURES:
        print("serve's log (tail):\n" + "".join(served.output)[-30000:])
        print(f"{len(FAILURES)} check(s) failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
