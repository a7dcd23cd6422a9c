#!/usr/bin/python3
"""Soak test of a running `xdeepserve serve`: hours of steady load, watching for leaks.

bench/soak/run.sh starts the server (bench/common/serve_lib.sh) and runs this against it:

  1. measures the capacity: a closed loop of --probe-concurrency streamed requests for
     --probe-duration seconds gives completed requests/s (--rate overrides the soak's rate; the
     probe runs anyway, as the warm-up after which the idle level is sampled);
  2. sends --load-fraction (0.8) of it as Poisson arrivals for --duration seconds, half chat and
     half completions, prompts of --input-words words of models/kjv-moe-tiny/heldout.txt and
     --max-tokens tokens (ignore_eos); --cancel-fraction (1/3) of the clients close the socket
     after 1-5 SSE chunks;
  3. every --sample-every seconds samples each process of the server (the serve process and its
     descendants, from /proc/*/stat): RSS (anon/file/shmem), threads, open fds, CPU seconds; the
     bytes of /dev/shm files and memfds the processes have open or mapped; the server's
     /metrics (KV cache usage, running and waiting requests, requests by outcome);
  4. after the load, waits for the in-flight requests, idles --idle seconds and samples again;
  5. prints the table, writes JSON (--json) and the table (--txt), and judges:
     - rss: each process's and the total RSS, after the warm-up (--warmup, default the first
       10 % of the load), flat within --rss-tolerance (5 %): median of the last samples of the
       load against the median of the first ones after the warm-up;
     - fds, shm: back at the idle level once the load is gone (the level sampled idle after the
       probe: processes open some connections on first use; the level before any request is
       reported beside it);
     - kv: no KV block in use, no request running or waiting, once the load is gone;
     - requests: every request not cancelled by its client completed (HTTP 200, a
       finish_reason, [DONE], usage.completion_tokens == max_tokens), none skipped;
     - metrics: the server's xdeepserve_requests_total moved as the client counted: success +
       cancelled = ok + cancelled, no rejected, no error (a cancel the server had finished
       before the socket closed counts as its success; their number is reported);
     - processes: the same processes (pids) all along.
     Exits 1 when a check fails.

Python 3 standard library only (/usr/bin/python3).
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import sys
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the server's processes


def read_stat(pid):
    """(comm, ppid, cpu seconds) of /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    # comm is in parentheses and may hold spaces: split at the last ')'.
    comm = s[s.index("(") + 1 : s.rindex(")")]
    rest = s[s.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    return comm, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICKS


def server_pids(root):
    """The root pid and all its descendants, from the ppid of every /proc/*/stat."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = read_stat(int(d))
        if st:
            children.setdefault(st[1], []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return sorted(out)


def status_fields(pid):
    """VmRSS, RssAnon, RssFile, RssShmem (KiB) and Threads of /proc/PID/status."""
    want = {"VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"}
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in want:
                out[key] = int(val.split()[0])
    return out


def fd_kind(target):
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return target[len("anon_inode:") :].strip("[]")
    if target.startswith("/memfd:"):
        return "memfd"
    if target.startswith("/dev/shm/"):
        return "shm"
    return "file"


def shared_memory_of(pid, seen):
    """Adds to seen {(dev, inode): info} the /dev/shm files and memfds PID has open or mapped."""

    def note(path, st, how):
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen[key] = {"name": path, "size": st.st_size, "allocated": st.st_blocks * 512,
                         "how": set()}
        seen[key]["how"].add(how)

    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
            if target.startswith("/dev/shm/") or target.startswith("/memfd:"):
                note(target, os.stat(f"{fd_dir}/{fd}"), "fd")
        except OSError:
            pass  # closed meanwhile
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            if not (path.startswith("/dev/shm/") or path.startswith("/memfd:")):
                continue
            try:  # map_files stats the mapped file itself (root only); else the range's length
                note(path, os.stat(f"/proc/{pid}/map_files/{parts[0]}"), "map")
            except OSError:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                key = ("map", path)
                seen.setdefault(key, {"name": path, "size": hi - lo, "allocated": hi - lo,
                                      "how": {"map"}})


def sample_processes(root):
    """Per process: pid, name, RSS parts (KiB), threads, fds and their kinds, CPU seconds; and
    the shared memory of them all. A process that ends while read is left out."""
    procs, shm = [], {}
    for pid in server_pids(root):
        try:
            st = read_stat(pid)
            if st is None:
                continue
            fields = status_fields(pid)
            kinds = {}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    k = fd_kind(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    continue
                kinds[k] = kinds.get(k, 0) + 1
            shared_memory_of(pid, shm)
        except (OSError, ValueError):
            continue
        procs.append({"pid": pid, "name": st[0], "rss_kb": fields.get("VmRSS", 0),
                      "anon_kb": fields.get("RssAnon", 0), "file_kb": fields.get("RssFile", 0),
                      "shmem_kb": fields.get("RssShmem", 0), "threads": fields.get("Threads", 0),
                      "fds": sum(kinds.values()), "fd_kinds": kinds, "cpu_s": st[2]})
    files = [{"name": v["name"], "size": v["size"], "allocated": v["allocated"],
              "how": sorted(v["how"])} for v in shm.values()]
    return procs, files


# ---------------------------------------------------------------- the server's /metrics


def scrape(host, port, timeout=10):
    """{name: value} of unlabelled series and {name: {labels: value}} of labelled ones."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        text = r.read().decode()
        if r.status != 200:
            raise RuntimeError(f"/metrics answered {r.status}")
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if labels:
            out.setdefault(name, {})[labels.strip("{}")] = value
        else:
            out[name] = value
    return out


def metrics_summary(m, blocks_per_group):
    """The figures of one scrape the soak follows."""
    usage = m.get("xdeepserve_kv_cache_usage_ratio", {})
    groups = {re.search(r'group="(\d+)"', k).group(1): v for k, v in usage.items()}
    kv_used = None
    if blocks_per_group:
        kv_used = sum(round(v * blocks_per_group.get(g, 0)) for g, v in groups.items())
    outcomes = {re.search(r'outcome="(\w+)"', k).group(1): int(v)
                for k, v in m.get("xdeepserve_requests_total", {}).items()}
    return {"kv_usage_ratio": groups, "kv_blocks_used": kv_used,
            "running": int(m.get("xdeepserve_requests_running", 0)),
            "waiting": int(m.get("xdeepserve_requests_waiting", 0)),
            "outcomes": outcomes,
            "generation_tokens": int(m.get("xdeepserve_generation_tokens_total", 0)),
            "prompt_tokens": int(m.get("xdeepserve_prompt_tokens_total", 0))}


def blocks_from_log(path):
    """{group: KV blocks} from the server log's 'DP group G: N KV blocks' lines."""
    out = {}
    if path and os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(r"DP group (\d+): (\d+) KV blocks", line)
                if m:
                    out[m.group(1)] = int(m.group(2))
    return out


# ---------------------------------------------------------------- the client


class Counts:
    """Client outcomes, shared by the request threads (every method takes the lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ok = self.cancelled = self.failed = self.skipped = 0
        self.in_flight = 0
        self.failures = {}  # reason -> count
        self.failure_examples = []
        self.ttft, self.e2e, self.prompt_tokens = [], [], []

    def begin(self, limit):
        with self.lock:
            if self.in_flight >= limit:
                self.skipped += 1
                return False
            self.in_flight += 1
            return True

    def end(self, outcome, reason=None, ttft=None, e2e=None, prompt_tokens=None):
        with self.lock:
            self.in_flight -= 1
            if outcome == "ok":
                self.ok += 1
                self.ttft.append(ttft)
                self.e2e.append(e2e)
                self.prompt_tokens.append(prompt_tokens)
            elif outcome == "cancelled":
                self.cancelled += 1
            else:
                self.failed += 1
                key = reason.split(":")[0]
                self.failures[key] = self.failures.get(key, 0) + 1
                if len(self.failure_examples) < 10:
                    self.failure_examples.append(reason)

    def snapshot(self):
        with self.lock:
            return {"ok": self.ok, "cancelled": self.cancelled, "failed": self.failed,
                    "skipped": self.skipped, "in_flight": self.in_flight}


class Workload:
    """Draws requests: endpoint, prompt from a word list, max_tokens, cancel point."""

    def __init__(self, args, words):
        self.a, self.words = args, words
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()

    def draw(self, may_cancel):
        a = self.a
        with self.lock:
            n = self.rng.randint(*a.input_words)
            start = self.rng.randrange(0, len(self.words) - n)
            max_tokens = self.rng.randint(*a.max_tokens)
            chat = self.rng.random() < 0.5
            cancel_after = None
            if may_cancel and self.rng.random() < a.cancel_fraction:
                cancel_after = self.rng.randint(1, 5)
        text = " ".join(self.words[start : start + n])
        body = {"model": a.served_model, "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True, "temperature": 0,
                "stream_options": {"include_usage": True}}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        path = "/v1/chat/completions" if chat else "/v1/completions"
        return path, json.dumps(body), max_tokens, cancel_after


class _Done(Exception):
    """Ends the reading of a stream early (outcome and reason already set)."""


def run_request(a, counts, path, body, max_tokens, cancel_after):
    """One streamed request; ends counts with ok, cancelled or failed (and why)."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(a.host, a.port, timeout=a.request_timeout)
    outcome, reason, ttft, usage = "failed", None, None, None
    try:
        conn.connect()
        sock = conn.sock  # kept: http.client may drop conn.sock while the response is read
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            reason = f"http {r.status}: {r.read(300)!r}"
            raise _Done
        events, finish, done = 0, None, False
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            events += 1
            if ttft is None:
                ttft = time.monotonic() - t0
            if b'"error"' in data:
                reason = f"error event: {data[:300]!r}"
                raise _Done
            if b'"usage"' in data or b'"finish_reason":"' in data:
                j = json.loads(data)
                usage = j.get("usage") or usage
                for c in j.get("choices", []):
                    finish = c.get("finish_reason") or finish
            if cancel_after is not None and events >= cancel_after:
                sock.shutdown(socket.SHUT_RDWR)  # FIN now, whatever else holds the socket
                outcome = "cancelled"
                raise _Done
        got = (usage or {}).get("completion_tokens")
        if not done:
            reason = f"stream ended without [DONE] after {events} events"
        elif finish is None:
            reason = "no finish_reason"
        elif got != max_tokens:
            reason = f"short: completion_tokens {got} of {max_tokens}"
        else:
            outcome = "ok"
    except _Done:
        pass
    except (OSError, http.client.HTTPException, ValueError) as e:
        reason = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    counts.end(outcome, reason, ttft, time.monotonic() - t0,
               (usage or {}).get("prompt_tokens"))


def probe_capacity(a, counts, workload, stop):
    """Closed loop of --probe-concurrency workers, no cancels; returns completed requests/s."""
    done_before = counts.snapshot()["ok"]
    t0 = time.monotonic()

    def worker():
        while not stop.is_set() and time.monotonic() - t0 < a.probe_duration:
            if counts.begin(1 << 30):
                run_request(a, counts, *workload.draw(may_cancel=False))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.probe_concurrency)]
    for t in threads:
        t.start()
    return threads, t0, done_before


def open_loop(a, counts, workload, rate, stop, t_end):
    """Poisson arrivals at RATE until t_end (monotonic); a thread per request."""
    rng = random.Random(a.seed + 1)
    next_t = time.monotonic()
    while not stop.is_set():
        next_t += rng.expovariate(rate)
        if next_t >= t_end:
            break
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if not counts.begin(a.max_in_flight):
            continue
        req = workload.draw(may_cancel=True)
        threading.Thread(target=run_request, args=(a, counts, *req), daemon=True).start()


# ---------------------------------------------------------------- sampling and the verdict


def take_sample(a, t, phase, counts, blocks):
    procs, shm = sample_processes(a.server_pid)
    m = metrics_summary(scrape(a.host, a.port), blocks)
    with open("/proc/loadavg") as f:
        load = [float(x) for x in f.read().split()[:3]]
    return {"t": round(t, 1), "phase": phase, "procs": procs,
            "rss_total_kb": sum(p["rss_kb"] for p in procs),
            "fds_total": sum(p["fds"] for p in procs),
            "shm_bytes": sum(f["allocated"] for f in shm), "shm_files": shm,
            "metrics": m, "client": counts.snapshot(), "loadavg": load}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def check_rss(samples, a):
    """Per process and total: median RSS of the last window of the load vs the first one after
    the warm-up; also the least-squares slope over all post-warm-up samples (KiB/min)."""
    post = [s for s in samples if s["phase"] == "load" and s["t"] >= a.warmup]
    if len(post) < 6:
        return [("rss", False, f"only {len(post)} samples after the warm-up (need 6)")], {}
    w = max(3, round(len(post) / 10))
    first, last = post[:w], post[-w:]

    def series(name, key):
        if name == "total":
            return lambda s: sum(p[key] for p in s["procs"])
        return lambda s: next((p[key] for p in s["procs"] if p["name"] == name), 0)

    names = [p["name"] for p in post[0]["procs"]] + ["total"]
    served = lambda s: s["client"]["ok"] + s["client"]["cancelled"]  # noqa: E731
    requests = served(last[len(last) // 2]) - served(first[len(first) // 2])
    results, detail = [], {}
    for name in names:
        f, anon = series(name, "rss_kb"), series(name, "anon_kb")
        m0, m1 = median([f(s) for s in first]), median([f(s) for s in last])
        change = (m1 - m0) / m0 if m0 else float("inf")
        ts, ys = [s["t"] for s in post], [f(s) for s in post]
        tm, ym = statistics.fmean(ts), statistics.fmean(ys)
        den = sum((t - tm) ** 2 for t in ts)
        slope = sum((t - tm) * (y - ym) for t, y in zip(ts, ys)) / den * 60 if den else 0.0
        per_k = (m1 - m0) / requests * 1000 if requests else None
        detail[name] = {"first_median_kb": m0, "last_median_kb": m1, "change": change,
                        "anon_first_median_kb": median([anon(s) for s in first]),
                        "anon_last_median_kb": median([anon(s) for s in last]),
                        "slope_kb_per_min": slope, "kb_per_1000_requests": per_k,
                        "requests_between": requests, "window": w}
        ok = abs(change) <= a.rss_tolerance
        per = f", {per_k:+.1f} KiB per 1000 requests" if per_k is not None else ""
        results.append((f"rss {name}", ok,
                        f"{m0 / 1024:.1f} -> {m1 / 1024:.1f} MiB ({change * 100:+.2f} %, "
                        f"slope {slope:+.1f} KiB/min{per}; medians of {w} samples)"))
    return results, detail


def judge(samples, counts, a, m_start, m_end):
    start = samples[0]
    idle0 = next(s for s in samples if s["phase"] == "idle")
    idle1 = samples[-1]
    checks = []
    rss_checks, rss_detail = check_rss(samples, a)
    checks += rss_checks
    fd_start = {p["name"]: p["fds"] for p in start["procs"]}
    fd0 = {p["name"]: p["fds"] for p in idle0["procs"]}
    for p in idle1["procs"]:
        grew = p["fds"] - fd0.get(p["name"], 0)
        checks.append((f"fds {p['name']}", grew <= 0,
                       f"{fd0.get(p['name'])} idle after the probe ({fd_start.get(p['name'])} "
                       f"before any request), {p['fds']} idle after the load ({p['fd_kinds']})"))
    checks.append(("shm", idle1["shm_bytes"] <= idle0["shm_bytes"],
                   f"{idle0['shm_bytes']} B idle after the probe ({start['shm_bytes']} B before "
                   f"any request), {idle1['shm_bytes']} B idle after the load "
                   f"({len(idle1['shm_files'])} files/memfds)"))
    m = idle1["metrics"]
    kv_ok = (m["kv_blocks_used"] in (0, None) and not any(m["kv_usage_ratio"].values())
             and m["running"] == 0 and m["waiting"] == 0)
    checks.append(("kv", kv_ok, f"{m['kv_blocks_used']} blocks used (ratio "
                   f"{m['kv_usage_ratio']}), {m['running']} running, {m['waiting']} waiting "
                   "after the load"))
    c = counts.snapshot()
    checks.append(("requests", c["failed"] == 0 and c["skipped"] == 0 and c["ok"] > 0,
                   f"{c['ok']} ok, {c['cancelled']} cancelled, {c['failed']} failed "
                   f"{counts.failures}, {c['skipped']} skipped (over --max-in-flight)"))
    d = {k: m_end["outcomes"].get(k, 0) - m_start["outcomes"].get(k, 0)
         for k in ("success", "cancelled", "rejected", "error")}
    late = d["success"] - c["ok"]
    agree = (d["success"] + d["cancelled"] == c["ok"] + c["cancelled"] and late >= 0
             and d["rejected"] == 0 and d["error"] == 0)
    checks.append(("metrics", agree,
                   f"server success {d['success']}, cancelled {d['cancelled']}, rejected "
                   f"{d['rejected']}, error {d['error']}; client ok {c['ok']}, cancelled "
                   f"{c['cancelled']}; {late} cancels the server had finished first"))
    pids0 = {p["name"]: p["pid"] for p in idle0["procs"]}
    changed = [s["t"] for s in samples if {p["name"]: p["pid"] for p in s["procs"]} != pids0]
    checks.append(("processes", not changed,
                   f"{sorted(pids0)} all along" if not changed else
                   f"the set of processes changed at t = {changed[:5]}"))
    return checks, rss_detail


# ---------------------------------------------------------------- the table


def table(samples, names):
    head = (["t s", "phase"] + [f"{n} MiB" for n in names]
            + ["total MiB", "fds", "shm MiB", "KV used", "run", "ok", "canc", "fail", "load1"])
    rows = []
    for s in samples:
        rss = {p["name"]: p["rss_kb"] for p in s["procs"]}
        m, c = s["metrics"], s["client"]
        kv = m["kv_blocks_used"]
        if kv is None:
            kv = "/".join(f"{v:.3f}" for v in m["kv_usage_ratio"].values())
        rows.append([f"{s['t']:.0f}", s["phase"]]
                    + [f"{rss.get(n, 0) / 1024:.1f}" for n in names]
                    + [f"{s['rss_total_kb'] / 1024:.1f}", str(s["fds_total"]),
                       f"{s['shm_bytes'] / 2**20:.2f}", str(kv), str(m["running"]),
                       str(c["ok"]), str(c["cancelled"]), str(c["failed"]),
                       f"{s['loadavg'][0]:.2f}"])
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.rjust(w) for x, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(head)] + [fmt(r) for r in rows])


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


# ---------------------------------------------------------------- main


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def parse_range(s):
    lo, _, hi = s.partition("-")
    return int(lo), int(hi or lo)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the server, http://127.0.0.1:PORT")
    p.add_argument("--server-pid", type=int, required=True,
                   help="pid of `xdeepserve serve` (its descendants are found under it)")
    p.add_argument("--server-log", help="the server's log (for the KV blocks per DP group)")
    p.add_argument("--prompts", required=True, help="text the prompts are cut from")
    p.add_argument("--duration", type=float, default=3600, help="seconds of load (3600)")
    p.add_argument("--warmup", type=float, help="seconds of load before RSS must stay flat "
                   "(default: 10 %% of --duration)")
    p.add_argument("--sample-every", type=float, default=10, help="seconds (10)")
    p.add_argument("--rate", type=float, help="requests/s of the soak (default: "
                   "--load-fraction of the capacity the probe measured; the probe runs anyway, "
                   "as the warm-up the idle level is taken after)")
    p.add_argument("--load-fraction", type=float, default=0.8)
    p.add_argument("--probe-duration", type=float, default=30)
    p.add_argument("--probe-concurrency", type=int, default=16)
    p.add_argument("--cancel-fraction", type=float, default=1 / 3)
    p.add_argument("--input-words", type=parse_range, default=(48, 92),
                   help="prompt words LO-HI (48-92: ~64-128 tokens of KJV text)")
    p.add_argument("--max-tokens", type=parse_range, default=(32, 64), help="LO-HI (32-64)")
    p.add_argument("--idle", type=float, default=20,
                   help="seconds of idle after the load before the last sample (20)")
    p.add_argument("--settle", type=float, default=5,
                   help="seconds of idle after the probe before the idle-level sample (5)")
    p.add_argument("--rss-tolerance", type=float, default=0.05)
    p.add_argument("--request-timeout", type=float, default=120,
                   help="seconds of silence before a request fails (120)")
    p.add_argument("--max-in-flight", type=int, default=512)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="bench-out/soak/soak.json")
    p.add_argument("--txt", default="bench-out/soak/soak.txt")
    a = p.parse_args(argv)
    m = re.match(r"http://([^:/]+):(\d+)/?$", a.url)
    if not m:
        p.error(f"--url must be http://HOST:PORT, got '{a.url}'")
    a.host, a.port = m.group(1), int(m.group(2))
    if a.warmup is None:
        a.warmup = 0.1 * a.duration
    return a


def main(argv):
    a = parse_args(argv)
    with open(a.prompts, errors="replace") as f:
        words = f.read().split()
    conn = http.client.HTTPConnection(a.host, a.port, timeout=10)
    conn.request("GET", "/v1/models")
    a.served_model = json.loads(conn.getresponse().read())["data"][0]["id"]
    conn.close()
    blocks = blocks_from_log(a.server_log)
    counts, workload, stop = Counts(), Workload(a, words), threading.Event()
    samples = []
    t_start = time.monotonic()

    def sample(phase, t0):
        s = take_sample(a, time.monotonic() - t0, phase, counts, blocks)
        samples.append(s)
        c, m = s["client"], s["metrics"]
        print(f"[soak] {phase:5s} t={s['t']:7.0f}s rss {s['rss_total_kb'] / 1024:8.1f} MiB "
              f"fds {s['fds_total']:4d} shm {s['shm_bytes'] / 2**20:6.2f} MiB kv "
              f"{m['kv_blocks_used']} run {m['running']:3d} ok {c['ok']} canc {c['cancelled']} "
              f"fail {c['failed']} inflight {c['in_flight']} load {s['loadavg'][0]:.2f}",
              flush=True)
        return s

    m_start = sample("start", t_start)["metrics"]
    threads, t0, ok0 = probe_capacity(a, counts, workload, stop)
    next_s = t0 + a.sample_every
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if time.monotonic() >= next_s:
            sample("probe", t0 + a.probe_duration)  # at negative times: the load starts at 0
            next_s += a.sample_every
    elapsed = time.monotonic() - t0
    done = counts.snapshot()["ok"] - ok0
    capacity = done / elapsed
    probe = {"concurrency": a.probe_concurrency, "seconds": elapsed, "completed": done,
             "capacity_rps": capacity}
    if a.rate is None:
        a.rate = a.load_fraction * capacity
    print(f"[soak] capacity {capacity:.2f} req/s ({done} in {elapsed:.1f} s at concurrency "
          f"{a.probe_concurrency}); soak at {a.rate:.2f} req/s", flush=True)
    # The idle level the end is compared with: after the probe, once the server has served
    # (connections the processes open on first use are there by then).
    time.sleep(a.settle)
    sample("idle", time.monotonic())

    t0 = time.monotonic()
    t_end = t0 + a.duration
    gen = threading.Thread(target=open_loop, args=(a, counts, workload, a.rate, stop, t_end),
                           daemon=True)
    gen.start()
    next_s = t0 + a.sample_every
    while time.monotonic() < t_end:
        time.sleep(max(0.0, min(next_s, t_end) - time.monotonic()))
        if time.monotonic() >= next_s - 0.05:
            sample("load", t0)
            next_s += a.sample_every
    gen.join()
    while counts.snapshot()["in_flight"] > 0 and time.monotonic() < t_end + a.request_timeout:
        time.sleep(0.5)
    sample("drain", t0)
    time.sleep(a.idle)
    sample("end", t0)

    checks, rss_detail = judge(samples, counts, a, m_start, samples[-1]["metrics"])
    names = [p["name"] for p in samples[0]["procs"]]
    text = [table(samples, names), ""]
    c = counts.snapshot()
    latency = {"ttft_p50": pct(counts.ttft, 0.5), "ttft_p99": pct(counts.ttft, 0.99),
               "e2e_p50": pct(counts.e2e, 0.5), "e2e_p99": pct(counts.e2e, 0.99),
               "prompt_tokens_p50": pct(counts.prompt_tokens, 0.5),
               "prompt_tokens_min": pct(counts.prompt_tokens, 0.0),
               "prompt_tokens_max": pct(counts.prompt_tokens, 1.0)}
    loads = [s["loadavg"][0] for s in samples]
    text.append(f"rate {a.rate:.2f} req/s for {a.duration:.0f} s (warm-up {a.warmup:.0f} s); "
                f"client {c}; TTFT P50/P99 {latency['ttft_p50']:.3f}/{latency['ttft_p99']:.3f} "
                f"s, E2E P50/P99 {latency['e2e_p50']:.3f}/{latency['e2e_p99']:.3f} s; prompt "
                f"tokens {latency['prompt_tokens_min']}-{latency['prompt_tokens_max']} (P50 "
                f"{latency['prompt_tokens_p50']}); load average (1 min) {min(loads):.2f}-"
                f"{max(loads):.2f}, mean {statistics.fmean(loads):.2f}")
    for name, ok, detail in checks:
        text.append(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    passed = all(ok for _, ok, _ in checks)
    text.append("soak: " + ("all checks passed" if passed else "FAILED"))
    print("\n".join(text), flush=True)

    out = {"config": {k: v for k, v in vars(a).items()}, "probe": probe,
           "served_model": a.served_model, "kv_blocks_per_group": blocks,
           "client": c, "failures": counts.failures,
           "failure_examples": counts.failure_examples, "latency_s": latency,
           "rss": rss_detail,
           "checks": [{"name": n, "passed": ok, "detail": d} for n, ok, d in checks],
           "passed": passed, "samples": samples, "cpu": cpu_model(), "nproc": os.cpu_count()}
    for path, body in ((a.json, json.dumps(out, indent=1)), (a.txt, "\n".join(text) + "\n")):
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write(body)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
