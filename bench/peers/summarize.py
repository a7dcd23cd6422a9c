#!/usr/bin/env python3
"""Folds bench/peers/run.sh's runs in DIR into one JSON on stdout: per engine and row
(prefill, decode b1/b4/b16) every round's tokens/s and their median, and ours ÷ the peer's
best of the same bit width (the fastest of its runs by median: our W8A8 against its 8-bit
types Q8_0, Q8_0 with run-time repack, Q8_K_R8; our W4 copies against its 4-bit types IQ4_K,
IQ4_KS, Q4_K_R4, Q4_0, repacked or not; our bf16 against its bf16). `summarize.py DIR --markdown` prints the table of docs/benchmarks.md instead."""
import glob
import json
import os
import re
import statistics
import sys


def ours(path):
    rows = {}
    for r in json.load(open(path))["rows"]:
        key = "prefill" if r["phase"] == "prefill" else f"decode_b{r['batch']}"
        rows[key] = r["tokens_per_s"]
    return rows


def peer(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        key = "prefill" if r["row"] == "prefill" else f"decode_b{r['batch']}"
        rows[key] = r["tokens_per_s"]
    return rows


def bits(engine):
    """The weights' bit width of a run: 'ours bench-2.6b-w4a8' -> 4, 'peer q8_0-rtr' -> 8."""
    name = engine.split(" ", 1)[1]
    if engine.startswith("ours "):
        return 4 if "-w4" in name else 8 if "-w8" in name else 16
    return 4 if name.startswith(("iq4", "q4")) else 8 if name.startswith("q8") else 16


def main():
    d = sys.argv[1]
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "ours-*-*.json"))):
        eng = "ours " + re.match(r"ours-(.*)-\d+\.json", os.path.basename(path)).group(1)
        runs.setdefault(eng, []).append(ours(path))
    for path in sorted(glob.glob(os.path.join(d, "peer-*-*.jsonl"))):
        eng = "peer " + re.match(r"peer-(.*)-\d+\.jsonl", os.path.basename(path)).group(1)
        runs.setdefault(eng, []).append(peer(path))
    table = {}
    for eng, rs in runs.items():
        keys = sorted({k for r in rs for k in r})
        table[eng] = {k: {"rounds": [r[k] for r in rs if k in r],
                          "median": statistics.median([r[k] for r in rs if k in r])}
                      for k in keys}
    peers = [e for e in table if e.startswith("peer ")]
    ratios = {}
    best_of = {}  # ours engine -> row -> the peer run it is compared with
    for eng in (e for e in table if e.startswith("ours ")):
        same = [p for p in peers if bits(p) == bits(eng)]
        for k, v in table[eng].items():
            best = max(((table[p][k]["median"], p) for p in same if k in table[p]), default=None)
            if best:
                ratios.setdefault(eng, {})[k] = v["median"] / best[0]
                best_of.setdefault(eng, {})[k] = best[1]
    load = open(os.path.join(d, "load.txt")).read().splitlines() if os.path.exists(
        os.path.join(d, "load.txt")) else []
    if len(sys.argv) > 2 and sys.argv[2] == "--markdown":
        keys = ["prefill", "decode_b1", "decode_b4", "decode_b16"]
        print("| engine | " + " | ".join(keys) + " |")
        print("| --- |" + " --- |" * len(keys))
        for eng in table:
            cells = []
            for k in keys:
                v = table[eng].get(k)
                cells.append("—" if v is None else "**%.1f** (%s)" % (
                    v["median"], ", ".join("%.1f" % x for x in v["rounds"])))
            print(f"| {eng} | " + " | ".join(cells) + " |")
        for eng, r in ratios.items():
            print(f"| {eng} ÷ peer best {bits(eng)}-bit | " + " | ".join(
                "%.2f× (%s)" % (r[k], best_of[eng][k].removeprefix("peer ")) if k in r else "—"
                for k in keys) + " |")
        return
    json.dump({"engines": table, "ours_over_peer_best": ratios, "peer_best": best_of,
               "load": load}, sys.stdout, indent=2, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
