#!/usr/bin/python3
"""Membership in etcd, end to end, against a real etcd (Debian's etcd-server; the test is
skipped, exit 77, with the reason when /usr/bin/etcd is missing).

1. `gateway --etcd` starts with no instance registered: /health and a completion answer 503 at
   once, naming the etcd prefix.
2. `instance --etcd --etcd-ttl 3` on the shipped model registers once its DP group is up: its
   entry (address, role, model, groups) is under the prefix with a lease, and the gateway
   serves a chat completion and a greedy completion through it, the latter equal to
   `xdeepserve generate` (one process, no gateway).
3. The instance is killed with SIGKILL (every process at once, as a host dying): its entry
   goes within the TTL, the gateway drops it within the TTL + margin, and a completion then
   gets a 503 at once (not a hang).
4. A second instance registering later is picked up by the watch and serves the same output.
5. SIGTERM: a clean shutdown revokes its lease; the entry goes at once.
"""
import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import descendants, free_port, http, wait_healthy  # noqa: E402
from serve_pd_test import cluster_secret, spawn, stop_process  # noqa: E402
from serve_spec_test import check, failures, generate  # noqa: E402

ETCD = "/usr/bin/etcd"
PREFIX = "/xds-e2e/instances/"
TTL_S = 3
MARGIN_S = 5  # etcd checks lease expiry every 500 ms; the watch and the gateway add little
PROMPT = "In the beginning"
MAX_TOKENS = 12


def etcd_call(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read().decode())


def b64(s):
    return base64.b64encode(s.encode()).decode()


def entries(url):
    """{key: (value as JSON, lease)} under PREFIX ('/' + 1 = '0' ends the range)."""
    out = etcd_call(url, "/v3/kv/range", {"key": b64(PREFIX), "range_end": b64(PREFIX[:-1] + "0")})
    return {base64.b64decode(kv["key"]).decode():
            (json.loads(base64.b64decode(kv.get("value", "")).decode()), kv.get("lease", "0"))
            for kv in out.get("kvs", [])}


class Etcd:
    """etcd on free client and peer ports with a temporary data directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="xds_etcd_e2e_")
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.proc = subprocess.Popen(
            [ETCD, "--name", "e2e", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"e2e={peer_url}"],
            stdout=open(os.path.join(self.dir, "etcd.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline and self.proc.poll() is None:
            try:
                entries(self.url)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"etcd did not start (see {self.dir}/etcd.log)")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for(cond, limit_s):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def start_instance(args, etcd, secret, port):
    return spawn([args.xdeepserve, "instance", "--model", args.model, "--listen",
                  f"tcp://127.0.0.1:{port}", "--threads-per-device", "1", "--compute-dtype",
                  "f32", "--kv-memory", "16M", "--cluster-secret-file", secret, "--etcd",
                  etcd.url, "--etcd-prefix", PREFIX, "--etcd-ttl", str(TTL_S)])


def complete(base, timeout=300):
    return http("POST", base + "/v1/completions",
                body={"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                      "ignore_eos": True}, timeout=timeout)


def check_serves(base, ref, what):
    status, text, _ = complete(base)
    check(status == 200, f"{what}: completion {status} {text[:300]}")
    if status == 200:
        got = json.loads(text)["choices"][0]["text"]
        check(got == ref, f"{what}: {got!r} != generate's {ref!r}")


def check_no_instance(base, what):
    """A completion answered 503 naming the prefix, not held until the recovery timeout
    (120 s): a client timeout of 20 s fails the test on a hang."""
    try:
        status, text, _ = complete(base, timeout=20)
    except OSError as e:
        check(False, f"{what}: no answer ({e})")
        return
    check(status == 503 and PREFIX in text and "no_instance" in text,
          f"{what}: completion {status} {text[:300]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    if not os.access(ETCD, os.X_OK):
        print(f"SKIPPED: {ETCD} is not installed (Debian's etcd-server)")
        return 77
    ref = generate(args, PROMPT, MAX_TOKENS)
    etcd = Etcd()
    secret = cluster_secret()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # The heartbeat timeout is long: what drops the killed instance here is its lease.
    gateway = spawn([args.xdeepserve, "gateway", "--model", args.model, "--port", str(port),
                     "--cluster-secret-file", secret, "--etcd", etcd.url, "--etcd-prefix",
                     PREFIX, "--instance-timeout", "60"])
    instances = []
    try:
        # 1. No instance yet.
        def health():
            try:
                return http("GET", base + "/health", timeout=5)
            except OSError:
                return (0, "", {})
        check(wait_for(lambda: health()[0] == 503, 30), "gateway: /health never answered")
        status, text, _ = health()
        check(status == 503 and PREFIX in text, f"no instance: /health {status} {text[:300]}")
        check_no_instance(base, "no instance registered yet")

        # 2. The first instance registers and serves.
        ports = [free_port(), free_port()]
        instances.append(start_instance(args, etcd, secret, ports[0]))
        check(wait_healthy(base, gateway, timeout_s=180), "first instance: never healthy")
        key = PREFIX + f"127.0.0.1:{ports[0]}"
        e = entries(etcd.url)
        check(key in e, f"first instance: entries {sorted(e)}")
        if key in e:
            value, lease = e[key]
            check(value.get("address") == f"tcp://127.0.0.1:{ports[0]}" and
                  value.get("role") == "colocated" and value.get("groups") == [0] and
                  value.get("model") == os.path.basename(args.model.rstrip("/")),
                  f"first instance: entry {value}")
            check(lease not in ("", "0"), "first instance: its entry has no lease")
        status, text, _ = http("POST", base + "/v1/chat/completions",
                               body={"messages": [{"role": "user", "content": PROMPT}],
                                     "max_tokens": 8, "temperature": 0, "ignore_eos": True},
                               timeout=300)
        check(status == 200, f"first instance: chat completion {status} {text[:300]}")
        if status == 200:
            r = json.loads(text)
            check(r["usage"]["completion_tokens"] == 8 and r["choices"][0]["message"]["content"],
                  f"first instance: chat answer {r}")
        check_serves(base, ref, "first instance")

        # 3. SIGKILL of every process of the instance at once.
        victim = instances[0]
        pids = [victim.pid] + descendants(victim.pid)
        killed_at = time.time()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        victim.wait()
        check(wait_for(lambda: key not in entries(etcd.url), TTL_S + MARGIN_S),
              f"killed instance: its entry outlived the TTL ({TTL_S} s) + {MARGIN_S} s")
        check(wait_for(lambda: health()[0] == 503 and PREFIX in health()[1], TTL_S + MARGIN_S),
              f"killed instance: the gateway kept it: /health {health()}")
        print(f"killed instance dropped {time.time() - killed_at:.1f} s after SIGKILL")
        check_no_instance(base, "after the kill")

        # 4. A second instance, registered later, is picked up by the watch.
        instances.append(start_instance(args, etcd, secret, ports[1]))
        check(wait_healthy(base, gateway, timeout_s=180), "second instance: never healthy")
        check_serves(base, ref, "second instance")

        # 5. A clean shutdown revokes the lease.
        key2 = PREFIX + f"127.0.0.1:{ports[1]}"
        check(key2 in entries(etcd.url), "second instance: no entry")
        stop_process(instances[1], "second instance")
        check(key2 not in entries(etcd.url), "second instance: its entry outlived its shutdown")
        check(wait_for(lambda: health()[0] == 503, 5), "second instance: the gateway kept it")
    finally:
        for p in instances:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop_process(gateway, "gateway")
        etcd.stop()
        shutil.rmtree(os.path.dirname(secret), ignore_errors=True)
    if failures:
        print(f"{len(failures)} failure(s)", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
