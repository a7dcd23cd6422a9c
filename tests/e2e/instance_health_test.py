#!/usr/bin/python3
"""`xdeepserve instance --health-port`: the readiness endpoint of a real instance.

Starts an instance of the shipped model alone (its own cluster secret file) with
--health-port, polls GET /health: every answer before the first 200 is a 503 (or no listener
yet), and a 200 comes; then a gateway started in front of it serves a completion at once
(ready meant ready). SIGTERM stops both cleanly. Also: --health-port with a --listen that is
not tcp://HOST:PORT is refused, naming the address.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
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


def get(url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start(argv, log):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=lambda: log.extend(p.stdout), daemon=True).start()
    return p


def stop(p, what):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            check(False, f"{what} did not stop within 60 s of SIGTERM")
    check(p.returncode == 0, f"{what} exited with {p.returncode}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="xds-health-")
    secret = os.path.join(tmp, "cluster-secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)

    r = subprocess.run([args.xdeepserve, "instance", "--model", args.model,
                        "--cluster-secret-file", secret, "--listen", "ipc://@xds-health-test",
                        "--health-port", str(free_port())],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode != 0 and "ipc://@xds-health-test" in r.stderr,
          f"--health-port with an ipc --listen: exit {r.returncode}, {r.stderr[-300:]}")

    shell_port, health_port, http_port = free_port(), free_port(), free_port()
    ilog, glog = [], []
    instance = start([args.xdeepserve, "instance", "--model", args.model,
                      "--cluster-secret-file", secret,
                      "--listen", f"tcp://127.0.0.1:{shell_port}",
                      "--health-port", str(health_port), "--threads-per-device", "1",
                      "--kv-memory", "64M", "--max-num-seqs", "4"], ilog)
    gateway = None
    try:
        statuses = []
        deadline = time.time() + 180
        while time.time() < deadline and instance.poll() is None:
            try:
                status, body = get(f"http://127.0.0.1:{health_port}/health")
                statuses.append(status)
                if status == 200:
                    check(json.loads(body).get("status") == "ready", f"200 body {body}")
                    break
                check(status == 503 and json.loads(body).get("status") == "starting",
                      f"before ready: {status} {body}")
            except OSError:
                statuses.append("refused")
            time.sleep(0.05)
        check(statuses and statuses[-1] == 200, f"never ready: {statuses[-5:]}")
        print(f"health: {len(statuses) - 1} answer(s) before ready "
              f"({sum(s == 503 for s in statuses)} x 503), then 200")

        gateway = start([args.xdeepserve, "gateway", "--model", args.model,
                         "--cluster-secret-file", secret, "--port", str(http_port),
                         "--instances", f"tcp://127.0.0.1:{shell_port}"], glog)
        base = f"http://127.0.0.1:{http_port}"
        status = None
        deadline = time.time() + 60
        while time.time() < deadline and gateway.poll() is None:
            try:
                status, body = get(base + "/v1/completions", {
                    "model": os.path.basename(args.model.rstrip("/")),
                    "prompt": "In the beginning", "max_tokens": 4}, timeout=120)
                break
            except OSError:
                time.sleep(0.2)
        check(status == 200, f"a completion through the gateway: {status}")
    finally:
        if gateway is not None:
            stop(gateway, "the gateway")
        stop(instance, "the instance")
    if FAILURES:
        print("---- instance log ----\n" + "".join(ilog[-30:]), file=sys.stderr)
        print("---- gateway log ----\n" + "".join(glog[-20:]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
