#!/usr/bin/python3
"""End to end: the reasoning and tool-call parsers through `xdeepserve serve` and HTTP.

The model is the scripted test model (model_type "xds_scripted", src/model/scripted_lm.h):
its greedy output is a script of token ids, then eos. For each script below the test builds
a model directory in a temporary folder (config.json with the script's ids from `xdeepserve
tokenize`, generation_config.json, and the shipped model's tokenizer files with its chat
template), starts `xdeepserve serve` with the matching --reasoning-parser /
--tool-call-parser, and checks chat completions, not streamed and streamed, over plain HTTP
and through the official openai npm client (openai_parsers.mjs):
  - reasoning_content equals the script's reasoning text, content its answer text;
  - tool_calls carry the script's names and arguments (JSON parsed and compared; DeepSeek's
    arguments also verbatim), finish_reason "tool_calls";
  - the streamed deltas add up to the same;
  - tool_choice "none" leaves the call text in the content.
Then it serves the same model without parser flags: the raw script comes back as content,
and a completions request returns the script's text (the model itself works). The expected
values are the texts written here, never the server's output.

Also: --dp 2 with this model (no MoE layers, nothing for expert parallelism to spread) is a
clear error, not a crash or a hang.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_e2e_test import descendants, free_port, http  # noqa: E402

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)
    return cond


# The scripts' pieces. DeepSeek-V3's tool-call markers are written as the chat template spells
# them (src/output/tool_parser.h); the shipped tokenizer has them as plain text, which is all
# the parsers see.
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

REASONING = "\nThe user greets me. A short, friendly answer will do.\n"
ANSWER = "Hello! How can I help you today?"
THINK_AND_ANSWER = "<think>" + REASONING + "</think>\n\n" + ANSWER

WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}
TIME_ARGS = {"timezone": "Europe/Paris"}
FORECAST_ARGS = {"city": "Lyon", "days": 3, "hourly": False}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "get_forecast", "description": "Forecast for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "hourly": {"type": "boolean"}}}}},
]


def ds_call(name, args):
    return (DS_CALL_BEGIN + "function" + DS_SEP + name + "\n```json\n" + json.dumps(args) +
            "\n```" + DS_CALL_END)


def qwen_call(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class Case:
    """A script and what the parsers must make of it."""

    def __init__(self, name, flags, script, reasoning=None, content=None, calls=(),
                 tool_text=None, opens_think=False, verbatim_args=False):
        self.name = name
        self.flags = flags            # serve's parser flags
        self.script = script          # the model's whole output text
        self.reasoning = reasoning    # expected reasoning_content (None: absent)
        self.content = content        # expected content (None: null / empty)
        self.calls = list(calls)      # expected [(name, arguments dict)]
        self.tool_text = tool_text    # content expected with tool_choice "none"
        self.opens_think = opens_think  # the chat template ends with "<think>\n"
        self.verbatim_args = verbatim_args  # arguments text == json.dumps(args)


CASES = [
    # (a) DeepSeek-R1: reasoning in <think> ... </think>, then the answer.
    Case("r1_think", ["--reasoning-parser", "deepseek_r1"], THINK_AND_ANSWER,
         reasoning=REASONING, content=ANSWER),
    # (a') DeepSeek-R1's own template opens "<think>\n" in the prompt: the output starts inside
    # the reasoning, without the opening tag.
    Case("r1_prompt_opens_think", ["--reasoning-parser", "deepseek_r1"],
         "Greeting received; I answer briefly.\n</think>\n\n" + ANSWER,
         reasoning="Greeting received; I answer briefly.\n", content=ANSWER, opens_think=True),
    # (b) DeepSeek-V3 tool calls, two in one section, after some text.
    Case("deepseek_v3_tools", ["--tool-call-parser", "deepseek_v3"],
         "Let me check." + DS_CALLS_BEGIN + ds_call("get_weather", WEATHER_ARGS) + "\n" +
         ds_call("get_time", TIME_ARGS) + DS_CALLS_END,
         content="Let me check.",
         calls=[("get_weather", WEATHER_ARGS), ("get_time", TIME_ARGS)], verbatim_args=True),
    # (c) Qwen3 tool calls.
    Case("qwen3_tools", ["--tool-call-parser", "qwen3"],
         qwen_call("get_weather", WEATHER_ARGS) + "\n" + qwen_call("get_forecast", FORECAST_ARGS),
         calls=[("get_weather", WEATHER_ARGS), ("get_forecast", FORECAST_ARGS)]),
    # (d) Qwen3 reasoning.
    Case("qwen3_reasoning", ["--reasoning-parser", "qwen3"], THINK_AND_ANSWER,
         reasoning=REASONING, content=ANSWER),
    # (c + d) Qwen3 thinks, then calls a tool: the reasoning parser's content feeds the tool
    # parser.
    Case("qwen3_reasoning_tools", ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3"],
         "<think>\nI should look the weather up.\n</think>\n\n" +
         qwen_call("get_weather", WEATHER_ARGS),
         reasoning="\nI should look the weather up.\n",
         calls=[("get_weather", WEATHER_ARGS)]),
]
for c in CASES:
    if c.calls and c.tool_text is None:
        # What the tool parser sees: the script after the reasoning parser.
        c.tool_text = c.script.split("</think>\n\n", 1)[1] if c.reasoning is not None else c.script


def tokenize(xdeepserve, tokenizer_dir, text):
    r = subprocess.run([xdeepserve, "tokenize", "--model", tokenizer_dir, "--text", text,
                        "--no-special"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"tokenize failed: {r.stderr}")
    return json.loads(r.stdout)


def make_model(root, case, xdeepserve, tokenizer_dir):
    """The scripted model directory of `case`; returns (dir, number of script ids)."""
    d = os.path.join(root, case.name)
    os.makedirs(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(d, f))
    with open(os.path.join(tokenizer_dir, "config.json")) as f:
        base = json.load(f)
    ids = tokenize(xdeepserve, tokenizer_dir, case.script)
    config = {"model_type": "xds_scripted", "architectures": ["XdsScriptedForCausalLM"],
              "vocab_size": base["vocab_size"], "max_position_embeddings": 1024,
              "script_token_ids": ids, "eos_token_id": base["eos_token_id"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": base["bos_token_id"], "eos_token_id": base["eos_token_id"],
                   "do_sample": False}, f)
    return d, len(ids)


def opening_template(tokenizer_dir, root):
    """The shipped chat template with "<think>\\n" after the generation prompt (DeepSeek-R1)."""
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        tmpl = json.load(f)["chat_template"]
    gen = "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
    if gen not in tmpl:
        raise RuntimeError("the shipped chat template changed: update opening_template()")
    path = os.path.join(root, "r1_template.jinja")
    with open(path, "w") as f:
        f.write(tmpl.replace(gen, "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}<think>\n"
                                  "{% endif %}"))
    return path


class Server:
    def __init__(self, xdeepserve, model_dir, flags, dp=1):
        self.port, iport = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [xdeepserve, "serve", "--model", model_dir, "--port", str(self.port),
               "--instance-port", str(iport), "--dp", str(dp), "--max-num-seqs", "8",
               "--kv-memory", "1M", "--threads-per-device", "1",
               "--served-model-name", "scripted"] + flags
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.output = ""

    def wait_healthy(self, seconds=120):
        deadline = time.time() + seconds
        while time.time() < deadline and self.proc.poll() is None:
            try:
                status, _, _ = http("GET", self.base + "/health", timeout=5)
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def stop(self, label):
        family = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.output, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output, _ = self.proc.communicate()
            check(False, f"{label}: server did not stop within 60 s of SIGTERM")
        check(self.proc.returncode == 0, f"{label}: server exit code {self.proc.returncode}")
        time.sleep(0.3)
        left = [p for p in family if os.path.exists(f"/proc/{p}")]
        check(not left, f"{label}: processes left behind: {left}")


def chat_http(base, request):
    """Chat over plain HTTP, not streamed and streamed: {whole, streamed} as the .mjs reports."""
    url = base + "/v1/chat/completions"
    status, text, _ = http("POST", url, body=dict(request, model="scripted"), timeout=120)
    if status != 200:
        raise RuntimeError(f"chat: status {status}: {text}")
    r = json.loads(text)
    m = r["choices"][0]["message"]
    whole = {"content": m.get("content"), "reasoning_content": m.get("reasoning_content"),
             "tool_calls": [{"id": c["id"], "type": c["type"], "name": c["function"]["name"],
                             "arguments": c["function"]["arguments"]}
                            for c in m.get("tool_calls") or []],
             "finish_reason": r["choices"][0]["finish_reason"], "chunks": 1,
             "completion_tokens": r["usage"]["completion_tokens"]}
    status, text, _ = http("POST", url, body=dict(request, model="scripted", stream=True),
                           timeout=120)
    if status != 200:
        raise RuntimeError(f"streamed chat: status {status}: {text}")
    content, reasoning, finish, chunks, calls, done = "", None, None, 0, {}, False
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
            break
        chunk = json.loads(payload)
        chunks += 1
        for c in chunk["choices"]:
            delta = c.get("delta", {})
            content += delta.get("content") or ""
            if isinstance(delta.get("reasoning_content"), str):
                reasoning = (reasoning or "") + delta["reasoning_content"]
            for t in delta.get("tool_calls") or []:
                acc = calls.setdefault(t["index"], {"id": "", "type": "", "name": "",
                                                    "arguments": ""})
                acc["id"] = t.get("id") or acc["id"]
                acc["type"] = t.get("type") or acc["type"]
                acc["name"] += (t.get("function") or {}).get("name") or ""
                acc["arguments"] += (t.get("function") or {}).get("arguments") or ""
            if c.get("finish_reason"):
                finish = c["finish_reason"]
    check(done, "the stream ends with data: [DONE]")
    check(sorted(calls) == list(range(len(calls))), f"streamed tool call indexes {sorted(calls)}")
    streamed = {"content": content, "reasoning_content": reasoning,
                "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish,
                "chunks": chunks}
    return {"whole": whole, "streamed": streamed}


def chat_npm(base, request, node_modules):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_parsers.mjs")
    r = subprocess.run(["node", script, base + "/v1", "unused-key", "scripted",
                        json.dumps(request)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"openai client: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(label, got, reasoning, content, calls, verbatim_args=False):
    """`got` (one of whole / streamed) against the expected values."""
    streamed = label.endswith("streamed")
    check(got["reasoning_content"] == reasoning,
          f"{label}: reasoning_content {got['reasoning_content']!r}, want {reasoning!r}")
    if streamed:
        want_content = content or ""
    else:  # content is null for a message of tool calls alone (OpenAI)
        want_content = content if content is not None else (None if calls else "")
    check(got["content"] == want_content,
          f"{label}: content {got['content']!r}, want {want_content!r}")
    want_finish = "tool_calls" if calls else "stop"
    check(got["finish_reason"] == want_finish,
          f"{label}: finish_reason {got['finish_reason']!r}, want {want_finish!r}")
    got_calls = got["tool_calls"]
    if not check(len(got_calls) == len(calls),
                 f"{label}: {len(got_calls)} tool calls, want {len(calls)}: {got_calls}"):
        return
    for i, ((name, args), call) in enumerate(zip(calls, got_calls)):
        check(call["name"] == name, f"{label}: call {i} name {call['name']!r}, want {name!r}")
        check(call["type"] == "function", f"{label}: call {i} type {call['type']!r}")
        check(call["id"].startswith("call_"), f"{label}: call {i} id {call['id']!r}")
        try:
            parsed = json.loads(call["arguments"])
        except ValueError:
            parsed = None
        check(parsed == args, f"{label}: call {i} arguments {call['arguments']!r}, want {args}")
        if verbatim_args:
            check(call["arguments"] == json.dumps(args),
                  f"{label}: call {i} arguments {call['arguments']!r} not as the model wrote them")
    check(len({c["id"] for c in got_calls}) == len(got_calls), f"{label}: call ids repeat")
    if streamed:
        check(got["chunks"] >= 2, f"{label}: {got['chunks']} chunk(s)")


def run_case(args, root, case, template):
    model_dir, n_ids = make_model(root, case, args.xdeepserve, args.tokenizer_model)
    template_flags = ["--chat-template", template] if case.opens_think else []
    request = {"messages": [{"role": "user", "content": "Hello there, what is the weather?"}],
               "tools": TOOLS, "temperature": 0, "max_tokens": n_ids + 16}

    # With the parsers.
    failures_before = len(FAILURES)
    server = Server(args.xdeepserve, model_dir, case.flags + template_flags)
    try:
        if not check(server.wait_healthy(), f"{case.name}: server became healthy"):
            return
        observed = {"http": chat_http(server.base, request),
                    "npm": chat_npm(server.base, request, args.node_modules)}
        for client, o in observed.items():
            for kind in ("whole", "streamed"):
                compare(f"{case.name} {client} {kind}", o[kind], case.reasoning, case.content,
                        case.calls, case.verbatim_args)
        # The script and then eos: every id of the script was sampled, and nothing after.
        got = observed["http"]["whole"]["completion_tokens"]
        check(got == n_ids + 1, f"{case.name}: {got} completion tokens, want {n_ids} + eos")
        if case.calls:
            # tool_choice "none": no tool parsing, the call text stays in the content.
            o = chat_http(server.base, dict(request, tool_choice="none"))
            for kind in ("whole", "streamed"):
                compare(f"{case.name} tool_choice none {kind}", o[kind], case.reasoning,
                        case.tool_text, [])
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        check(False, f"{case.name}: {e}")
    finally:
        server.stop(case.name)
        if len(FAILURES) > failures_before:
            print(server.output[-3000:], file=sys.stderr)

    # Without the parsers: the raw script is the content; completions give the script too.
    server = Server(args.xdeepserve, model_dir, template_flags)
    label = f"{case.name} without parsers"
    try:
        if not check(server.wait_healthy(), f"{label}: server became healthy"):
            return
        for client, o in (("http", chat_http(server.base, request)),
                          ("npm", chat_npm(server.base, request, args.node_modules))):
            for kind in ("whole", "streamed"):
                compare(f"{label} {client} {kind}", o[kind], None, case.script, [])
        status, text, _ = http("POST", server.base + "/v1/completions",
                               body={"model": "scripted", "prompt": "Say it.",
                                     "max_tokens": n_ids + 16, "temperature": 0}, timeout=120)
        if check(status == 200, f"{label}: completions status {status}: {text}"):
            r = json.loads(text)
            check(r["choices"][0]["text"] == case.script,
                  f"{label}: completions text {r['choices'][0]['text']!r}, want {case.script!r}")
            check(r["choices"][0]["finish_reason"] == "stop", f"{label}: completions finish")
            check(r["usage"]["completion_tokens"] == n_ids + 1, f"{label}: completion tokens")
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        check(False, f"{label}: {e}")
    finally:
        server.stop(label)


def check_dp2_refused(args, root):
    """--dp 2 needs MoE layers to spread: a clear error, the process ends, nothing left."""
    model_dir = os.path.join(root, CASES[0].name)
    server = Server(args.xdeepserve, model_dir, [], dp=2)
    try:
        out, _ = server.proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        out, _ = server.proc.communicate()
        check(False, "--dp 2: serve did not end")
    check(server.proc.returncode not in (0, None) and server.proc.returncode > 0,
          f"--dp 2: exit code {server.proc.returncode} (want an error, not a signal)")
    check("has no MoE layers" in out and "--dp 1" in out, f"--dp 2: the error names the cause: "
          f"{out[-1000:]!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--tokenizer-model", required=True,
                    help="a model directory whose tokenizer files the scripted models use")
    ap.add_argument("--node-modules", required=True)
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.node_modules, "openai")):
        print(f"SKIP-FAIL: the openai npm client is not installed in {args.node_modules} "
              "(tools/install_deps.sh installs it)", file=sys.stderr)
        return 1
    root = tempfile.mkdtemp(prefix="xds_scripted_")
    try:
        template = opening_template(args.tokenizer_model, root)
        for case in CASES:
            run_case(args, root, case, template)
        check_dp2_refused(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print(f"serve parsers e2e: all checks passed ({len(CASES)} scripts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
