#!/usr/bin/python3
"""The Grafana dashboard's PromQL against the real Prometheus scraping a serving instance.

Starts `xdeepserve serve` on the shipped model (--dp 2, EPLB on), sends completions while
Debian's `prometheus` scrapes the gateway every second with a configuration made from
deploy/prometheus.yml (its job, with a static target instead of DNS discovery; a temporary
storage directory; a free port), then evaluates every expression of
deploy/grafana/xdeepserve.json through Prometheus's HTTP query API
(Grafana's $__rate_interval given as 1m). It fails on any parse or evaluation error, on an
expression over a family that docs/design/operations.md does not list (metric_families.py),
when a family the run exercised never reached Prometheus, and when an expression whose
families all have series returns no data. Also checks deploy/prometheus.yml with promtool.

Exits 77 (skipped, with the reason) when prometheus is not installed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metric_families  # noqa: E402

FAILURES = []
KEY = "prom-key"
SKIP = 77

# Families this run must get into Prometheus (requests, latency, groups, experts, EPLB).
EXERCISED = [
    "xdeepserve_requests_total", "xdeepserve_requests_rejected_total",
    "xdeepserve_generation_tokens_total", "xdeepserve_prompt_tokens_total",
    "xdeepserve_time_to_first_token_seconds_bucket",
    "xdeepserve_time_per_output_token_seconds_bucket",
    "xdeepserve_inter_token_latency_seconds_bucket",
    "xdeepserve_e2e_request_latency_seconds_bucket", "xdeepserve_requests_running",
    "xdeepserve_kv_cache_usage_ratio", "xdeepserve_batch_size", "xdeepserve_steps_total",
    "xdeepserve_prefix_cache_hit_blocks_total", "xdeepserve_prefix_cache_query_blocks_total",
    "xdeepserve_preemptions_total", "xdeepserve_moe_seconds_total",
    "xdeepserve_expert_routed_tokens_total", "xdeepserve_eplb_map_version",
    "xdeepserve_eplb_rebalances_total", "xdeepserve_kv_transfers_parked",
    "xdeepserve_step_rollbacks_total",
]


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


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


def wait_for(url, process, timeout_s=180, key=None):
    deadline = time.time() + timeout_s
    while time.time() < deadline and process.poll() is None:
        try:
            if http("GET", url, key=key, timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def prom_query(prom, expr):
    """(status, data or error text) of an instant query."""
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = http("GET", url, key=None, timeout=30)
    try:
        j = json.loads(body)
    except ValueError:
        return "error", f"HTTP {status}: {body[:300]}"
    if j.get("status") != "success":
        return "error", f"{j.get('errorType')}: {j.get('error')}"
    return "success", j["data"]


def dashboard_exprs(path):
    with open(path) as f:
        d = json.load(f)
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["legendFormat"], t["expr"]))
    return out


def family_of(series_name):
    for suffix in ("_bucket", "_sum", "_count"):
        base = series_name[:-len(suffix)] if series_name.endswith(suffix) else None
        if base and metric_families.TYPES.get(base) == "histogram":
            return base
    return series_name


def prometheus_config(shipped, target, scrape_s):
    """The shipped config's gateway job, scraping `target` every scrape_s seconds."""
    import yaml  # python3-yaml
    with open(shipped) as f:
        cfg = yaml.safe_load(f)
    job = dict(cfg["scrape_configs"][0])
    job.pop("dns_sd_configs", None)
    job["static_configs"] = [{"targets": [target]}]
    job["scrape_interval"] = f"{scrape_s}s"
    job["scrape_timeout"] = f"{scrape_s}s"
    cfg["global"]["scrape_interval"] = f"{scrape_s}s"
    cfg["global"]["scrape_timeout"] = f"{scrape_s}s"
    cfg["scrape_configs"] = [job]
    return yaml.safe_dump(cfg), job["job_name"]


def stop(process, what):
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        check(False, f"{what} did not stop within 60 s of SIGTERM")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--repo", required=True, help="the source tree (deploy/)")
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("SKIPPED: Debian's prometheus (prometheus, promtool) is not installed "
              "(tools/install_deps.sh installs it)")
        return SKIP
    shipped = os.path.join(args.repo, "deploy", "prometheus.yml")
    dashboard = os.path.join(args.repo, "deploy", "grafana", "xdeepserve.json")
    r = subprocess.run([promtool, "check", "config", shipped], capture_output=True, text=True)
    check(r.returncode == 0, f"promtool check config {shipped}: {r.stdout}{r.stderr}")

    exprs = dashboard_exprs(dashboard)
    for title, legend, expr in exprs:
        for name in set(re.findall(r"\bxdeepserve_[a-z0-9_]+", expr)):
            check(family_of(name) in metric_families.TYPES,
                  f"panel '{title}' ({legend}) reads {name}, which /metrics does not export")

    port, iport, pport = free_port(), free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    prom = f"http://127.0.0.1:{pport}"
    tmp = tempfile.mkdtemp(prefix="xds-prom-")
    server = prom_proc = None
    log, prom_log = [], []
    try:
        server = subprocess.Popen(
            [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
             "--instance-port", str(iport), "--api-key", KEY, "--dp", "2",
             "--compute-dtype", "f32", "--max-num-seqs", "8", "--kv-memory", "64M",
             "--threads-per-device", "1", "--served-model-name", "kjv",
             "--redundant-slots", "2", "--eplb-window", "0.5"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()
        if not wait_for(base + "/health", server):
            check(False, "server became healthy")
            return 1
        config, job = prometheus_config(shipped, f"127.0.0.1:{port}", 1)
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write(config)
        prom_proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp}/prometheus.yml",
             f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{pport}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: prom_log.extend(prom_proc.stdout), daemon=True).start()
        if not wait_for(prom + "/-/ready", prom_proc, timeout_s=60):
            check(False, "prometheus became ready")
            return 1

        # Load while Prometheus scrapes: streamed and whole completions, and one rejection.
        url = base + "/v1/completions"
        ok = {"model": "kjv", "prompt": "In the beginning God created", "max_tokens": 6,
              "temperature": 0}
        http("POST", url, dict(ok, max_tokens=-1))
        deadline = time.time() + 120
        samples = 0
        sent = 0
        while time.time() < deadline:
            status, _ = http("POST", url, dict(ok, stream=sent % 2 == 1))
            check(status == 200, f"completion answered {status}")
            sent += 1
            state, data = prom_query(
                prom, f'min(count_over_time(xdeepserve_steps_total{{job="{job}"}}[1m]))')
            samples = float(data["result"][0]["value"][1]) if state == "success" and \
                data["result"] else 0
            if sent >= 4 and samples >= 5:
                break
            time.sleep(0.5)
        check(samples >= 5, f"Prometheus holds {samples} samples of steps_total after 120 s")

        for name in EXERCISED:
            state, data = prom_query(prom, f'count({{__name__="{name}", job="{job}"}})')
            check(state == "success" and data["result"],
                  f"{name}: no series in Prometheus ({data if state != 'success' else 'empty'})")

        evaluated = with_data = 0
        for title, legend, expr in exprs:
            q = expr.replace("$__rate_interval", "1m")
            state, data = prom_query(prom, q)
            check(state == "success", f"panel '{title}' ({legend}): {q}: {data}")
            if state != "success":
                continue
            evaluated += 1
            names = {n for n in re.findall(r"\bxdeepserve_[a-z0-9_]+", q)}
            have = all(prom_query(prom, f'count({{__name__="{n}"}})')[1]["result"]
                       for n in names)
            if have:
                check(bool(data["result"]),
                      f"panel '{title}' ({legend}): no data although its series exist: {q}")
                with_data += bool(data["result"])
        print(f"prometheus: {evaluated}/{len(exprs)} dashboard expressions evaluated, "
              f"{with_data} with data over the series this run made")
    finally:
        stop(prom_proc, "prometheus")
        stop(server, "the server")
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print("---- server log (last 30 lines) ----\n" + "".join(log[-30:]), file=sys.stderr)
        print("---- prometheus log (last 20 lines) ----\n" + "".join(prom_log[-20:]),
              file=sys.stderr)
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
