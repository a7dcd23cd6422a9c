#!/usr/bin/env bash
# The whole recipe: train (resumable), export to models/kjv-moe-tiny, measure, write the
# conformance reference and the model card. Run from anywhere; needs tools/install_deps.sh's
# packages plus Debian's bible-kjv (the `bible` program that prints bible-kjv-text's data).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=/usr/bin/python3
$py tools/train_tiny/train.py --work build/train_tiny/run
$py tools/train_tiny/export.py --work build/train_tiny/run --out models/kjv-moe-tiny
$py tools/train_tiny/evaluate.py --model models/kjv-moe-tiny --out build/train_tiny/run/eval.json
$py tools/train_tiny/conformance.py --model models/kjv-moe-tiny --out tests/conformance/kjv_moe_tiny
$py tools/train_tiny/make_card.py --model models/kjv-moe-tiny --work build/train_tiny/run
if [ -d .cache/npm-tok/node_modules/@huggingface/tokenizers ]; then
  $py tools/train_tiny/check_tokenizer.py models/kjv-moe-tiny .cache/npm-tok
fi
