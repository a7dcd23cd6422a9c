#!/usr/bin/python3
"""What a running `xdeepserve serve` exposes to other local users: every listening TCP socket
of its processes is bound to loopback (127.0.0.1 / ::1) when --host is not given, every memfd
they hold (XCCL arenas, regions) is mode 0600, every Unix socket is abstract or an owner-only
file, and nothing is created in /dev/shm.

The server runs --dp 2 (two device processes, so XCCL arenas exist) and answers one request;
then the kernel's own view is read: /proc/PID/fd, /proc/net/{tcp,tcp6,unix}.
"""
import argparse
import os
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import FAILURES, Served, check, descendants, http, wait_healthy  # noqa: E402

def fds_of(pid):
    """(fd path, link target) of every open fd of pid."""
    out = []
    d = f"/proc/{pid}/fd"
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for n in names:
        try:
            out.append((f"{d}/{n}", os.readlink(f"{d}/{n}")))
        except OSError:
            pass
    return out


def memfd_mappings(pid):
    """(memfd name, mode) of every memfd mapped by pid (the fds are closed once mapped; the
    mapping's /proc/PID/map_files entry still leads to the inode)."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.readlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/memfd:"):
            try:
                mode = stat.S_IMODE(os.stat(f"/proc/{pid}/map_files/{parts[0]}").st_mode)
            except OSError:
                continue
            out.append((parts[5].strip(), mode))
    return out


def listening_tcp(inodes):
    """(family, local address hex, port) of LISTEN sockets whose inode is in inodes."""
    out = []
    for fam in ("tcp", "tcp6"):
        with open(f"/proc/net/{fam}") as f:
            next(f)
            for line in f:
                parts = line.split()
                local, state, inode = parts[1], parts[3], parts[9]
                if state == "0A" and inode in inodes:
                    addr, port = local.split(":")
                    out.append((fam, addr, int(port, 16)))
    return out


def unix_paths(inodes):
    """Paths ('@name' for abstract, '' for unnamed) of Unix sockets whose inode is in inodes."""
    out = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 7 and parts[6] in inodes:
                out.append(parts[7] if len(parts) > 7 else "")
    return out


LOOPBACK = {("tcp", "0100007F"), ("tcp6", "00000000000000000000000001000000")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    served = Served(args.xdeepserve, args.model,
                    ["--dp", "2", "--kv-memory", "16M", "--threads-per-device", "1"])
    server, base, port, output, reader = (served.process, served.base, served.port,
                                          served.output, served.reader)
    try:
        check(wait_healthy(base, server), "the server did not become healthy")
        status, _, _ = http("POST", base + "/v1/completions",
                         {"prompt": "In the beginning", "max_tokens": 4, "temperature": 0})
        check(status == 200, f"a completion answered {status}")
        pids = [server.pid] + descendants(server.pid)
        memfds, sockets = [], set()
        for pid in pids:
            memfds += [(pid, name, mode) for name, mode in memfd_mappings(pid)]
            for path, target in fds_of(pid):
                if target.startswith("/memfd:"):
                    try:
                        memfds.append((pid, target, stat.S_IMODE(os.stat(path).st_mode)))
                    except OSError:
                        pass
                elif target.startswith("socket:["):
                    sockets.add(target[len("socket:["):-1])
        check(len(memfds) >= 2, f"the processes map XCCL memfds (found {len(memfds)})")
        for pid, name, mode in memfds:
            check(mode == 0o600, f"pid {pid}: {name} has mode {oct(mode)}, expected 0o600")
        listeners = listening_tcp(sockets)
        check(any(p == port for _, _, p in listeners), f"the HTTP port {port} among {listeners}")
        for fam, addr, p in listeners:
            check((fam, addr) in LOOPBACK, f"{fam} port {p} listens on {addr}, not loopback")
        for path in unix_paths(sockets):
            if path == "" or path.startswith("@"):
                continue  # unnamed (socketpair) or abstract: no file
            mode = stat.S_IMODE(os.stat(path).st_mode)
            check(mode & 0o077 == 0, f"Unix socket file {path} has mode {oct(mode)}")
        shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        check(shm_after <= shm_before, f"new entries in /dev/shm: {sorted(shm_after - shm_before)}")
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if FAILURES:
        print("".join(output[-40:]), file=sys.stderr)
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("serve_exposure_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
