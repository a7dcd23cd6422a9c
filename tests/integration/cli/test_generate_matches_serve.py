"""`xdeepserve generate --seed S --temperature T` samples the tokens `xdeepserve serve` gives a
/v1/completions request with the same prompt, seed and sampling options: both draw with the
engine's sampler, keyed by (seed, position, draw), so one request's tokens depend on nothing
else. Checked without speculation (k = 0) and with MTP speculative decoding (k = 2, where
the acceptance test and the residual draw use their own draws), on two models:
  - the tiny mkmodel preset (random weights, no tokenizer): the prompt and the output are
    token ids on both sides (generate prints them, the server returns choices[].token_ids);
    its MTP drafts are mostly rejected, so the residual draw decides most steps;
  - the shipped kjv-moe-tiny (a tokenizer, a trained MTP layer): a text prompt, the text
    compared; its drafts are mostly accepted.
Every sampled output is also checked to differ from the greedy one for the same prompt (else
the comparison would not show sampling agreeing). The requests run one at a time with
distinct prompts shorter than a KV block, so no prompt is served from the prefix cache."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "e2e"))
from serve_e2e_test import free_port, http, wait_healthy  # noqa: E402

XDS = None
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
KJV = os.path.join(ROOT, "models", "kjv-moe-tiny")
MAX_TOKENS = 24
# (seed, temperature, top_p, top_k)
SETTINGS = [(5, 0.8, 1.0, 0), (1234567, 1.3, 0.9, 0), (42, 1.0, 1.0, 20)]
ID_PROMPTS = ["1,2,3,4,5", "7,8,9", "11,12,13,14", "3,1,4,1,5,9,2,6"]
TEXT_PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Hear, O Israel"]


def run(*args, timeout=600):
    p = subprocess.run([XDS, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Server:
    def __init__(self, model, k):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [XDS, "serve", "--model", model, "--port", str(self.port), "--instance-port",
               str(free_port()), "--dp", "1", "--kv-memory", "16M", "--threads-per-device", "1",
               "--compute-dtype", "f32"]
        if k > 0:
            cmd += ["--speculative-tokens", str(k)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if wait_healthy(self.base, self.proc, timeout_s=180):
            return
        out = self.stop()
        raise AssertionError(f"serve {model} k={k} did not become healthy: {out[-1000:]}")

    def complete(self, body):
        status, text, _ = http("POST", self.base + "/v1/completions", body, timeout=600)
        if status != 200:
            raise AssertionError(f"completion {body}: {status} {text[:500]}")
        return json.loads(text)["choices"][0]

    def stop(self):
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


class GenerateMatchesServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="xds_gen_serve_")
        cls.tiny = os.path.join(cls.tmp, "tiny")
        rc, _, err = run("mkmodel", "--out", cls.tiny, "--preset", "tiny", "--seed", "3")
        assert rc == 0, err

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def generate(self, model, prompt_flag, prompt, k, setting):
        seed, temperature, top_p, top_k = setting
        args = ["generate", "--model", model, prompt_flag, prompt, "--max-tokens", str(MAX_TOKENS),
                "--ignore-eos", "--threads", "1", "--temperature", str(temperature), "--top-p",
                str(top_p), "--top-k", str(top_k), "--seed", str(seed)]
        if k > 0:
            args += ["--speculative-tokens", str(k)]
        rc, out, err = run(*args)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("Sanitizer", err)
        return out[:-1] if out.endswith("\n") else out  # generate ends with a newline of its own

    def request(self, prompt, setting):
        seed, temperature, top_p, top_k = setting
        return {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "seed": seed,
                "temperature": temperature, "top_p": top_p, "top_k": top_k}

    def check_model(self, model, k, with_ids):
        server = Server(model, k)
        try:
            prompts = ID_PROMPTS if with_ids else TEXT_PROMPTS
            flag = "--prompt-ids" if with_ids else "--prompt"
            for i, setting in enumerate(SETTINGS + [(0, 0.0, 1.0, 0)]):
                prompt = prompts[i]
                expected = self.generate(model, flag, prompt, k, setting)
                greedy = self.generate(model, flag, prompt, k, (0, 0.0, 1.0, 0))
                if setting[1] > 0:
                    self.assertNotEqual(expected, greedy, f"k={k} {prompt!r} {setting}: sampling "
                                                          "gave the greedy output")
                if with_ids:
                    ids = [int(x) for x in prompt.split(",")]
                    got = self.complete_ids(server, ids, setting)
                    self.assertEqual(len(got), MAX_TOKENS)
                    self.assertEqual(",".join(map(str, got)), expected,
                                     f"{model} k={k} prompt {prompt} {setting}")
                else:
                    choice = server.complete(self.request(prompt, setting))
                    self.assertEqual(choice.get("text"), expected,
                                     f"{model} k={k} prompt {prompt!r} {setting}")
        finally:
            server.stop()

    def complete_ids(self, server, ids, setting):
        choice = server.complete(self.request(ids, setting))
        return choice.get("token_ids", [])

    def test_tiny_token_ids_k0(self):
        self.check_model(self.tiny, 0, with_ids=True)

    def test_tiny_token_ids_k2(self):
        self.check_model(self.tiny, 2, with_ids=True)

    def test_kjv_text_k0(self):
        self.check_model(KJV, 0, with_ids=False)

    def test_kjv_text_k2(self):
        self.check_model(KJV, 2, with_ids=False)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    args, rest = ap.parse_known_args()
    XDS = args.xdeepserve
    unittest.main(argv=[sys.argv[0], *rest])
