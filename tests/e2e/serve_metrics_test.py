#!/usr/bin/python3
"""/metrics of a real serving instance read by an independent Prometheus text-format parser.

Starts `xdeepserve serve` on the shipped model (--dp 2, EPLB on so that its families are
rendered too), sends completions (streamed and not), requests it must reject (a malformed
body, a bad parameter, a prompt + max_tokens past the context, a wrong API key), then parses
/metrics with Debian's python3-prometheus-client (prometheus_client.parser) and checks:
  - every family has one # TYPE line, and its type is the one metric_families.py (written from
    docs/design/operations.md) gives it, as the parser reads it too; counters are named
    *_total, no gauge or histogram is; histogram buckets are cumulative and +Inf equals
    _count;
  - the families the run exercised are there;
  - the outcome counters equal what the test sent (hand-counted): successes, rejections by
    reason, and requests_total{outcome="rejected"} as their sum;
  - no counter went down between two scrapes.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metric_families  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover - the dependency is in tools/install_deps.sh
    text_string_to_metric_families = None

FAILURES = []
KEY = "metrics-key"


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, key=KEY, raw=None, timeout=120):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_healthy(base, server, timeout_s=180):
    deadline = time.time() + timeout_s
    while time.time() < deadline and server.poll() is None:
        try:
            if http("GET", base + "/health", timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def samples(text):
    """{(sample name, frozenset(labels)): value} and the parsed families."""
    families = list(text_string_to_metric_families(text))
    out = {}
    for f in families:
        for s in f.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out, families


def value(sample_map, name, **labels):
    return sample_map.get((name, frozenset(labels.items())))


def exposed_name(family):
    # The parser drops a counter's _total suffix from the family name (OpenMetrics style).
    return family.name + "_total" if family.type == "counter" else family.name


def sample_name(line):
    """The metric name of a sample line, "" for comments and blank lines."""
    m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", line)
    return m.group(1) if m and not line.startswith("#") else ""


def check_families(text, families):
    # The names as exposed, from the # TYPE lines themselves: the parser renames a counter's
    # samples to <name>_total whatever they were called, so the suffix is checked here.
    raw = [l.split()[2:4] for l in text.splitlines() if l.startswith("# TYPE ")]
    names = [n for n, _ in raw]
    dup = {n for n in names if names.count(n) > 1}
    check(not dup, f"families with more than one # TYPE line: {sorted(dup)}")
    raw_types = dict((n, t) for n, t in raw)
    for name, type_ in raw_types.items():
        want = metric_families.TYPES.get(name)
        check(want is not None, f"{name} ({type_}) is not in docs/design/operations.md's list")
        check(want is None or want == type_, f"{name} is a {type_}, want {want}")
        if type_ == "counter":
            check(name.endswith("_total"), f"counter {name} is not named *_total")
            base = name[:-len("_total")] if name.endswith("_total") else name
            bad = [l for l in text.splitlines() if sample_name(l) == base]
            check(not bad, f"counter {name} has samples under another name: {bad[:2]}")
        else:
            check(not name.endswith("_total"), f"{type_} {name} is named like a counter")
    for f in families:
        name = exposed_name(f)
        check(raw_types.get(name) == f.type,
              f"the parser reads {name} as a {f.type}; its # TYPE line says "
              f"{raw_types.get(name)}")
        if f.type == "histogram":
            series = {}
            for s in f.samples:
                key = frozenset((k, v) for k, v in s.labels.items() if k != "le")
                series.setdefault(key, {"buckets": [], "count": None})
                if s.name.endswith("_bucket"):
                    series[key]["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    series[key]["count"] = s.value
            for key, h in series.items():
                b = sorted(h["buckets"])
                check(all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)),
                      f"{name}{dict(key)}: buckets not cumulative")
                check(b and b[-1][0] == float("inf") and b[-1][1] == h["count"],
                      f"{name}{dict(key)}: +Inf bucket != _count")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    if text_string_to_metric_families is None:
        print("SKIP-FAIL: python3-prometheus-client is not installed (tools/install_deps.sh "
              "installs it)", file=sys.stderr)
        return 1

    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
           "--instance-port", str(iport), "--api-key", KEY, "--dp", "2",
           "--compute-dtype", "f32", "--max-num-seqs", "8", "--kv-memory", "64M",
           "--threads-per-device", "1", "--served-model-name", "kjv",
           "--redundant-slots", "2", "--eplb-window", "0.5"]
    log = []
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()
    try:
        if not wait_healthy(base, server):
            check(False, "server became healthy")
            return 1
        url = base + "/v1/completions"
        ok = {"model": "kjv", "prompt": "In the beginning God created", "max_tokens": 6,
              "temperature": 0}
        successes = 0
        for stream in (False, True, False):
            status, body = http("POST", url, dict(ok, stream=stream))
            check(status == 200, f"completion (stream={stream}): {status} {body[:200]}")
            successes += status == 200
        rejected = {"bad_request": 0, "unauthorized": 0, "context_length": 0}
        for raw in (b"{not json", json.dumps(dict(ok, max_tokens=-1)).encode()):
            status, body = http("POST", url, raw=raw)
            check(status == 400, f"bad request answered {status}: {body[:200]}")
            rejected["bad_request"] += 1
        status, body = http("POST", url, dict(ok, max_tokens=100000))
        check(status == 400 and "context_length_exceeded" in body,
              f"over-long request answered {status}: {body[:200]}")
        rejected["context_length"] += 1
        status, body = http("POST", url, ok, key="wrong-key")
        check(status == 401, f"wrong key answered {status}")
        rejected["unauthorized"] += 1

        # The groups' loads reach the gateway about every 50 ms; the shell's EPLB lines about
        # every second.
        deadline = time.time() + 30
        while True:
            status, text = http("GET", base + "/metrics", key=None)
            first, _ = samples(text)
            steps = sum(v for (n, _), v in first.items() if n == "xdeepserve_steps_total")
            if (steps > 0 and "xdeepserve_eplb_map_version" in text) or time.time() > deadline:
                break
            time.sleep(0.5)
        check(status == 200, f"/metrics answered {status}")
        first, families = samples(text)
        check_families(text, families)
        present = {exposed_name(f) for f in families}
        exercised = ["xdeepserve_requests_total", "xdeepserve_requests_rejected_total",
                     "xdeepserve_prompt_tokens_total", "xdeepserve_generation_tokens_total",
                     "xdeepserve_time_to_first_token_seconds",
                     "xdeepserve_time_per_output_token_seconds",
                     "xdeepserve_inter_token_latency_seconds",
                     "xdeepserve_e2e_request_latency_seconds", "xdeepserve_steps_total",
                     "xdeepserve_preemptions_total", "xdeepserve_prefix_cache_hit_blocks_total",
                     "xdeepserve_prefix_cache_query_blocks_total",
                     "xdeepserve_kv_cache_usage_ratio", "xdeepserve_batch_size",
                     "xdeepserve_group_requests_running", "xdeepserve_moe_seconds_total",
                     "xdeepserve_expert_routed_tokens_total", "xdeepserve_eplb_map_version",
                     "xdeepserve_eplb_rebalances_total", "xdeepserve_requests_running"]
        missing = [n for n in exercised if n not in present]
        check(not missing, f"families missing from /metrics: {missing}")
        check((value(first, "xdeepserve_steps_total", group="0") or 0) > 0, "group 0 ran no step")

        total = sum(rejected.values())
        check(value(first, "xdeepserve_requests_total", outcome="success") == successes,
              f"successes {value(first, 'xdeepserve_requests_total', outcome='success')} "
              f"!= {successes}")
        check(value(first, "xdeepserve_requests_total", outcome="rejected") == total,
              f"rejected {value(first, 'xdeepserve_requests_total', outcome='rejected')} "
              f"!= {total}")
        for reason in metric_families.REJECTION_REASONS:
            got = value(first, "xdeepserve_requests_rejected_total", reason=reason)
            check(got == rejected.get(reason, 0), f"rejected for {reason}: {got} != "
                  f"{rejected.get(reason, 0)}")

        # One more request, then no counter may be below its first reading.
        http("POST", url, ok)
        time.sleep(0.5)
        second, _ = samples(http("GET", base + "/metrics", key=None)[1])
        counter_names = {f.name for f in families if f.type == "counter"}
        for (name, labels), v in first.items():
            if name[:-len("_total")] in counter_names and name.endswith("_total"):
                later = second.get((name, labels))
                check(later is not None and later >= v,
                      f"counter {name}{dict(labels)} went from {v} to {later}")
        check(value(second, "xdeepserve_requests_total", outcome="success") == successes + 1,
              "the last success was not counted")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            check(False, "server did not stop within 60 s of SIGTERM")
    if FAILURES:
        print("---- server log (last 40 lines) ----\n" + "".join(log[-40:]), file=sys.stderr)
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("metrics: every family typed as documented; outcome counters as sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
