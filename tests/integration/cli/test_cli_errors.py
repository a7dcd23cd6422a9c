"""Bad input to `xdeepserve generate` / `perplexity` gets a clear error (naming what was
wrong and where) and a non-zero exit code, never a crash or a hang."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

XDS = None


def read_json(path):
    with open(path) as f:
        return json.load(f)


def run(*args, timeout=120):
    p = subprocess.run([XDS, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class CliErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="xds_cli_")
        cls.model = os.path.join(cls.tmp, "tiny")
        code, _, err = run("mkmodel", "--out", cls.model, "--preset", "tiny", "--seed", "3")
        assert code == 0, err

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def expect_error(self, args, code, *fragments):
        rc, out, err = run(*args)
        self.assertEqual(rc, code, f"args {args}: stderr {err!r}")
        self.assertNotIn("Sanitizer", err)
        for f in fragments:
            self.assertIn(f, err, f"args {args}")

    def test_missing_model_directory(self):
        self.expect_error(["generate", "--model", os.path.join(self.tmp, "nope"), "--prompt-ids", "1"], 1,
                          "config.json")

    def test_bad_prompt_ids(self):
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1,x,3"], 1, "'x' is not a token id")

    def test_token_id_beyond_vocabulary(self):
        vocab = read_json(os.path.join(self.model, "config.json"))["vocab_size"]
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", f"1,{vocab}"], 1,
                          f"token 1 is id {vocab}, out of range [0, {vocab})")

    def test_text_prompt_without_tokenizer(self):
        self.expect_error(["generate", "--model", self.model, "--prompt", "hello"], 1, "no tokenizer files")

    def test_bad_compute_dtype(self):
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1", "--compute-dtype", "f16"], 1,
                          "--compute-dtype must be f32 or bf16, got 'f16'")

    def test_bad_kv_cache_dtype(self):
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1", "--kv-cache-dtype", "fp8"], 1,
                          "--kv-cache-dtype must be auto, f32, bf16 or int8, got 'fp8'")
        # bf16 planes have one reader, the fast mode's attention kernel.
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1", "--kv-cache-dtype", "bf16"], 1,
                          "a bf16 KV cache needs the bf16 compute dtype")

    def test_sampling_options_that_are_not_numbers(self):
        # CLI::Range lets NaN through (every comparison with it is false); these must not.
        for args in (["--temperature", "nan"], ["--temperature", "inf"],
                     ["--temperature", "1", "--top-p", "nan"], ["--temperature", "1", "--top-p", "1.5"]):
            self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1", *args], 105,
                              args[-2], "not a number in")

    def test_directory_given_as_a_file(self):
        # A directory opens as a stream and reads as empty: it was "fewer than 2 tokens".
        self.expect_error(["perplexity", "--model", self.model, "--file", self.tmp], 1,
                          self.tmp + ": is a directory")

    def test_thread_count_beyond_bound(self):
        # 100000 threads used to abort the process (std::system_error from std::thread).
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1", "--threads", "100000"], 105,
                          "--threads", "not in range 0 to 1024")

    def test_context_beyond_max_position_embeddings(self):
        limit = read_json(os.path.join(self.model, "config.json"))["max_position_embeddings"]
        self.expect_error(["generate", "--model", self.model, "--prompt-ids", "1,2", "--max-tokens", str(limit)], 1,
                          f"exceeds the model's max_position_embeddings {limit}")

    def test_no_prompt(self):
        self.expect_error(["generate", "--model", self.model], 2, "--prompt or --prompt-ids")

    def test_truncated_weights(self):
        broken = os.path.join(self.tmp, "truncated")
        shutil.copytree(self.model, broken)
        path = os.path.join(broken, "model.safetensors")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 1000)
        self.expect_error(["generate", "--model", broken, "--prompt-ids", "1"], 1, "model.safetensors")

    def test_bad_config_field(self):
        broken = os.path.join(self.tmp, "badconfig")
        shutil.copytree(self.model, broken)
        cfg_path = os.path.join(broken, "config.json")
        cfg = read_json(cfg_path)
        cfg["hidden_size"] = -4
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        self.expect_error(["generate", "--model", broken, "--prompt-ids", "1"], 1, "hidden_size")

    def test_nan_weights_give_an_error_not_tokens(self):
        # The final norm's weights set to NaN (all-ones bytes are NaN in F32, BF16 and F16):
        # every logit is NaN, which must be reported, not sampled.
        broken = os.path.join(self.tmp, "nanweights")
        shutil.copytree(self.model, broken)
        path = os.path.join(broken, "model.safetensors")
        with open(path, "r+b") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
            begin, end = header["model.norm.weight"]["data_offsets"]
            f.seek(8 + header_len + begin)
            f.write(b"\xff" * (end - begin))
        self.expect_error(["generate", "--model", broken, "--prompt-ids", "1,2", "--max-tokens", "2"], 1,
                          "not finite", "position 1")
        # The dumps of a failed run: nothing half-written, the previous files untouched.
        out_dir = os.path.join(self.tmp, "nan_dumps")
        os.makedirs(out_dir)
        logits, routing = os.path.join(out_dir, "logits.bin"), os.path.join(out_dir, "routing.jsonl")
        for p in (logits, routing):
            with open(p, "w") as f:
                f.write("previous run")
        self.expect_error(["generate", "--model", broken, "--prompt-ids", "1,2", "--max-tokens", "2",
                           "--dump-logits", logits, "--dump-routing", routing], 1, "not finite")
        self.assertEqual(sorted(os.listdir(out_dir)), ["logits.bin", "routing.jsonl"])
        for p in (logits, routing):
            with open(p) as f:
                self.assertEqual(f.read(), "previous run")

    def test_perplexity_of_nan_weights_is_an_error(self):
        # The trained default model (it has a tokenizer) with its final norm set to NaN: the
        # perplexity printed "-nan" and exited 0.
        kjv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models",
                           "kjv-moe-tiny")
        broken = os.path.join(self.tmp, "kjv_nan")
        shutil.copytree(kjv, broken)
        with open(os.path.join(broken, "model.safetensors"), "r+b") as f:
            header_len = int.from_bytes(f.read(8), "little")
            begin, end = json.loads(f.read(header_len))["model.norm.weight"]["data_offsets"]
            f.seek(8 + header_len + begin)
            f.write(b"\xff" * (end - begin))
        text = os.path.join(self.tmp, "verse.txt")
        with open(text, "w") as f:
            f.write("In the beginning God created the heaven and the earth. " * 60)  # ~660 tokens
        self.expect_error(["perplexity", "--model", broken, "--file", text], 1, "not finite", "position 0")
        limit = read_json(os.path.join(kjv, "config.json"))["max_position_embeddings"]
        self.expect_error(["perplexity", "--model", kjv, "--file", text, "--window", str(limit + 1)], 1,
                          f"exceed the model's max_position_embeddings {limit}")

    def test_dumps_of_a_whole_run(self):
        vocab = read_json(os.path.join(self.model, "config.json"))["vocab_size"]
        layers = read_json(os.path.join(self.model, "config.json"))["num_hidden_layers"]
        logits, routing = os.path.join(self.tmp, "whole_logits.bin"), os.path.join(self.tmp, "whole_routing.jsonl")
        rc, _, err = run("generate", "--model", self.model, "--prompt-ids", "1,2,3", "--max-tokens", "4",
                         "--ignore-eos", "--dump-logits", logits, "--dump-routing", routing)
        self.assertEqual(rc, 0, err)
        # 3 prompt rows + 3 generated tokens fed back (the 4th is not), float32 each.
        self.assertEqual(os.path.getsize(logits), 6 * vocab * 4)
        with open(routing) as f:
            rows = [json.loads(line) for line in f]
        first_k = read_json(os.path.join(self.model, "config.json"))["first_k_dense_replace"]
        self.assertEqual(len(rows), 6 * (layers - first_k))

    def test_speculative_flags(self):
        base = ["generate", "--model", self.model, "--prompt-ids", "1,2", "--max-tokens", "4"]
        self.expect_error(base + ["--speculative-tokens", "2", "--speculative-mtp-layers", "2"], 1,
                          "speculative MTP layers: 2, must be in [0, 1]")
        self.expect_error(base + ["--speculative-mtp-layers", "1"], 1,
                          "--speculative-mtp-layers 1 needs --speculative-tokens k > 0")
        self.expect_error(base + ["--speculative-tokens", "17"], 105, "--speculative-tokens")
        self.expect_error(base + ["--speculative-tokens", "1", "--dump-logits", os.path.join(self.tmp, "l.bin")],
                          1, "cannot be combined with --speculative-tokens")
        # Checkpoints whose config leaves their MTP layer out: the tiny one, and the shipped one
        # (it has a tokenizer, which perplexity needs first).
        kjv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models",
                           "kjv-moe-tiny")
        no_mtp = {}
        for name, src in (("tiny", self.model), ("kjv", kjv)):
            no_mtp[name] = os.path.join(self.tmp, name + "_no_mtp")
            shutil.copytree(src, no_mtp[name])
            config = read_json(os.path.join(no_mtp[name], "config.json"))
            config["num_nextn_predict_layers"] = 0
            with open(os.path.join(no_mtp[name], "config.json"), "w") as f:
                json.dump(config, f)
        self.expect_error(["generate", "--model", no_mtp["tiny"], "--prompt-ids", "1,2", "--speculative-tokens", "1"],
                          1, "num_nextn_predict_layers 0")
        self.expect_error(["perplexity", "--model", no_mtp["kjv"], "--file", __file__, "--mtp-agreement"], 1,
                          "--mtp-agreement", "has no MTP layer")

    def test_speculative_generation(self):
        # The shipped model (wide greedy margins: the margin-checked comparison is
        # model_forward.SpeculativeDecode.*): greedy with drafts is the plain output; sampling
        # with drafts is reproducible for a seed; the stats name acceptance and tokens per step.
        kjv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "models",
                           "kjv-moe-tiny")
        base = ["generate", "--model", kjv, "--prompt", "And the LORD said unto Moses,", "--max-tokens", "24"]
        rc, plain, err = run(*base)
        self.assertEqual(rc, 0, err)
        for k in ("1", "3"):
            rc, out, err = run(*base, "--speculative-tokens", k)
            self.assertEqual(rc, 0, err)
            self.assertEqual(out, plain, f"k {k}")
            self.assertIn("acceptance per draft position", err)
            self.assertIn("mean tokens per step", err)
            self.assertIn("tokens/s", err)
        sampled = base + ["--temperature", "0.8", "--top-p", "0.95", "--seed", "5", "--speculative-tokens", "2"]
        rc, first, err = run(*sampled)
        self.assertEqual(rc, 0, err)
        rc, second, err = run(*sampled)
        self.assertEqual(rc, 0, err)
        self.assertEqual(first, second)

    def test_generation_succeeds_and_reports_throughput(self):
        rc, out, err = run("generate", "--model", self.model, "--prompt-ids", "1,2,3", "--max-tokens", "4",
                           "--ignore-eos")
        self.assertEqual(rc, 0, err)
        ids = [int(x) for x in out.strip().split(",")]
        self.assertEqual(len(ids), 4)
        self.assertIn("tokens/s", err)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    args, rest = ap.parse_known_args()
    XDS = args.xdeepserve
    unittest.main(argv=[sys.argv[0], *rest])
