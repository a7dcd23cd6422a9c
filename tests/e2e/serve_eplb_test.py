#!/usr/bin/python3
"""End to end: EPLB rebalances while `xdeepserve serve --dp 2` is under continuous load.

1. Reference: the same server without EPLB (--redundant-slots 0) answers a fixed set of
   greedy prompts (--compute-dtype f32, logprobs for the margins).
2. EPLB run (--redundant-slots 2, --eplb-window 0.5): client threads keep sending those
   prompts; after a few windows POST /admin/eplb/rebalance; the load goes on until the new map
   is in force and a while after. Checks: every request succeeded; every greedy output equals
   the reference, or first differs where the reference's top-2 logprob margin is within the
   numerics contract's tolerance (replicas change the order of the combine's sums only); both
   devices disabled the spare slots at the same step and switched to the new map at the same
   step (GET /admin/eplb, /metrics); the new map has replicas; a second rebalance while one
   runs is 409; admin calls need the API key (401); an unknown admin path is 404.
3. Fault: XDS_EPLB_FAIL_LOAD=1 makes device 1 fail loading a replica's weights: the
   rebalance aborts on every device, the map stays version 1, requests keep succeeding.
4. Without --redundant-slots, POST /admin/eplb/rebalance is 400.
The servers are stopped with SIGTERM and must exit cleanly.
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
KEY = "eplb-key"
# |logprob(top1) - logprob(top2)| below this: a tie within the f32 contract (1e-4 relative of
# logits of a few units); the outputs may part there.
MARGIN = 1e-3
PROMPTS = [
    "In the beginning God created",
    "And the earth was without form",
    "The LORD is my shepherd",
    "Blessed are the meek",
    "And God said, Let there be light",
    "For God so loved the world",
    "Now faith is the substance",
    "Vanity of vanities, saith the Preacher",
]
MAX_TOKENS = 24


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, key=KEY, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return -1, str(e)


class Server:
    def __init__(self, args, extra, env=None):
        self.port, iport = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(self.port),
               "--instance-port", str(iport), "--api-key", KEY, "--dp", "2",
               "--compute-dtype", "f32", "--max-num-seqs", "16", "--kv-memory", "64M",
               "--threads-per-device", "1", "--served-model-name", "kjv"] + extra
        e = dict(os.environ)
        e.pop("XDS_EPLB_FAIL_LOAD", None)
        e.update(env or {})
        self.log = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=e)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.time() + 120
        while time.time() < deadline and self.proc.poll() is None:
            if http("GET", self.base + "/health", timeout=5)[0] == 200:
                return
            time.sleep(0.3)
        raise RuntimeError("server did not become healthy:\n" + "".join(self.log[-40:]))

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "killed after 120 s"
        check(rc == 0, f"server exits cleanly after SIGTERM (got {rc})")
        if FAILURES:
            print("---- server log (last 60 lines) ----\n" + "".join(self.log[-60:]),
                  file=sys.stderr)


def complete(base, prompt):
    """(ok, tokens, margins, error): greedy completion with top-2 logprobs."""
    status, body = http("POST", base + "/v1/completions",
                        {"model": "kjv", "prompt": prompt, "max_tokens": MAX_TOKENS,
                         "temperature": 0, "logprobs": 2})
    if status != 200:
        return False, None, None, f"{status}: {body[:300]}"
    choice = json.loads(body)["choices"][0]
    lp = choice["logprobs"]
    margins = []
    for top in lp["top_logprobs"]:
        v = sorted(top.values(), reverse=True)
        margins.append(v[0] - v[1] if len(v) > 1 else float("inf"))
    return True, lp["tokens"], margins, ""


def agree(ref, got, what):
    """Equal, or parting first where the reference's margin is within MARGIN."""
    _, rtok, rmargin, _ = ref
    _, gtok, _, _ = got
    for i, (a, b) in enumerate(zip(rtok, gtok)):
        if a != b:
            return check(rmargin[i] < MARGIN,
                         f"{what}: token {i} {b!r} differs from the reference {a!r} "
                         f"(reference margin {rmargin[i]:.2e} >= {MARGIN})")
    return check(len(rtok) == len(gtok), f"{what}: {len(gtok)} tokens, reference {len(rtok)}")


def eplb_state(base):
    status, body = http("GET", base + "/admin/eplb")
    check(status == 200, f"GET /admin/eplb is 200 (got {status}: {body[:200]})")
    return json.loads(body) if status == 200 else {}


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    check(False, f"{what} within {timeout} s")
    return None


class Load:
    """Client threads sending the prompts in a loop, checking each answer against ref."""

    def __init__(self, base, ref, threads=4):
        self.base, self.ref = base, ref
        self.stop_flag = threading.Event()
        self.done = 0
        self.errors = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(k,)) for k in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, k):
        i = k
        while not self.stop_flag.is_set():
            p = PROMPTS[i % len(PROMPTS)]
            got = complete(self.base, p)
            with self.lock:
                if not got[0]:
                    self.errors.append(got[3])
                else:
                    agree(self.ref[p], got, f"under load, prompt {p!r}")
                    self.done += 1
            i += 1

    def finish(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=300)
        check(not self.errors, f"every request under load succeeded ({self.errors[:3]})")
        return self.done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    shm_before = set(os.listdir("/dev/shm"))

    # 1. Reference, and EPLB off: 400.
    s = Server(args, [])
    try:
        ref = {p: complete(s.base, p) for p in PROMPTS}
        for p, r in ref.items():
            check(r[0], f"reference completion of {p!r}: {r[3]}")
        status, body = http("POST", s.base + "/admin/eplb/rebalance")
        check(status == 400 and "redundant-slots" in body,
              f"rebalance without --redundant-slots is 400 naming the flag ({status}: {body[:200]})")
    finally:
        s.stop()
    if FAILURES:
        return 1

    # 2. Rebalance under continuous load.
    s = Server(args, ["--redundant-slots", "2", "--eplb-window", "0.5", "--eplb-slices", "6"])
    try:
        status, _ = http("POST", s.base + "/admin/eplb/rebalance", key=None)
        check(status == 401, f"rebalance without the API key is 401 (got {status})")
        status, _ = http("GET", s.base + "/admin/eplb", key="wrong")
        check(status == 401, f"GET /admin/eplb with a wrong key is 401 (got {status})")
        status, _ = http("GET", s.base + "/admin/nothing")
        check(status == 404, f"an unknown admin path is 404 (got {status})")
        st = eplb_state(s.base)
        check(st.get("map_version") == 1 and st.get("enabled") is True,
              f"EPLB starts enabled on map v1: {st.get('map_version')}, {st.get('enabled')}")
        load = Load(s.base, ref)
        wait_for(lambda: eplb_state(s.base).get("slices", 0) >= 3, 60, "three collect windows")
        status, body = http("POST", s.base + "/admin/eplb/rebalance")
        check(status == 202, f"rebalance is 202 (got {status}: {body[:300]})")
        planned = json.loads(body).get("version") if status == 202 else None
        check(planned == 3, f"the planned map is v3 (got {planned})")
        status2, body2 = http("POST", s.base + "/admin/eplb/rebalance")
        # The reconfiguration may already be done on a fast machine; then a new one starts.
        check(status2 in (409, 202), f"a second rebalance is 409 or starts anew ({status2})")
        done = wait_for(lambda: (lambda st: st if st.get("map_version", 0) >= 3 and
                                 st.get("phase") == "idle" else None)(eplb_state(s.base)),
                        120, "the new map in force")
        before = load.done
        wait_for(lambda: load.done >= before + 16, 120, "16 more requests after the switch")
        n = load.finish()
        print(f"eplb: {n} requests under load", file=sys.stderr)
        if done:
            last = done.get("last_rebalance", {})
            sw, ds = last.get("switch_step", []), last.get("disable_step", [])
            check(len(sw) == 2 and len(set(sw)) == 1 and sw[0] >= 0,
                  f"both devices switched to the new map at the same step: {sw}")
            check(len(ds) == 2 and len(set(ds)) == 1 and ds[0] >= 0 and (not sw or ds[0] < sw[0]),
                  f"both devices disabled the spare slots at the same, earlier step: {ds} {sw}")
            reps = [len(r) for layer in done["layers"] for r in layer["replicas"]]
            check(max(reps) >= 2, f"the new map has replicas (copies per expert {max(reps)})")
            check(done.get("rebalances_done", 0) >= 1, "rebalances_done counts it")
            check(any(b > 0 for b in last.get("loaded_bytes", [])), "replica weights were loaded")
        status, metrics = http("GET", s.base + "/metrics", key=None)
        check("xdeepserve_eplb_map_version" in metrics and
              'xdeepserve_eplb_rebalances_total{result="done"}' in metrics and
              "xdeepserve_eplb_device_tokens_total{" in metrics and
              'xdeepserve_eplb_device_load_max_mean{' in metrics,
              "/metrics has the EPLB series")
        # Tokens reached the replicas: some redundant slot (index >= E / N) computed rows.
        per = done["n_experts"] // done["n_devices"] if done else 0
        spare = 0.0
        for line in metrics.splitlines():
            m = re.match(r'xdeepserve_eplb_slot_tokens_total\{layer="\d+",device="\d+",slot="(\d+)"\} (\S+)$',
                         line)
            if m and int(m.group(1)) >= per:
                spare += float(m.group(2))
        check(spare > 0, f"tokens reached the replicas in the redundant slots ({spare})")
        if done:
            print(f"eplb: switched {done.get('last_rebalance')}", file=sys.stderr)
        steps = [line for line in metrics.splitlines()
                 if line.startswith("xdeepserve_eplb_switch_step{")]
        check(len(steps) == 2 and len({l.rsplit(" ", 1)[1] for l in steps}) == 1,
              f"xdeepserve_eplb_switch_step is the same on both devices: {steps}")
        # After the switch, a fresh pass over every prompt still agrees with the reference.
        for p in PROMPTS:
            got = complete(s.base, p)
            if check(got[0], f"after the switch, {p!r}: {got[3]}"):
                agree(ref[p], got, f"after the switch, prompt {p!r}")
    finally:
        s.stop()

    # 3. A failure while loading a replica's weights aborts on every device; the map stays.
    s = Server(args, ["--redundant-slots", "2", "--eplb-window", "0.5"],
               env={"XDS_EPLB_FAIL_LOAD": "1"})
    try:
        load = Load(s.base, ref, threads=2)
        wait_for(lambda: eplb_state(s.base).get("slices", 0) >= 2, 60, "two collect windows")
        status, body = http("POST", s.base + "/admin/eplb/rebalance")
        check(status == 202, f"rebalance is accepted before the failure (got {status}: {body[:200]})")
        st = wait_for(lambda: (lambda st: st if st.get("rebalances_failed", 0) >= 1 and
                               st.get("phase") == "idle" else None)(eplb_state(s.base)),
                      60, "the reconfiguration aborted")
        if st:
            check(st.get("map_version") == 1, f"the old map stays in force (v{st.get('map_version')})")
            check("injected failure" in st.get("last_error", ""),
                  f"the error names the injected failure: {st.get('last_error')!r}")
            check(st.get("rebalances_done") == 0, "no rebalance counted as done")
        before = load.done
        wait_for(lambda: load.done >= before + 8, 120, "8 more requests after the abort")
        load.finish()
        log = "".join(s.log)
        check(log.count("not prepared") >= 1, "device 1 logged the failed prepare")
    finally:
        s.stop()

    leaked = set(os.listdir("/dev/shm")) - shm_before
    check(not leaked, f"nothing left in /dev/shm: {sorted(leaked)[:5]}")
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("serve_eplb: all checks passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
