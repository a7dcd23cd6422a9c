#!/usr/bin/python3
"""Prefill/decode disaggregation served end to end (DistFlow).

The reference is `xdeepserve generate` (one process, one sequence, f32, greedy): the KV a
decode instance pulls must be the KV the prefill instance computed, so every output equals the
reference exactly (the shipped model's greedy margins are wide).

1. `serve --prefill-instances 1 --decode-instances 1`: concurrent requests, a long prompt
   twice (the second from the prefill side's prefix cache), streamed, max_tokens 1 (finishes on
   the prefill side: no transfer), 2 and 5, a stop string, EOS, n = 2 (served whole by the
   prefill instance), seeded sampling reproducible; once idle no KV block held anywhere, no
   transfer parked, one transfer completed per request that went on to decode.
   The same with MTP speculation (k = 2) on both sides.
2. The parts started separately (`instance --role prefill`, `instance --role decode` with a KV
   cache that holds one request at a time, `gateway --instances A,B`): 6 concurrent requests
   all complete exactly (the decode side's backpressure deferred handoffs, nothing dropped);
   then the decode instance's device process is killed with a handoff parked for it: the
   request is recomputed whole on the prefill instance and completes exactly, without an
   error (docs/design/reliability.md), the prefill side frees the parked KV at
   --kv-transfer-timeout, and the gateway serves new requests whole on the prefill instance
   while the decode instance restarts.
3. Two prefill instances (routing by cached blocks; one killed whole while a request it
   prefilled decodes), and two decode instances, one killed while six requests decode: every
   request completes exactly.
"""
import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import comm, descendants, free_port, http, metric, wait_healthy  # noqa: E402
# The reference generation and the failure list of the speculative-decoding test.
from serve_spec_test import check, failures, generate  # noqa: E402

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed is the man",
           "And it came to pass", "Now the serpent"]
LONG = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters.")
MAX_TOKENS = 32
LONG_OUTPUT = 400
EOS_PROMPT = "Blessed is the man"

def sum_metric(text, name):
    """Sum of a per-group gauge over every group line."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Client:
    def __init__(self, base):
        self.base = base

    def complete(self, expect=200, **body):
        status, text, _ = http("POST", self.base + "/v1/completions", body=body, timeout=600)
        check(status == expect, f"completion {body}: {status} {text[:300]}")
        return json.loads(text) if status == 200 else {"choices": [{}], "usage": {}, "raw": text}

    def stream(self, **body):
        body["stream"] = True
        req = urllib.request.Request(self.base + "/v1/completions",
                                     data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        text, finish, error = "", None, None
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]
                for c in event.get("choices", []):
                    text += c.get("text", "")
                    finish = c.get("finish_reason") or finish
        return text, finish, error

    def metrics(self):
        return http("GET", self.base + "/metrics")[1]


def spawn(argv):
    """A part of the deployment, its output (stdout and stderr) kept for stop_process."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def spawn_serve(args, prefill, decode, extra=()):
    """`serve` with `prefill` and `decode` instances of the shipped model (f32, one thread per
    device, 16M of KV each) on free ports; returns the process and its base URL."""
    port, iport = free_port(), free_port()
    proc = spawn(
        [args.xdeepserve, "serve", "--model", args.model, "--port", str(port), "--instance-port",
         str(iport), "--prefill-instances", str(prefill), "--decode-instances", str(decode),
         "--kv-memory", "16M", "--threads-per-device", "1", "--compute-dtype", "f32"] +
        list(extra))
    return proc, f"http://127.0.0.1:{port}"


def stop_process(proc, what, expect_ok=True):
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    if expect_ok:
        check(proc.returncode == 0, f"{what} exit {proc.returncode}: {(out or '')[-800:]}")


def wait_idle(c, what, transfers=None):
    """Waits until every group reports no KV in use, nothing parked and, when given, that many
    transfers completed: the groups' load reports reach the gateway each on its own schedule,
    so a decode side's idle report can arrive before the prefill side's last one."""
    deadline = time.time() + 20
    while True:
        text = c.metrics()
        used = sum_metric(text, "xdeepserve_kv_cache_usage_ratio")
        parked = sum_metric(text, "xdeepserve_kv_transfers_parked")
        running = metric(text, "xdeepserve_requests_running")
        done = sum_metric(text, "xdeepserve_kv_transfers_completed_total")
        if (used == 0 and parked == 0 and running == 0 and
                (transfers is None or done == transfers)) or time.time() > deadline:
            check(used == 0, f"{what}: KV blocks still held once idle ({used})")
            check(parked == 0, f"{what}: transfers still parked once idle ({parked})")
            check(running == 0, f"{what}: requests running once idle")
            return text
        time.sleep(0.3)


def check_combined(args, refs, k, prefill_dp=1, backend="auto"):
    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
           "--instance-port", str(iport), "--prefill-instances", "1", "--decode-instances", "1",
           "--kv-memory", "16M", "--threads-per-device", "1", "--compute-dtype", "f32",
           "--prefill-dp", str(prefill_dp), "--kv-transfer-backend", backend]
    if backend == "ucx":
        cmd += ["--kv-transfer-host", "127.0.0.1"]
    if k:
        cmd += ["--speculative-tokens", str(k)]
    proc = spawn(cmd)
    what = f"serve P/D k={k} prefill-dp {prefill_dp} backend {backend}"
    c = Client(base)
    try:
        if not wait_healthy(base, proc):
            check(False, f"{what}: not healthy")
            return
        # Several instances on one machine: each one's processes carry its index
        # (instance 0 prefills, 1 decodes): "xds-<i>-shell", "xds-<i>-dp<r>", "xds-<i>-out<r>".
        names = {comm(pid) for pid in descendants(proc.pid)}
        want = {f"xds-{i}-{kind}" for i in (0, 1) for kind in ("shell", "dp0", "out0")}
        want |= {f"xds-0-{kind}{r}" for r in range(prefill_dp) for kind in ("dp", "out")}
        check(want <= names, f"{what}: process names {sorted(names)} hold {sorted(want)}")
        greedy = {"temperature": 0, "ignore_eos": True}
        handed = 0

        def ask(p):
            return p, c.complete(prompt=p, max_tokens=MAX_TOKENS, **greedy)

        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            for p, r in pool.map(ask, PROMPTS):
                check(r["choices"][0].get("text") == refs["ref"][p],
                      f"{what} {p!r}: {r['choices'][0].get('text')!r} != {refs['ref'][p]!r}")
        handed += len(PROMPTS)
        if k or backend == "ucx":  # the concurrent outputs are the point of these runs
            text = wait_idle(c, what, handed)
            check(sum_metric(text, "xdeepserve_kv_transfers_completed_total") == handed,
                  f"{what}: transfers completed {sum_metric(text, 'xdeepserve_kv_transfers_completed_total')}"
                  f" != {handed}")
            return

        cached = []
        for _ in range(2):
            r = c.complete(prompt=LONG, max_tokens=MAX_TOKENS, **greedy)
            check(r["choices"][0].get("text") == refs["long"],
                  f"{what} long prompt: {r['choices'][0].get('text')!r}")
            cached.append(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
            handed += 1
        # With two prefill groups the cooperative scheduler sends the repeat where it is cached.
        check(cached[0] == 0 and cached[1] >= 16, f"{what}: cached prompt tokens {cached}")
        if prefill_dp > 1:
            text = wait_idle(c, what, handed)
            per_group = [metric(text, f'xdeepserve_kv_transfers_completed_total{{group="{g}"}}')
                         for g in range(prefill_dp)]
            print(f"{what}: transfers per prefill group {per_group}")
            check(all(n > 0 for n in per_group),
                  f"{what}: the cooperative scheduler left a prefill group idle: {per_group}")
            return

        text, finish, _ = c.stream(prompt=PROMPTS[0], max_tokens=MAX_TOKENS, **greedy)
        check(text == refs["ref"][PROMPTS[0]] and finish == "length",
              f"{what} streamed: {text!r} {finish}")
        handed += 1

        before = sum_metric(wait_idle(c, what, handed), "xdeepserve_kv_transfers_completed_total")
        r = c.complete(prompt=PROMPTS[1], max_tokens=1, **greedy)
        check(r["choices"][0].get("text") == refs["len"][1] and
              r["usage"].get("completion_tokens") == 1, f"{what} max_tokens 1: {r}")
        time.sleep(0.5)  # a transfer, were there one, would be reported by now
        after = sum_metric(wait_idle(c, what), "xdeepserve_kv_transfers_completed_total")
        check(after == before, f"{what}: a request finished on its first token was transferred")
        for m in (2, 5):
            r = c.complete(prompt=PROMPTS[1], max_tokens=m, **greedy)
            check(r["choices"][0].get("text") == refs["len"][m] and
                  r["usage"].get("completion_tokens") == m, f"{what} max_tokens {m}: {r}")
            handed += 1

        full = refs["ref"][PROMPTS[2]]
        stop = full[len(full) // 2:len(full) // 2 + 5]
        r = c.complete(prompt=PROMPTS[2], max_tokens=MAX_TOKENS, stop=[stop], **greedy)
        ch = r["choices"][0]
        check(ch.get("text") == full[:full.index(stop)] and ch.get("finish_reason") == "stop",
              f"{what} stop {stop!r}: {ch.get('text')!r} {ch.get('finish_reason')}")
        handed += 1

        r = c.complete(prompt=EOS_PROMPT, max_tokens=200, temperature=0)
        ch = r["choices"][0]
        check(ch.get("text") == refs["eos"] and ch.get("finish_reason") == "stop",
              f"{what} eos: {ch.get('text')!r} {ch.get('finish_reason')}")
        handed += 1

        sampled = {"prompt": PROMPTS[3], "max_tokens": 24, "temperature": 0.8, "seed": 7,
                   "ignore_eos": True}
        a, b = c.complete(**sampled), c.complete(**sampled)
        check(a["choices"][0].get("text") == b["choices"][0].get("text") and
              a["usage"].get("completion_tokens") == 24, f"{what}: seeded sampling differs")
        handed += 2
        r = c.complete(n=2, **sampled)
        check(len(r["choices"]) == 2 and r["usage"].get("completion_tokens") == 48,
              f"{what} n=2: {r['usage']}")

        text = wait_idle(c, what, handed)
        print(f"{what}: {handed} transfers, "
              f"{sum_metric(text, 'xdeepserve_kv_pulled_bytes_total'):.0f} KV bytes pulled")
        check(sum_metric(text, "xdeepserve_kv_transfers_completed_total") == handed,
              f"{what}: transfers completed "
              f"{sum_metric(text, 'xdeepserve_kv_transfers_completed_total')} != {handed}")
        check(sum_metric(text, "xdeepserve_kv_pulled_bytes_total") > 0, f"{what}: no KV bytes pulled")
        check(sum_metric(text, "xdeepserve_kv_transfers_expired_total") == 0,
              f"{what}: transfers expired")
        # Undisturbed links: rendered per group, no pull found its link failed and every
        # block pulled matched the prefill side's checksum.
        check("xdeepserve_kv_links_failed_total{" in text and
              sum_metric(text, "xdeepserve_kv_links_failed_total") == 0 and
              sum_metric(text, "xdeepserve_kv_handoffs_recomputed_total") == 0,
              f"{what}: links failed or recomputed handoffs in an undisturbed run")
        check("xdeepserve_kv_checksum_mismatches_total{" in text and
              sum_metric(text, "xdeepserve_kv_checksum_mismatches_total") == 0 and
              sum_metric(text, "xdeepserve_kv_blocks_retired_total") == 0,
              f"{what}: checksum mismatches or retired blocks in an undisturbed run")
    finally:
        stop_process(proc, what)


def check_two_prefill(args, refs):
    """Two prefill instances: the gateway learns what each caches from its block-hash events
    and sends a repeated prompt where its blocks are."""
    proc, base = spawn_serve(args, prefill=2, decode=1)
    what = "two prefill instances"
    c = Client(base)
    try:
        if not wait_healthy(base, proc):
            check(False, f"{what}: not healthy")
            return
        greedy = {"temperature": 0, "ignore_eos": True}
        for attempt in range(3):
            r = c.complete(prompt=LONG, max_tokens=MAX_TOKENS, **greedy)
            check(r["choices"][0].get("text") == refs["long"], f"{what}: long prompt output")
            cached = r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            check((cached == 0) == (attempt == 0), f"{what}: run {attempt} cached {cached}")
            if attempt == 0:
                time.sleep(0.5)  # the block events reach the gateway
                text = c.metrics()
                known = [metric(text, f'xdeepserve_gateway_cached_blocks{{instance="{i}"}}')
                         for i in range(3)]
                print(f"{what}: blocks the gateway knows per instance {known}")
                check(sum(1 for k in known[:2] if k >= 2) == 1,
                      f"{what}: one prefill instance should hold the prompt's blocks: {known}")
    finally:
        stop_process(proc, what)


def check_link_faults(args, refs):
    """The prefill group's KV links misbehave (POST /admin/faults, P116): under link_delay the
    decode side's probes are answered (saturated: it keeps waiting) and the request completes
    exactly with no link failed; under link_drop a probe goes unanswered, the link is failed
    and dropped, and the request is recomputed on the decode group and completes exactly."""
    # The dropped link's transfer stays parked on the prefill side until it expires (5 s).
    proc, base = spawn_serve(args, prefill=1, decode=1,
                             extra=["--fault-injection", "--kv-transfer-timeout", "5"])
    what = "KV link faults"
    c = Client(base)
    names = ["xdeepserve_kv_probes_saturated_total", "xdeepserve_kv_links_failed_total",
             "xdeepserve_kv_handoffs_recomputed_total"]
    try:
        if not wait_healthy(base, proc):
            check(False, f"{what}: not healthy")
            return
        check_corrupt_pull(c, base, refs, what)  # first: link_drop's fault outlasts its check
        greedy = {"temperature": 0, "ignore_eos": True}
        for kind, prompt in (("link_delay", PROMPTS[1]), ("link_drop", PROMPTS[2])):
            before = c.metrics()
            status, body, _ = http("POST", base + "/admin/faults",
                                   body={"kind": kind, "instance": 0, "group": 0,
                                         "duration_ms": 3000})
            check(status == 202, f"{what}: POST {kind}: {status} {body}")
            r = c.complete(prompt=prompt, max_tokens=MAX_TOKENS, **greedy)
            check(r["choices"][0].get("text") == refs["ref"][prompt], f"{what}: {kind} output")
            deadline, d = time.time() + 10, [0, 0, 0]
            while time.time() < deadline:  # the groups' loads reach the gateway shortly
                after = c.metrics()
                d = [metric(after, n) - metric(before, n) for n in names]
                if (kind == "link_delay" and d[0] >= 1) or (kind == "link_drop" and d[1] >= 1):
                    break
                time.sleep(0.2)
            print(f"{what}: {kind}: saturated {d[0]}, links failed {d[1]}, recomputed {d[2]}")
            if kind == "link_delay":
                check(d[0] >= 1 and d[1] == 0, f"{what}: a delayed link is saturated: {d}")
            else:
                check(d[1] >= 1 and d[2] >= 1, f"{what}: a dropped link is failed: {d}")
            if kind == "link_delay":
                time.sleep(3)  # the fault's duration
        # SIGTERM now, the dropped link's transfer still parked on the prefill side: serve
        # drains (the transfer expires at --kv-transfer-timeout) and exits 0 (stop_process).
    finally:
        stop_process(proc, what)


def check_corrupt_pull(c, base, refs, what):
    """kv_corrupt (P120): the decode group's next pull lands with a block corrupted; the
    block's checksum differs, the block is retired, the request recomputed on the decode group
    and its text exact. The prefill instance (0) pulls nothing: the fault is refused there."""
    status, body, _ = http("POST", base + "/admin/faults", body={"kind": "kv_corrupt", "instance": 0})
    check(status == 400 and "decode instance" in body, f"{what}: kv_corrupt on prefill: {status} {body}")
    names = ["xdeepserve_kv_checksum_mismatches_total", "xdeepserve_kv_blocks_retired_total",
             "xdeepserve_kv_handoffs_recomputed_total"]
    before = c.metrics()
    status, body, _ = http("POST", base + "/admin/faults", body={"kind": "kv_corrupt", "instance": 1})
    check(status == 202, f"{what}: POST kv_corrupt: {status} {body}")
    prompt = PROMPTS[3]
    r = c.complete(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    check(r["choices"][0].get("text") == refs["ref"][prompt], f"{what}: kv_corrupt output")
    deadline, d = time.time() + 10, [0, 0, 0]
    while time.time() < deadline:
        after = c.metrics()
        d = [sum_metric(after, n) - sum_metric(before, n) for n in names]
        if d[0] >= 1:
            break
        time.sleep(0.2)
    print(f"{what}: kv_corrupt: checksum mismatches {d[0]}, blocks retired {d[1]}, "
          f"recomputed {d[2]}")
    check(d == [1, 1, 1], f"{what}: a corrupted pull is caught, its block retired: {d}")


def cpu_ticks(pid):
    """User + system CPU time of `pid` in clock ticks (/proc/PID/stat), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def check_two_decode(args, refs):
    """One prefill and two decode instances; one decode instance's device process is killed
    while six streamed requests decode (P/D failover, docs/design/reliability.md): every
    request completes exactly, without an error, those the dead instance held recomputed on
    what serves; the instance restarts and the gateway takes it back."""
    proc, base = spawn_serve(args, prefill=1, decode=2)
    what = "two decode instances, one killed"
    c = Client(base)
    try:
        if not wait_healthy(base, proc):
            check(False, f"{what}: not healthy")
            return
        greedy = {"temperature": 0, "ignore_eos": True}
        before = c.metrics()
        # Six long decodes of one prompt (its reference is refs["long_output"]), spread over
        # both decode instances (1 and 2); instance 2's device is killed in the middle.
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(Client(base).stream, prompt=PROMPTS[0], max_tokens=LONG_OUTPUT,
                                   **greedy) for _ in range(6)]
            victim, deadline = None, time.time() + 120
            while time.time() < deadline and victim is None:
                running = metric(c.metrics(), "xdeepserve_group_requests_running")
                names = {comm(pid): pid for pid in descendants(proc.pid)}
                decoders = [names.get(f"xds-{i}-dp0") for i in (1, 2)]
                if running >= 4 and all(decoders):
                    time.sleep(1)  # decoding by now
                    # The busier decode device (CPU time over half a second) holds requests.
                    before_cpu = [cpu_ticks(pid) for pid in decoders]
                    time.sleep(0.5)
                    spent = [cpu_ticks(pid) - t for pid, t in zip(decoders, before_cpu)]
                    victim = decoders[spent.index(max(spent))]
                time.sleep(0.05)
            check(victim is not None, f"{what}: no decode device to kill")
            if victim:
                os.kill(victim, signal.SIGKILL)
            for i, f in enumerate(futures):
                text, finish, error = f.result(timeout=600)
                check(error is None and finish == "length", f"{what} {i}: {finish} {error}")
                check(text == refs["long_output"], f"{what} {i}: the text differs")
        deadline = time.time() + 60  # the gateway counts the restart once it sees it
        while time.time() < deadline and metric(c.metrics(), "xdeepserve_instance_restarts_total") \
                - metric(before, "xdeepserve_instance_restarts_total") < 1:
            time.sleep(0.2)
        after = c.metrics()
        restarts = metric(after, "xdeepserve_instance_restarts_total") - \
            metric(before, "xdeepserve_instance_restarts_total")
        recomputed = metric(after, "xdeepserve_requests_recomputed_total") - \
            metric(before, "xdeepserve_requests_recomputed_total")
        print(f"{what}: restarts {restarts}, recomputed {recomputed}")
        check(restarts == 1, f"{what}: restarts {restarts} (want 1: the killed instance)")
        check(recomputed >= 1, f"{what}: the killed instance's requests were not recomputed")
        # The restarted decode instance serves again: a request completes exactly.
        deadline = time.time() + 120
        while time.time() < deadline and http("GET", base + "/health")[0] != 200:
            time.sleep(0.2)
        r = c.complete(prompt=PROMPTS[3], max_tokens=MAX_TOKENS, **greedy)
        check(r["choices"][0].get("text") == refs["ref"][PROMPTS[3]], f"{what}: after the restart")
    finally:
        stop_process(proc, what)


def cluster_secret(mode=0o600):
    """A new secret file: the instances and gateways started apart authenticate each other
    with it (--cluster-secret-file, refused unless mode 0600)."""
    path = os.path.join(tempfile.mkdtemp(prefix="xds_pd_"), "cluster.secret")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(32))
    os.chmod(path, mode)
    return path


def check_prefill_death(args, refs):
    """Two prefill instances and a decode instance started separately; one prefill instance is
    killed whole (shell included: no kFailed, only silence) while a request it prefilled
    decodes on the decode instance. That request completes exactly; the gateway takes the
    silent instance out after --instance-timeout and serves new requests on the other."""
    ports = [free_port() for _ in range(4)]
    secret = cluster_secret()
    common = ["--model", args.model, "--threads-per-device", "1", "--compute-dtype", "f32",
              "--kv-memory", "16M", "--cluster-secret-file", secret]
    procs = [spawn([args.xdeepserve, "instance", "--role", role, "--listen",
                    f"tcp://127.0.0.1:{port}"] + common)
             for role, port in zip(["prefill", "prefill", "decode"], ports)]
    gateway = spawn(
        [args.xdeepserve, "gateway", "--model", args.model, "--port", str(ports[3]),
         "--instance-timeout", "3", "--cluster-secret-file", secret,
         "--instances", ",".join(f"tcp://127.0.0.1:{p}" for p in ports[:3])])
    base = f"http://127.0.0.1:{ports[3]}"
    c = Client(base)
    what = "prefill instance killed"
    try:
        if not wait_healthy(base, gateway):
            check(False, f"{what}: not healthy")
            return
        greedy = {"temperature": 0, "ignore_eos": True}
        decode_dp = [pid for pid in descendants(procs[2].pid)
                     if open(f"/proc/{pid}/comm").read().strip() == "xds-dp0"]
        check(len(decode_dp) == 1, f"{what}: decode device processes {decode_dp}")
        if not decode_dp:
            return
        chunks, result = [], {}

        def stream():
            body = {"prompt": PROMPTS[0], "max_tokens": LONG_OUTPUT, "stream": True, **greedy}
            req = urllib.request.Request(base + "/v1/completions",
                                         data=json.dumps(body).encode(), method="POST")
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=120) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for ch in json.loads(line[6:]).get("choices", []):
                            chunks.append(ch.get("text", ""))
            result["text"] = "".join(chunks)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(stream)
            deadline = time.time() + 30
            while len(chunks) < 3 and time.time() < deadline:
                time.sleep(0.001)
            os.kill(decode_dp[0], signal.SIGSTOP)  # mid-decode on the decode instance
            stopped_at = len(chunks)
            check(3 <= stopped_at < LONG_OUTPUT, f"{what}: frozen after {stopped_at} tokens")
            deadline = time.time() + 20
            done = [0.0, 0.0]
            while sum(done) < 1 and time.time() < deadline:
                text = c.metrics()
                done = [metric(text, f'xdeepserve_kv_transfers_completed_total{{group="{g}"}}')
                        for g in range(2)]
                time.sleep(0.1)
            check(sum(done) == 1, f"{what}: transfers per prefill instance {done}")
            victim = 0 if done[0] == 1 else 1
            procs[victim].kill()
            procs[victim].wait()
            os.kill(decode_dp[0], signal.SIGCONT)
            fut.result(timeout=60)
        check(result.get("text") == refs["long_output"],
              f"{what}: the request decoding elsewhere: {result.get('text')!r}")
        time.sleep(4.5)  # past --instance-timeout: the silent instance is out
        for p in PROMPTS[1:3]:
            r = c.complete(prompt=p, max_tokens=MAX_TOKENS, **greedy)
            check(r["choices"][0].get("text") == refs["ref"][p],
                  f"{what}: after the prefill instance died: {r['choices'][0].get('text')!r}")
    finally:
        stop_process(gateway, "gateway")
        for proc in procs:
            if proc.poll() is None:
                stop_process(proc, "instance")


def check_separate(args, refs):
    pport, dport, gport = free_port(), free_port(), free_port()
    # A secret file others can read is refused before anything starts, naming the fix.
    loose = subprocess.run(
        [args.xdeepserve, "instance", "--model", args.model, "--listen",
         f"tcp://127.0.0.1:{pport}", "--cluster-secret-file", cluster_secret(0o644)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    check(loose.returncode != 0 and b"chmod 600" in loose.stdout,
          f"separate parts: a mode 0644 secret file: exit {loose.returncode}, {loose.stdout!r}")
    secret = cluster_secret()
    common = ["--model", args.model, "--threads-per-device", "1", "--compute-dtype", "f32",
              "--kv-transfer-timeout", "2", "--cluster-secret-file", secret]
    prefill = spawn(
        [args.xdeepserve, "instance", "--role", "prefill", "--listen",
         f"tcp://127.0.0.1:{pport}", "--kv-memory", "16M"] + common)
    # One request of <= 48 tokens at a time: 2 blocks of 16 tokens and a spare.
    decode = spawn(
        [args.xdeepserve, "instance", "--role", "decode", "--listen",
         f"tcp://127.0.0.1:{dport}", "--kv-memory", "140K", "--max-model-len", "64"] + common)
    gateway = spawn(
        [args.xdeepserve, "gateway", "--model", args.model, "--port", str(gport),
         "--max-model-len", "64", "--cluster-secret-file", secret,
         "--instances", f"tcp://127.0.0.1:{pport},tcp://127.0.0.1:{dport}"])
    base = f"http://127.0.0.1:{gport}"
    c = Client(base)
    what = "separate parts"
    try:
        if not wait_healthy(base, gateway):
            check(False, f"{what}: not healthy")
            return
        greedy = {"temperature": 0, "ignore_eos": True}

        def ask(p):
            return p, c.complete(prompt=p, max_tokens=MAX_TOKENS, **greedy)

        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            for p, r in pool.map(ask, PROMPTS):
                check(r["choices"][0].get("text") == refs["ref"][p],
                      f"{what} {p!r}: {r['choices'][0].get('text')!r}")
        text = wait_idle(c, what, len(PROMPTS))
        print(f"{what}: handoffs deferred {metric(text, 'xdeepserve_kv_handoffs_deferred_total')}, "
              f"transfers completed {sum_metric(text, 'xdeepserve_kv_transfers_completed_total')}")
        check(metric(text, "xdeepserve_kv_handoffs_deferred_total") > 0,
              f"{what}: the decode side never deferred a handoff (its KV holds one request)")
        check(sum_metric(text, "xdeepserve_kv_transfers_completed_total") == len(PROMPTS),
              f"{what}: transfers completed {sum_metric(text, 'xdeepserve_kv_transfers_completed_total')}")

        # The decode instance's device process dies with a handoff placed on it: frozen first
        # (so the handoff is certainly parked on the prefill side), then killed.
        victims = [pid for pid in descendants(decode.pid)
                   if open(f"/proc/{pid}/comm").read().strip() == "xds-dp0"]
        check(len(victims) == 1, f"{what}: decode device processes {victims}")
        if not victims:
            return
        os.kill(victims[0], signal.SIGSTOP)
        result = {}

        def long_stream():
            result["r"] = c.stream(prompt=PROMPTS[1], max_tokens=MAX_TOKENS, **greedy)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(long_stream)
            deadline = time.time() + 20
            while time.time() < deadline:
                if sum_metric(c.metrics(), "xdeepserve_kv_transfers_parked") >= 1:
                    break
                time.sleep(0.1)
            check(sum_metric(c.metrics(), "xdeepserve_kv_transfers_parked") >= 1,
                  f"{what}: the handoff never parked on the prefill side")
            os.kill(victims[0], signal.SIGKILL)
            fut.result(timeout=60)
        text, finish, error = result["r"]
        print(f"{what}: decode device killed: text {text!r}, error {error}")
        check(error is None and finish == "length",
              f"{what}: after the decode device died: finish {finish}, error {error}")
        check(text == refs["ref"][PROMPTS[1]],
              f"{what}: recomputed {text!r} != {refs['ref'][PROMPTS[1]]!r}")
        # Served whole by the prefill instance now, exactly.
        r = c.complete(prompt=PROMPTS[5], max_tokens=MAX_TOKENS, **greedy)
        check(r["choices"][0].get("text") == refs["ref"][PROMPTS[5]],
              f"{what}: after the decode instance failed: {r['choices'][0].get('text')!r}")
        time.sleep(3)  # past --kv-transfer-timeout
        text = c.metrics()
        check(sum_metric(text, "xdeepserve_kv_transfers_parked") == 0,
              f"{what}: KV still parked after the decode instance died")
    finally:
        stop_process(gateway, "gateway")
        stop_process(decode, "decode instance", expect_ok=False)
        stop_process(prefill, "prefill instance")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    refs = {"ref": {p: generate(args, p, MAX_TOKENS) for p in PROMPTS},
            "long": generate(args, LONG, MAX_TOKENS),
            "len": {m: generate(args, PROMPTS[1], m) for m in (1, 2, 5)},
            "eos": generate(args, EOS_PROMPT, 200, ignore_eos=False),
            "long_output": generate(args, PROMPTS[0], LONG_OUTPUT)}
    check(len(refs["eos"]) < len(generate(args, EOS_PROMPT, 200)),
          "the EOS prompt's reference does not stop at EOS")
    check_combined(args, refs, 0)
    check_combined(args, refs, 2)
    check_combined(args, refs, 0, prefill_dp=2)
    os.environ["UCX_TLS"] = "tcp"  # UCX over TCP on 127.0.0.1 (any machine has it)
    check_combined(args, refs, 0, backend="ucx")
    check_two_prefill(args, refs)
    check_two_decode(args, refs)
    check_link_faults(args, refs)
    check_separate(args, refs)
    check_prefill_death(args, refs)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("serve P/D: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
