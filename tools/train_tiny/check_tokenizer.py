"""Encodes test texts with the recipe's Python BPE and asks the npm package
@huggingface/tokenizers to encode the same texts from the exported tokenizer.json.

Usage: /usr/bin/python3 tools/train_tiny/check_tokenizer.py [MODEL_DIR] [NPM_DIR]
NPM_DIR holds node_modules/@huggingface/tokenizers (default .cache/npm-tok; install with
`npm install --prefix .cache/npm-tok @huggingface/tokenizers`).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

EXTRA_TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the LORD said unto Moses, Stretch out thine hand.\n\n12 And it was so.",
    "  leading spaces, trailing spaces   \n\n\n  ",
    "Numbers 12345 and 3:16; don't we'll I'm they're it's you've I'd",
    "tabs\tand\r\nwindows line ends",
    "Unicode: café naïve Ærø, Ελληνικά, русский, 中文字符, emoji 🙂👍🏽",
    "symbols !!! ??? ... --- ___ a_b __init__ $100 50% #tag @user",
    "",
]


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "models/kjv-moe-tiny"
    npm_dir = sys.argv[2] if len(sys.argv) > 2 else ".cache/npm-tok"
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = bpe.load_tokenizer_json(f.read())
    with open(os.path.join(model_dir, "heldout.txt"), encoding="utf-8") as f:
        held = f.read()
    texts = [held] + [held[i:i + 3000] for i in range(0, len(held), 25000)] + EXTRA_TEXTS
    cases = [{"text": t, "ids": tok.encode(t), "add_special": False} for t in texts]
    cases.append({"text": EXTRA_TEXTS[0], "ids": tok.encode(EXTRA_TEXTS[0], add_bos=True),
                  "add_special": True})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"cases": cases}, f)
        path = f.name
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_tokenizer_npm.mjs")
    r = subprocess.run(["node", script, model_dir, path, os.path.join(npm_dir, "node_modules")])
    os.unlink(path)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
