#!/usr/bin/python3
"""End to end: request text cannot smuggle special tokens into the prompt.

Starts `xdeepserve serve` with the shipped model (whose special tokens are DeepSeek's markers:
<｜begin▁of▁sentence｜> 0, <｜end▁of▁sentence｜> 1, <｜User｜> 2, <｜Assistant｜> 3) and sends
a chat message and a raw completion prompt that hold the EOS marker's text. The prompt's
length (usage.prompt_tokens) shows how it was tokenized:
  - by default the marker is plain text: bos + <｜User｜> + the text's ids + <｜Assistant｜>,
    where the text's ids are those of "<｜" and "end▁of▁sentence｜>" tokenized apart by
    `xdeepserve tokenize` (neither holds a whole marker, and the split falls where the
    pre-tokenizer splits anyway);
  - with --trust-request-special-tokens it is the one EOS id: 4 tokens (bos, <｜User｜>, EOS,
    <｜Assistant｜>) for the chat and 2 (bos, EOS) for the completion;
  - `xdeepserve tokenize --chat` gives the server's default count (the CLI templates message
    content as untrusted too) and does not hold id 1.
"""
import argparse
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import descendants, free_port, http, wait_healthy  # noqa: E402

FAILURES = []
EOS_TEXT = "<｜end▁of▁sentence｜>"


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)
    return cond


def tokenize(xds, model, text, *flags):
    r = subprocess.run([xds, "tokenize", "--model", model, "--text", text, *flags],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"tokenize {text!r} {flags}: {r.stderr[-500:]}")
    return json.loads(r.stdout) if r.returncode == 0 else []


def prompt_tokens(base, path, body):
    status, text, _ = http("POST", base + path, body=body, timeout=120)
    if not check(status == 200, f"POST {path}: {status} {text[:500]}"):
        return -1
    return json.loads(text)["usage"]["prompt_tokens"]


def serve_and_measure(args, flags, label):
    port, iport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [args.xdeepserve, "serve", "--model", args.model, "--port", str(port),
           "--instance-port", str(iport), "--max-num-seqs", "4", "--kv-memory", "64M",
           "--threads-per-device", "1", "--served-model-name", "kjv"] + flags
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = {}
    try:
        if not check(wait_healthy(base, server), f"{label}: server became healthy"):
            return out
        out["chat"] = prompt_tokens(base, "/v1/chat/completions", {
            "model": "kjv", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": EOS_TEXT}]})
        out["completion"] = prompt_tokens(base, "/v1/completions", {
            "model": "kjv", "max_tokens": 1, "temperature": 0, "prompt": EOS_TEXT})
    finally:
        family = descendants(server.pid)
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            log, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            log, _ = server.communicate()
            check(False, f"{label}: server did not stop within 60 s of SIGTERM")
        check(server.returncode == 0, f"{label}: exit code {server.returncode}: {log[-1500:]}")
        for p in family:
            if os.path.exists(f"/proc/{p}"):
                os.kill(p, signal.SIGKILL)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    halves = (tokenize(args.xdeepserve, args.model, "<｜", "--no-special") +
              tokenize(args.xdeepserve, args.model, "end▁of▁sentence｜>", "--no-special"))
    check(len(halves) > 1 and 1 not in halves, f"the marker's text is several plain ids: {halves}")
    check(tokenize(args.xdeepserve, args.model, EOS_TEXT, "--no-special") == [1],
          "the CLI's own text (trusted) still reads the marker as EOS")
    cli_chat = tokenize(args.xdeepserve, args.model, EOS_TEXT, "--chat")
    check(cli_chat == [0, 2] + halves + [3], f"tokenize --chat: {cli_chat} (want [0, 2] + {halves} + [3])")

    default = serve_and_measure(args, [], "default")
    check(default.get("chat") == 3 + len(halves),
          f"default chat prompt_tokens {default.get('chat')} (want {3 + len(halves)})")
    check(default.get("completion") == 1 + len(halves),
          f"default completion prompt_tokens {default.get('completion')} (want {1 + len(halves)})")

    trusted = serve_and_measure(args, ["--trust-request-special-tokens"], "trusted")
    check(trusted.get("chat") == 4, f"trusted chat prompt_tokens {trusted.get('chat')} (want 4)")
    check(trusted.get("completion") == 2,
          f"trusted completion prompt_tokens {trusted.get('completion')} (want 2)")

    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("serve_untrusted: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
