#!/usr/bin/python3
"""EPLB benchmark: device loads and the MoE phase time before and after a rebalance.

Runs `xdeepserve serve` on a model with skewed routing (mkmodel --router-skew), keeps it
busy with token-id prompts (ignore_eos, greedy), lets the shell collect --slices windows,
rebalances (POST /admin/eplb/rebalance), waits for the new map and --slices more windows.

  --mode loads     per MoE layer: measured max/mean device load before, the planner's
                   prediction from the same counts, measured after (GET /admin/eplb)
  --mode moe-time  the MoE phase (dispatch to combine done, all MoE layers, the slowest
                   device) per step before and after: xdeepserve_moe_seconds_total / xdeepserve_steps_total
                   over a --measure-s interval each side

Prints a table and writes JSON (--out). Example (see docs/benchmarks.md):
  bench/eplb/eplb_bench.py --xdeepserve build/rel/xdeepserve --model MODEL --dp 4 \
      --redundant-slots 2 --mode loads --out bench/results/eplb/loads_dp4.json
"""
import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

KEY = "bench-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {KEY}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return -1, str(e)


def machine():
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cpus, {platform.system()} {platform.release()}"


def metric_by_group(text, name):
    out = {}
    for m in re.finditer(r'^' + name + r'\{group="(\d+)"\} (\S+)$', text, re.M):
        out[int(m.group(1))] = float(m.group(2))
    return out


def state(base):
    status, body = http("GET", base + "/admin/eplb")
    if status != 200:
        raise RuntimeError(f"GET /admin/eplb: {status} {body[:300]}")
    return json.loads(body)


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


class Load:
    def __init__(self, base, streams, prompt_len, max_tokens, vocab, seed):
        self.base, self.stop_flag, self.errors, self.done = base, threading.Event(), [], 0
        self.rng = random.Random(seed)
        self.args = (prompt_len, max_tokens, vocab)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(k,), daemon=True)
                        for k in range(streams)]
        for t in self.threads:
            t.start()

    def run(self, k):
        prompt_len, max_tokens, vocab = self.args
        rng = random.Random(k * 7919 + 1)
        while not self.stop_flag.is_set():
            prompt = [rng.randrange(2, vocab) for _ in range(prompt_len)]
            status, body = http("POST", self.base + "/v1/completions",
                                {"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                                 "temperature": 0, "ignore_eos": True})
            with self.lock:
                if status == 200:
                    self.done += 1
                else:
                    self.errors.append(f"{status}: {body[:200]}")

    def finish(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=1200)


def moe_per_step(base, seconds):
    def sample():
        status, text = http("GET", base + "/metrics")
        return metric_by_group(text, "xdeepserve_moe_seconds_total"), metric_by_group(
            text, "xdeepserve_steps_total")
    m0, s0 = sample()
    time.sleep(seconds)
    m1, s1 = sample()
    per = {}
    for g in m1:
        steps = s1.get(g, 0) - s0.get(g, 0)
        if steps > 0:
            per[g] = (m1[g] - m0.get(g, 0)) / steps
    steps = min(s1.get(g, 0) - s0.get(g, 0) for g in s1) if s1 else 0
    return per, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["loads", "moe-time"], required=True)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--redundant-slots", type=int, default=2)
    ap.add_argument("--window", type=float, default=5)
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--measure-s", type=float, default=60)
    ap.add_argument("--threads-per-device", type=int, default=0)
    ap.add_argument("--compute-dtype", default="bf16")
    ap.add_argument("--skew", default="", help="stated in the JSON (how the model was made)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
           "--instance-port", str(iport), "--api-key", KEY, "--dp", str(args.dp),
           "--redundant-slots", str(args.redundant_slots), "--eplb-window", str(args.window),
           "--eplb-slices", str(args.slices), "--compute-dtype", args.compute_dtype,
           "--max-num-seqs", str(max(args.streams, 1)), "--kv-memory", "1G",
           "--served-model-name", "m"]
    if args.threads_per_device:
        cmd += ["--threads-per-device", str(args.threads_per_device)]
    # The server's log goes to a temporary file (it names local paths): printed on failure.
    log = tempfile.NamedTemporaryFile("w+", prefix="eplb_bench_", suffix=".log", delete=False)
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    result = {"mode": args.mode, "dp": args.dp, "redundant_slots": args.redundant_slots,
              "window_s": args.window, "slices": args.slices, "streams": args.streams,
              "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
              "compute_dtype": args.compute_dtype, "model": os.path.basename(args.model.rstrip("/")),
              "skew": args.skew, "machine": machine()}
    try:
        wait_until(lambda: http("GET", base + "/health", timeout=5)[0] == 200, 600, "health")
        load = Load(base, args.streams, args.prompt_len, args.max_tokens, vocab, 1)
        wait_until(lambda: state(base)["slices"] >= args.slices, 3600, "windows before")
        if args.mode == "moe-time":
            result["before_moe_s_per_step"], result["before_steps"] = moe_per_step(base, args.measure_s)
        before_state = state(base)
        status, body = http("POST", base + "/admin/eplb/rebalance")
        if status != 202:
            raise RuntimeError(f"rebalance: {status} {body}")
        plan = json.loads(body)
        t0 = time.time()
        done = wait_until(lambda: (lambda s: s if s["map_version"] >= plan["version"] and
                                   s["phase"] == "idle" else None)(state(base)), 3600, "switch")
        result["switch_s"] = time.time() - t0
        result["last_rebalance"] = done.get("last_rebalance")
        # --slices windows entirely under the new map.
        def after_ready():
            s = state(base)
            cur = [l["max_mean"].get("current") for l in s["layers"]]
            return s if all(c is not None for c in cur) and s["slices"] >= args.slices else None
        time.sleep(args.window * (args.slices + 1))
        after_state = wait_until(after_ready, 3600, "windows after")
        if args.mode == "moe-time":
            result["after_moe_s_per_step"], result["after_steps"] = moe_per_step(base, args.measure_s)
        load.finish()
        result["requests_done"], result["request_errors"] = load.done, load.errors[:5]
        rows, idle = [], []
        for i, l in enumerate(after_state["layers"]):
            if sum(l["expert_tokens"]) == 0:  # e.g. the MTP layer without speculative decoding
                idle.append(l["layer"])
                continue
            rows.append({"layer": l["layer"],
                         "before": plan["before_max_mean"][i],
                         "predicted": plan["predicted_max_mean"][i],
                         "after": l["max_mean"]["current"],
                         "after_predicted": l["max_mean"].get("current_predicted"),
                         "copies": sum(len(r) for r in l["replicas"])})
        result["layers"] = rows
        result["layers_without_tokens"] = idle
    except Exception:
        log.flush()
        log.seek(0)
        print(log.read()[-4000:], file=sys.stderr)
        raise
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=300)
        except subprocess.TimeoutExpired:
            server.kill()
    lines = [f"EPLB {args.mode}: {result['model']} {args.skew} --dp {args.dp} "
             f"--redundant-slots {args.redundant_slots}, {args.streams} streams, "
             f"windows {args.window} s x {args.slices}"]
    lines.append("before: measured under the identity map; predicted: the planner's prediction "
                 "from those counts; after: measured under the new map; same-counts: the new "
                 "map's prediction from the after windows' own counts")
    lines.append(f"{'layer':>5} {'before':>8} {'predicted':>9} {'after':>8} {'|a-p|':>7} "
                 f"{'same-counts':>11} {'|a-s|':>7}")
    for r in result["layers"]:
        sp = r["after_predicted"] if r["after_predicted"] is not None else float("nan")
        lines.append(f"{r['layer']:>5} {r['before']:8.3f} {r['predicted']:9.3f} {r['after']:8.3f} "
                     f"{abs(r['after'] - r['predicted']):7.3f} {sp:11.3f} {abs(r['after'] - sp):7.3f}")
    if result.get("layers_without_tokens"):
        lines.append(f"(MoE layers without tokens, left out: {result['layers_without_tokens']})")
    n = len(result["layers"])
    mean = lambda k: sum(r[k] for r in result["layers"]) / n
    result["mean"] = {k: mean(k) for k in ("before", "predicted", "after")}
    result["max_abs_after_minus_predicted"] = max(abs(r["after"] - r["predicted"])
                                                  for r in result["layers"])
    result["max_abs_after_minus_same_counts"] = max(
        abs(r["after"] - r["after_predicted"]) for r in result["layers"]
        if r["after_predicted"] is not None)
    lines.append(f"{'mean':>5} {mean('before'):8.3f} {mean('predicted'):9.3f} {mean('after'):8.3f} "
                 f"{result['max_abs_after_minus_predicted']:7.3f} (max)")
    if args.mode == "moe-time":
        b = max(result["before_moe_s_per_step"].values())
        a = max(result["after_moe_s_per_step"].values())
        result["moe_ms_per_step"] = {"before": b * 1e3, "after": a * 1e3,
                                     "reduction": 1 - a / b if b > 0 else 0}
        sb = args.measure_s / result["before_steps"] if result["before_steps"] else 0
        sa = args.measure_s / result["after_steps"] if result["after_steps"] else 0
        result["step_wall_ms"] = {"before": sb * 1e3, "after": sa * 1e3}
        lines.append(f"MoE phase per step (slowest device): before {b*1e3:.1f} ms "
                     f"({result['before_steps']} steps), after {a*1e3:.1f} ms "
                     f"({result['after_steps']} steps): {100*(1-a/b):.1f}% lower")
        lines.append(f"wall time per step: before {sb*1e3:.0f} ms (MoE {100*b/sb if sb else 0:.0f}%), "
                     f"after {sa*1e3:.0f} ms (MoE {100*a/sa if sa else 0:.0f}%); "
                     f"load average {os.getloadavg()[0]:.1f} at the end")
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".txt", "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
