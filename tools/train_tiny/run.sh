#!/usr/bin/env bash
# The whole recipe: train (resumable), export to models/kjv-moe-tiny, measure, write the
# conformance reference, train the second MTP layer, write the model card. Run from anywhere;
# needs tools/install_deps.sh's packages plus Debian's bible-kjv (the `bible` program that
# prints bible-kjv-text's data).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=/usr/bin/python3
$py tools/train_tiny/train.py --work build/train_tiny/run
$py tools/train_tiny/export.py --work build/train_tiny/run --out models/kjv-moe-tiny
$py tools/train_tiny/evaluate.py --model models/kjv-moe-tiny --out build/train_tiny/run/eval.json
$py tools/train_tiny/conformance.py --model models/kjv-moe-tiny --out tests/conformance/kjv_moe_tiny
# The second MTP layer (P083): samples through the engine, so it needs the xdeepserve binary
# (XDEEPSERVE, default build/release/src/cli/xdeepserve).
xds=${XDEEPSERVE:-build/release/src/cli/xdeepserve}
$py tools/train_tiny/train_mtp2.py --xdeepserve "$xds" --model models/kjv-moe-tiny \
  --work build/train_tiny/mtp2 --samples 750 --steps 400
$py tools/train_tiny/make_card.py --model models/kjv-moe-tiny --work build/train_tiny/run \
  --mtp2 build/train_tiny/mtp2
if [ -d .cache/npm-tok/node_modules/@huggingface/tokenizers ]; then
  $py tools/train_tiny/check_tokenizer.py models/kjv-moe-tiny .cache/npm-tok
fi
