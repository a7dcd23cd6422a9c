#!/usr/bin/python3
"""A device process killed outright fails the instance cleanly (no failover yet): requests in
flight end with an error instead of waiting for tokens that never come, `xdeepserve serve`
exits with an error naming the dead process, and no process of it is left behind.

The server runs --dp 2; a streamed request decodes; then `kill -9` hits one DP group
(`xds-dp1` in /proc/PID/comm). Checked: the stream ends with an error event naming the group
within seconds, the server process exits non-zero, its stderr names the group and the
signal, and every process it had started is gone.
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
from serve_e2e_test import Served, comm, descendants, wait_healthy  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    served = Served(args.xdeepserve, args.model,
                    ["--dp", "2", "--kv-memory", "16M", "--threads-per-device", "1"])
    server, base, output, reader = served.process, served.base, served.output, served.reader
    try:
        check(wait_healthy(base, server), "the server did not become healthy")
        started = descendants(server.pid)
        victims = [p for p in started if comm(p) == "xds-dp1"]
        check(len(victims) == 1, f"one process named xds-dp1 among {[comm(p) for p in started]}")

        events, first_token = [], threading.Event()

        def stream():
            body = {"prompt": "In the beginning", "max_tokens": 480, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                         method="POST")
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    for line in r:
                        line = line.decode().strip()
                        if line.startswith("data: "):
                            events.append(line[6:])
                            first_token.set()
            except Exception as e:  # noqa: BLE001 -- a dropped connection is an outcome too
                events.append(f"exception: {e}")
            first_token.set()

        t = threading.Thread(target=stream)
        t.start()
        check(first_token.wait(60), "no token before the kill")
        killed_at = time.time()
        if victims:
            os.kill(victims[0], signal.SIGKILL)
        t.join(30)
        check(not t.is_alive(), "the stream still waits 30 s after the kill")
        check(time.time() - killed_at < 15, "the stream took more than 15 s to end")
        errors = [e for e in events if '"error"' in e]
        check(errors and "DP group 1" in errors[-1] and "signal 9" in errors[-1],
              f"the stream ends with an error naming the group: {events[-3:]}")
        try:
            code = server.wait(30)
        except subprocess.TimeoutExpired:
            code = None
        check(code not in (None, 0), f"serve exit code {code} (want an error)")
        reader.join(5)
        log = "".join(output)
        check("DP group 1" in log and "signal 9" in log, f"the log names the death: {log[-800:]}")
        time.sleep(0.5)
        left = [p for p in started if os.path.exists(f"/proc/{p}") and comm(p)]
        check(not left, f"processes left behind: {[(p, comm(p)) for p in left]}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for p in descendants(server.pid):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
