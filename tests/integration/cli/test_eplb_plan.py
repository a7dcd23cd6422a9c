"""`xdeepserve eplb-plan`: a plan for a small counts file, checked against values worked out
by hand from the rules in src/eplb/planner.h, written to --out and to stdout alike; bad input
(a missing or malformed file, ragged or negative counts, E not divisible by N, a budget above
N·S, flags out of range) is a clear error naming the field and a non-zero exit code."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

XDS = None

# Layer 5: E = 4, N = 2 (d0: e0 e1, d1: e2 e3), S = 2, R = 4.
#   slices [0,2,6,0], [3,2,0,0], [3,2,0,0]; tail_before = 6 + 3 + 3 = 12.
#   Round 1: candidates {0, 2}: tail(0) = 6 + 2 + 2 = 10, tail(2) = 3 + 3 + 3 = 9 -> 2.
#   Round 2: 2 is on both devices -> {0}: 3 + 2 + 2 = 7 -> 0.
#   Round 3: argmax 2, 1, 1 -> {1}: 3 + 1.5 + 1.5 = 6 -> 1. Round 4: argmax 2, 0, 0, both
#   on 2 devices: stop. tail_after = 6.
#   Placement: share [3,3,3,0]; d0 = 6, d1 = 3; by total then id: e0 -> d1 (6), e1 -> d1
#   (9, full), e2 -> d0.
# Layer 0: E = 4, N = 2, S = 2, R = 4; one slice [5,5,1,1]; tail_before 5.
#   Round 1: argmax tie -> 0: tail 5 -> 0. Round 2: sim [2.5,5,1,1]: {1}: tail 2.5 -> 1.
#   Round 3: sim [2.5,2.5,1,1]: argmax 0, on 2 devices: stop. tail_after 2.5.
#   Placement: share [2.5,2.5,1,1]; d0 = 5, d1 = 2. e0 -> d1 (4.5); e1 -> d1 (its second
#   slot; d0 holds e1).
COUNTS = {"n_experts": 4, "layers": [
    {"layer": 5, "counts": [[0, 2, 6, 0], [3, 2, 0, 0], [3, 2, 0, 0]]},
    {"layer": 0, "counts": [[5, 5, 1, 1]]},
]}
EXPECTED = {"layers": [
    {"layer": 5, "replicas": [2, 0, 1],
     "placement": [{"expert": 0, "device": 1}, {"expert": 1, "device": 1}, {"expert": 2, "device": 0}],
     "dropped": [], "tail_before": 12.0, "tail_after": 6.0},
    {"layer": 0, "replicas": [0, 1],
     "placement": [{"expert": 0, "device": 1}, {"expert": 1, "device": 1}],
     "dropped": [], "tail_before": 5.0, "tail_after": 2.5},
]}
# The same file with S = 1 and R = 1: layer 5 keeps round 1 only (e2, tail 9; e2 -> d0),
# layer 0 round 1 only (e0, tail 5; e0 -> d1).
EXPECTED_BUDGET_1 = {"layers": [
    {"layer": 5, "replicas": [2], "placement": [{"expert": 2, "device": 0}], "dropped": [],
     "tail_before": 12.0, "tail_after": 9.0},
    {"layer": 0, "replicas": [0], "placement": [{"expert": 0, "device": 1}], "dropped": [],
     "tail_before": 5.0, "tail_after": 5.0},
]}


def run(*args, timeout=60):
    p = subprocess.run([XDS, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class EplbPlan(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="xds_eplb_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def write(self, name, content):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def expect_error(self, args, code, *fragments):
        rc, out, err = run("eplb-plan", *args)
        self.assertEqual(rc, code, f"args {args}: stderr {err!r}")
        self.assertNotIn("Sanitizer", err)
        self.assertEqual(out, "")
        for f in fragments:
            self.assertIn(f, err, f"args {args}")

    def test_plan_to_file_and_stdout(self):
        counts = self.write("counts.json", COUNTS)
        out = os.path.join(self.tmp, "plan.json")
        rc, stdout, err = run("eplb-plan", "--counts", counts, "--devices", "2", "--redundant-slots", "2",
                              "--out", out)
        self.assertEqual(rc, 0, err)
        self.assertEqual(stdout, "")
        with open(out) as f:
            self.assertEqual(json.load(f), EXPECTED)
        self.assertIn("2 layers, 5 replicas placed, 0 dropped", err)

        rc, stdout, err = run("eplb-plan", "--counts", counts, "--devices", "2", "--redundant-slots", "2")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(stdout), EXPECTED)

        rc, stdout, err = run("eplb-plan", "--counts", counts, "--devices", "2", "--redundant-slots", "1",
                              "--budget", "1")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(stdout), EXPECTED_BUDGET_1)

    def test_bad_files(self):
        missing = os.path.join(self.tmp, "nope.json")
        self.expect_error(["--counts", missing, "--devices", "2", "--redundant-slots", "1"], 1, missing)
        bad = self.write("bad.json", "{\"n_experts\": 4,")
        self.expect_error(["--counts", bad, "--devices", "2", "--redundant-slots", "1"], 1, bad, "invalid JSON")
        ragged = self.write("ragged.json", {"n_experts": 4, "layers": [{"layer": 1, "counts": [[1, 2, 3, 4], [1, 2, 3]]}]})
        self.expect_error(["--counts", ragged, "--devices", "2", "--redundant-slots", "1"], 1,
                          "field 'layers[0].counts[1]' must be an array of n_experts = 4 numbers, got 3 values")
        negative = self.write("negative.json", {"n_experts": 4, "layers": [{"layer": 1, "counts": [[1, -2, 3, 4]]}]})
        self.expect_error(["--counts", negative, "--devices", "2", "--redundant-slots", "1"], 1,
                          "field 'layers[0].counts[0][1]' must be a number >= 0, got -2")
        no_experts = self.write("no_experts.json", {"layers": []})
        self.expect_error(["--counts", no_experts, "--devices", "2", "--redundant-slots", "1"], 1,
                          "field 'n_experts' is missing")

    def test_bad_shapes(self):
        counts = self.write("counts4.json", COUNTS)
        self.expect_error(["--counts", counts, "--devices", "3", "--redundant-slots", "1"], 1,
                          "n_experts 4 is not divisible by devices 3")
        self.expect_error(["--counts", counts, "--devices", "2", "--redundant-slots", "1", "--budget", "3"], 1,
                          "budget 3 exceeds devices × redundant_slots = 2 × 1 = 2")
        # CLI11 refuses values outside the flags' ranges (ValidationError, 105).
        self.expect_error(["--counts", counts, "--devices", "0", "--redundant-slots", "1"], 105, "--devices")
        self.expect_error(["--counts", counts, "--devices", "2", "--redundant-slots", "-1"], 105,
                          "--redundant-slots")
        self.expect_error(["--counts", counts, "--devices", "2", "--redundant-slots", "1", "--budget", "-1"], 105,
                          "--budget")
        # A directory as --out: the error names it, and nothing is printed as a plan.
        self.expect_error(["--counts", counts, "--devices", "2", "--redundant-slots", "1", "--out", self.tmp], 1,
                          self.tmp)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    args, rest = ap.parse_known_args()
    XDS = args.xdeepserve
    unittest.main(argv=[sys.argv[0]] + rest)
