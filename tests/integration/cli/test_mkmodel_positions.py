"""`xdeepserve mkmodel --max-position-embeddings N`: the limit lands in config.json (with
--yarn as factor x original_max_position_embeddings), and the model it writes runs at
positions past the preset's own limit (the tiny preset: 512), where `generate` refuses the
preset's model. The run is checked against a second algorithm: the same prompt prefilled in
one chunk and in chunks of 256 tokens gives the same logits at every position (the chunked
run attends over cached rows written by earlier chunks, so positions past 512 are cached,
read back and rotated in both). Bad values are clear errors."""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

XDS = None
PROMPT = 600  # past the tiny preset's 512


def run(*args, timeout=300):
    p = subprocess.run([XDS, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def read_json(path):
    with open(path) as f:
        return json.load(f)


class MkModelPositions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="xds_mkmodel_")
        rng = random.Random(5)
        cls.ids = ",".join(str(rng.randrange(2, 512)) for _ in range(PROMPT))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def mkmodel(self, name, *extra):
        out = os.path.join(self.tmp, name)
        rc, _, err = run("mkmodel", "--out", out, "--preset", "tiny", "--seed", "4", *extra)
        self.assertEqual(rc, 0, err)
        return out

    def generate(self, model, *extra):
        return run("generate", "--model", model, "--prompt-ids", self.ids, "--max-tokens", "4",
                   "--ignore-eos", "--threads", "2", *extra)

    def test_config_has_the_limit_and_yarn_follows_it(self):
        plain = read_json(os.path.join(self.mkmodel("plain", "--max-position-embeddings", "1024"),
                                       "config.json"))
        self.assertEqual(plain["max_position_embeddings"], 1024)
        self.assertIsNone(plain["rope_scaling"])
        yarn = read_json(os.path.join(
            self.mkmodel("yarn", "--yarn", "--max-position-embeddings", "2048"), "config.json"))
        self.assertEqual(yarn["max_position_embeddings"], 2048)
        self.assertEqual(yarn["rope_scaling"]["factor"], 4.0)
        self.assertEqual(yarn["rope_scaling"]["original_max_position_embeddings"], 512)

    def test_runs_past_the_preset_limit(self):
        preset = self.mkmodel("preset")
        rc, _, err = self.generate(preset)
        self.assertEqual(rc, 1, err)
        self.assertIn("exceeds the model's max_position_embeddings 512", err)
        for name, extra in (("long", []), ("long_yarn", ["--yarn"])):
            model = self.mkmodel(name, "--max-position-embeddings", "1024", *extra)
            dumps = []
            for chunk in ("0", "256"):
                dump = os.path.join(self.tmp, f"{name}_{chunk}.f32")
                rc, _, err = self.generate(model, "--prefill-chunk", chunk, "--dump-logits", dump)
                self.assertEqual(rc, 0, err)
                self.assertNotIn("Sanitizer", err)
                dumps.append(np.fromfile(dump, dtype=np.float32).reshape(-1, 512))
            one, chunked = dumps
            self.assertEqual(one.shape, (PROMPT + 3, 512))  # every prompt row, then 3 decode rows
            self.assertEqual(one.shape, chunked.shape)
            self.assertTrue(np.isfinite(one).all())
            np.testing.assert_allclose(chunked, one, rtol=1e-4, atol=1e-4, err_msg=name)

    def test_bad_values_are_clear_errors(self):
        out = os.path.join(self.tmp, "bad")
        for value in ("0", "-3"):
            rc, _, err = run("mkmodel", "--out", out, "--preset", "tiny",
                             "--max-position-embeddings", value)
            self.assertNotEqual(rc, 0)
            self.assertIn("--max-position-embeddings", err)
        rc, _, err = run("mkmodel", "--out", out, "--preset", "tiny", "--yarn",
                         "--max-position-embeddings", "1030")
        self.assertEqual(rc, 1)
        self.assertIn("--max-position-embeddings 1030 with --yarn must be a multiple", err)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    args, rest = ap.parse_known_args()
    XDS = args.xdeepserve
    unittest.main(argv=[sys.argv[0], *rest])
