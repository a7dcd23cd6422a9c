// Cross-checks tokenizer.json with the npm package @huggingface/tokenizers (an independent
// implementation). Usage: node check_tokenizer_npm.mjs MODEL_DIR CASES_JSON
// CASES_JSON: {"cases": [{"text": str, "ids": [int], "add_special": bool}]}
// Prints one line per mismatch and a summary; exits 1 on any mismatch.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modelDir, casesPath, moduleDir] = process.argv.slice(2);
const require = createRequire(path.resolve(moduleDir ?? ".") + "/");
const { Tokenizer } = require("@huggingface/tokenizers");
const tj = JSON.parse(readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
const tc = JSON.parse(readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tj, tc);
const { cases } = JSON.parse(readFileSync(casesPath, "utf8"));
let bad = 0, tokens = 0, roundtrip = 0;
for (const [i, c] of cases.entries()) {
  const got = tok.encode(c.text, { add_special_tokens: c.add_special }).ids;
  tokens += got.length;
  const same = got.length === c.ids.length && got.every((v, j) => v === c.ids[j]);
  if (!same) {
    bad++;
    let j = 0;
    while (j < got.length && got[j] === c.ids[j]) j++;
    console.log(`case ${i}: first difference at token ${j}: npm ${got.slice(j, j + 5)} ` +
                `python ${c.ids.slice(j, j + 5)} text ${JSON.stringify(c.text.slice(0, 60))}`);
  }
  if (!c.add_special && (got.length === 0 ? c.text === "" :
      tok.decode(got, { skip_special_tokens: false }) === c.text)) roundtrip++;
}
console.log(`npm @huggingface/tokenizers: ${cases.length - bad}/${cases.length} cases equal ` +
            `(${tokens} tokens), ${roundtrip} plain cases decode back exactly`);
process.exit(bad ? 1 : 0);
