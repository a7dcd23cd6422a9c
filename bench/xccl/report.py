#!/usr/bin/python3
"""Prints the XCCL vs Open MPI tables and the target checks; writes the merged JSON."""
import json
import sys

def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

xccl, mpi, out = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
rows = xccl + mpi
meta = [r for r in mpi if r["bench"] == "meta"]
memcpy = {r["bytes"]: r for r in rows if r["bench"] == "memcpy"}
p2p = {(r["impl"], r["lanes"], r["bytes"]): r for r in rows if r["bench"] == "p2p"}
put = {r["bytes"]: r for r in rows if r["bench"] == "p2p_put"}
moe = {(r["impl"], r["hidden"], r["dtype"], r["tokens"]): r for r in rows if r["bench"] == "moe"}

def fmt_size(n):
    for unit, d in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= d:
            return f"{n / d:g} {unit}"
    return f"{n} B"

if meta:
    m = meta[0]
    print(f"Open MPI {m['version']}, btl {m['btl']}, vader single-copy mechanism: {m['vader_single_copy']}")
print("\nP2P one-way latency (us) and bandwidth (GB/s); memcpy = one thread, cold buffers")
lanes = sorted({k[1] for k in p2p if k[0] == "xccl"})
hdr = f"{'size':>8} | {'memcpy':>14} | {'Open MPI':>14} | " + " | ".join(f"{'xccl L=' + str(l):>14}" for l in lanes) + f" | {'xccl put':>14}"
print(hdr)
print("-" * len(hdr))
checks = []
for n in sorted(memcpy):
    def cell(r):
        return f"{r['one_way_us']:7.2f} {r['gbps']:6.2f}" if r else f"{'-':>14}"
    mc = memcpy[n]
    line = f"{fmt_size(n):>8} | {mc['us']:7.2f} {mc['gbps']:6.2f} | {cell(p2p.get(('openmpi', 0, n)))} | "
    line += " | ".join(cell(p2p.get(("xccl", l, n))) for l in lanes) + f" | {cell(put.get(n))}"
    print(line)
    best = [p2p[k]["gbps"] for k in p2p if k[0] == "xccl" and k[2] == n]
    if n >= (1 << 20) and best:
        checks.append((f"P2P {fmt_size(n)}: best xccl send/recv bandwidth >= 80% of memcpy",
                       max(best) / mc["gbps"] >= 0.8, f"{max(best) / mc['gbps'] * 100:.0f}%"))
small = min(memcpy)
if ("openmpi", 0, small) in p2p and ("xccl", 1, small) in p2p:
    a, b = p2p[("xccl", 1, small)]["one_way_us"], p2p[("openmpi", 0, small)]["one_way_us"]
    checks.append((f"P2P {small} B latency no worse than Open MPI", a <= b, f"{a:.2f} us vs {b:.2f} us"))

for hidden in sorted({k[1] for k in moe}):
    print(f"\nDispatch / combine, 2 devices, hidden {hidden}, top-8 of 256 experts (us, median)")
    hdr = f"{'tokens':>6} | {'MPI disp':>9} {'MPI comb':>9} | {'xccl disp':>9} {'xccl comb':>9} {'speedup':>7} | {'int8 disp':>9} {'int8 comb':>9} | {'int8/bf16 bytes':>15}"
    print(hdr)
    print("-" * len(hdr))
    for t in sorted({k[3] for k in moe if k[1] == hidden}):
        m = moe.get(("openmpi", hidden, "bf16", t))
        x = moe.get(("xccl", hidden, "bf16", t))
        q = moe.get(("xccl", hidden, "int8", t))
        sp = (m["dispatch_us"] + m["combine_us"]) / (x["dispatch_us"] + x["combine_us"]) if m and x else 0
        ratio = q["dispatch_bytes_pulled"] / x["dispatch_bytes_pulled"] if q and x and x["dispatch_bytes_pulled"] else 0
        f = lambda r, k: f"{r[k]:9.1f}" if r else f"{'-':>9}"
        print(f"{t:>6} | {f(m, 'dispatch_us')} {f(m, 'combine_us')} | {f(x, 'dispatch_us')} {f(x, 'combine_us')} {sp:6.2f}x | {f(q, 'dispatch_us')} {f(q, 'combine_us')} | {ratio:15.3f}")
        if m and x and t >= 8:
            checks.append((f"dispatch+combine {t} tok x {hidden}: >= 2.5x faster than Open MPI", sp >= 2.5, f"{sp:.2f}x"))
        if q and x and t >= 8:
            checks.append((f"INT8 dispatch {t} tok x {hidden} moves half the bytes", ratio <= 0.51, f"{ratio:.3f}"))

print("\nTargets")
for name, ok, val in checks:
    print(f"  [{'met' if ok else 'MISSED'}] {name}: {val}")
with open(out, "w") as f:
    json.dump({"results": rows, "targets": [{"target": n, "met": o, "value": v} for n, o, v in checks]}, f, indent=1)
print(f"\nwrote {out}")
