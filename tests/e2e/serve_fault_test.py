#!/usr/bin/python3
"""An instance that may not restart fails cleanly, and SIGTERM drains.

With --max-restarts 0 (recovery itself is serve_recovery_test.py), `kill -9` of the instance's
shell (`xds-shell` in /proc/PID/comm) under a streamed request: the supervisor gives up, the
stream ends within seconds with an error instead of waiting for tokens that never come,
`xdeepserve serve` exits with an error naming what happened, and no process of it is left
behind. Then SIGTERM under a stream: with --shutdown-timeout 60 the stream is drained to its
end; with 0 the server stops at once and the stream ends; both exit 0.
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
from serve_e2e_test import (FAILURES, Served, alive, check, comm, descendants,  # noqa: E402
                            wait_healthy)

def start_stream(base, max_tokens):
    """A streamed greedy completion in a thread: (thread, its data events, set at the first)."""
    events, first_token = [], threading.Event()

    def stream():
        body = {"prompt": "In the beginning", "max_tokens": max_tokens, "temperature": 0,
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
    return t, events, first_token


def check_drain(args, shutdown_timeout, max_tokens):
    """SIGTERM under a stream: with time enough (60 s) the stream finishes whole; with
    --shutdown-timeout 0 the server stops at once (plus the instance's own stop) and the stream
    ends rather than hangs. Either way serve exits 0."""
    what = f"SIGTERM, --shutdown-timeout {shutdown_timeout}, {max_tokens} tokens"
    served = Served(args.xdeepserve, args.model,
                    ["--kv-memory", "16M", "--threads-per-device", "1", "--shutdown-timeout",
                     str(shutdown_timeout)])
    server = served.process
    try:
        check(wait_healthy(served.base, server), f"{what}: not healthy")
        t, events, first_token = start_stream(served.base, max_tokens)
        check(first_token.wait(60), f"{what}: no token before SIGTERM")
        server.send_signal(signal.SIGTERM)
        sent_at = time.time()
        try:
            code = server.wait(shutdown_timeout + 30)
        except subprocess.TimeoutExpired:
            code = None
        stopped_in = time.time() - sent_at
        check(code == 0, f"{what}: exit code {code} after {stopped_in:.1f} s (want 0)")
        t.join(10)
        check(not t.is_alive(), f"{what}: the stream still waits after the server stopped")
        finished = [e for e in events if '"finish_reason":"length"' in e.replace(" ", "")]
        if shutdown_timeout >= 30:
            check(finished and events[-1] == "[DONE]",
                  f"{what}: the stream was cut, not drained: {events[-2:]}")
        else:  # whether the stream got to its end first depends on the machine's speed
            check(stopped_in < shutdown_timeout + 15, f"{what}: stopped after {stopped_in:.1f} s")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def check_kill(args, victim, said):
    """kill -9 of the process named `victim`; `said`: what the error and the log must name."""
    served = Served(args.xdeepserve, args.model,
                    ["--dp", "2", "--kv-memory", "16M", "--threads-per-device", "1",
                     "--max-restarts", "0"])
    server, base, output, reader = served.process, served.base, served.output, served.reader
    try:
        check(wait_healthy(base, server), "the server did not become healthy")
        started = descendants(server.pid)
        victims = [p for p in started if comm(p) == victim]
        check(len(victims) == 1, f"one process named {victim} among {[comm(p) for p in started]}")

        t, events, first_token = start_stream(base, 480)
        check(first_token.wait(60), "no token before the kill")
        killed_at = time.time()
        if victims:
            os.kill(victims[0], signal.SIGKILL)
        t.join(30)
        check(not t.is_alive(), f"{victim}: the stream still waits 30 s after the kill")
        check(time.time() - killed_at < 15, f"{victim}: the stream took more than 15 s to end")
        errors = [e for e in events if '"error"' in e]
        check(errors and all(w in errors[-1] for w in said),
              f"{victim}: the stream ends with an error naming {said}: {events[-3:]}")
        try:
            code = server.wait(30)
        except subprocess.TimeoutExpired:
            code = None
        check(code not in (None, 0), f"{victim}: serve exit code {code} (want an error)")
        reader.join(5)
        log = "".join(output)
        check(all(w in log for w in said), f"{victim}: the log names {said}: {log[-800:]}")
        # The instance's processes die with it (SIGKILL on their parent's death); under load
        # that takes a moment. A zombie (exited, not yet reaped by init) holds nothing.
        deadline = time.time() + 10
        while True:
            left = [p for p in started if alive(p)]
            if not left or time.time() > deadline:
                break
            time.sleep(0.1)
        check(not left, f"{victim}: processes left behind: {[(p, comm(p)) for p in left]}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for p in descendants(server.pid):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    check_kill(args, "xds-shell", ["the instance exited"])
    check_drain(args, shutdown_timeout=60, max_tokens=48)
    check_drain(args, shutdown_timeout=0, max_tokens=480)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
