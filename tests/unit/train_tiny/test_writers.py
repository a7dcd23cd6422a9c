"""Checks the training recipe's hand-written file writers (tools/train_tiny).

- safetensors: a small file is compared with bytes built here by hand (header text,
  little-endian payloads, bf16 round-to-nearest-even), then parsed back; the shipped
  models/kjv-moe-tiny/model.safetensors is parsed and re-serialised byte-exactly.
- tokenizer: BPE training on a tiny text gives the merges derived by hand below; encoding
  gives the ids derived by hand; tokenizer.json round-trips byte-exactly (the small one and
  the shipped one).
- when node and the npm package @huggingface/tokenizers are present (.cache/npm-tok), the
  shipped tokenizer.json is also cross-checked against that independent implementation.
Run: /usr/bin/python3 tests/unit/train_tiny/test_writers.py   (exit status 0 = pass)
"""
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "train_tiny"))

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np      # noqa: E402
import torch            # noqa: E402

import bpe              # noqa: E402
import safetensors_io   # noqa: E402

MODEL_DIR = os.path.join(ROOT, "models", "kjv-moe-tiny")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def f32_from_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_safetensors_hand_bytes():
    # bf16 cases: exact values, and two halfway cases that must round to even.
    vals = [f32_from_bits(0x3F800000),   # 1.0                -> 0x3F80
            f32_from_bits(0xC0200000),   # -2.5               -> 0xC020
            f32_from_bits(0x3F808000),   # 1 + 2^-8 (tie)     -> 0x3F80 (even)
            f32_from_bits(0x3F818000),   # 1 + 3*2^-8 (tie)   -> 0x3F82 (even)
            f32_from_bits(0x3F80C000),   # above the tie      -> 0x3F81
            f32_from_bits(0x00000000)]   # 0.0                -> 0x0000
    want_bf16 = [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3F81, 0x0000]
    tensors = {"w": (torch.tensor(vals).reshape(2, 3), "BF16"),
               "b": (torch.tensor([0.5, -1.0]), "F32")}
    got = safetensors_io.serialize(tensors, {"format": "pt"})
    header = ('{"__metadata__":{"format":"pt"},'
              '"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
              '"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]}}')
    header += " " * ((8 - len(header) % 8) % 8)
    want = (struct.pack("<Q", len(header)) + header.encode()
            + struct.pack("<ff", 0.5, -1.0) + struct.pack("<6H", *want_bf16))
    check(got == want, "safetensors bytes equal the hand-built file")
    check((8 + len(header)) % 8 == 0, "safetensors data starts 8-byte aligned")
    parsed, meta = safetensors_io.parse(got)
    check(meta == {"format": "pt"}, "safetensors metadata read back")
    check(parsed["w"][0].tolist() == [want_bf16[:3], want_bf16[3:]], "bf16 bits read back")
    widened = safetensors_io.to_float32(*parsed["w"]).reshape(-1).tolist()
    check(widened == [1.0, -2.5, 1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7, 0.0], "bf16 widened exactly")
    check(safetensors_io.serialize(parsed, meta) == got, "parse + serialize is byte-exact")


def test_bpe_hand_derived():
    # Pieces: "ab", " ab", " ab", " abc". Pair counts (a,b)=4, (Ġ,a)=3, (b,c)=1 -> merge (a,b);
    # then (Ġ,ab)=3, (ab,c)=1 -> merge (Ġ,ab); then (Ġab,c)=1 -> merge; then no pairs left.
    merges = bpe.train_bpe(["ab ab ab abc"], 4 + 256 + 10)
    check(merges == [("a", "b"), ("Ġ", "ab"), ("Ġab", "c")], f"hand-derived merges {merges}")
    tok = bpe.Tokenizer(merges)
    # ids: 0..3 specials, byte b -> 4 + b, merges -> 260, 261, 262.
    ids = tok.encode("ab abc abd")
    check(ids == [260, 262, 261, 4 + ord("d")], f"hand-derived ids {ids}")
    check(tok.encode("ab", add_bos=True) == [0, 260], "BOS is id 0")
    check(tok.decode(ids) == "ab abc abd", "decode inverts encode")
    check(bpe.pretokenize("Genesis 1\n2 And  it's") ==
          ["Genesis", " 1", "\n", "2", " And", " ", " it", "'s"], "GPT-2 split pattern")
    text = bpe.dumps_tokenizer_json(tok)
    again = bpe.dumps_tokenizer_json(bpe.load_tokenizer_json(text))
    check(text == again, "small tokenizer.json round-trips byte-exactly")
    doc = json.loads(text)
    check(doc["model"]["type"] == "BPE" and doc["model"]["vocab"]["Ġabc"] == 262
          and doc["model"]["merges"][1] == ["Ġ", "ab"], "tokenizer.json model section")
    pre = doc["pre_tokenizer"]["pretokenizers"]
    check(pre[0]["type"] == "Split" and pre[0]["behavior"] == "Isolated"
          and pre[1] == {"type": "ByteLevel", "add_prefix_space": False,
                         "trim_offsets": True, "use_regex": False}, "pre_tokenizer sequence")
    check([t["content"] for t in doc["added_tokens"]] == bpe.SPECIAL_TOKENS
          and [t["id"] for t in doc["added_tokens"]] == [0, 1, 2, 3], "special tokens")


def test_shipped_files():
    st_path = os.path.join(MODEL_DIR, "model.safetensors")
    tj_path = os.path.join(MODEL_DIR, "tokenizer.json")
    if not (os.path.exists(st_path) and os.path.exists(tj_path)):
        check(False, "shipped model files present")
        return
    with open(st_path, "rb") as f:
        data = f.read()
    parsed, meta = safetensors_io.parse(data)
    check(safetensors_io.serialize(parsed, meta) == data,
          "shipped model.safetensors re-serialises byte-exactly")
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        cfg = json.load(f)
    biases = [k for k in parsed if k.endswith("e_score_correction_bias")]
    check(len(biases) == cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
          + cfg["num_nextn_predict_layers"]
          and all(parsed[k][1] == "F32" and np.any(parsed[k][0] != 0) for k in biases),
          "every MoE layer has a non-zero F32 e_score_correction_bias")
    check(all(d == "BF16" for k, (a, d) in parsed.items() if k not in biases),
          "all other tensors are BF16")
    with open(tj_path, encoding="utf-8") as f:
        text = f.read()
    tok = bpe.load_tokenizer_json(text)
    check(bpe.dumps_tokenizer_json(tok) == text, "shipped tokenizer.json round-trips byte-exactly")
    check(len(tok) == cfg["vocab_size"], "tokenizer size equals vocab_size")


def test_npm_cross_check():
    npm_dir = os.path.join(ROOT, ".cache", "npm-tok")
    if not (shutil.which("node") and os.path.isdir(
            os.path.join(npm_dir, "node_modules", "@huggingface", "tokenizers"))):
        print("skip npm cross-check (node or .cache/npm-tok/node_modules/@huggingface/"
              "tokenizers absent)")
        return
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_tiny",
                                                     "check_tokenizer.py"), MODEL_DIR, npm_dir])
    check(r.returncode == 0, "npm @huggingface/tokenizers encodes as the Python encoder")


if __name__ == "__main__":
    torch.set_num_threads(1)
    test_safetensors_hand_bytes()
    test_bpe_hand_derived()
    test_shipped_files()
    test_npm_cross_check()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
