#!/usr/bin/python3
"""Builds one synthetic byte-level BPE vocabulary and writes it twice, for tiktoken_test.cc:

  OUT/tt/tiktoken.model, OUT/tt/tokenizer_config.json   Kimi K2's layout (base64 + rank lines,
                                                         258 special ids after the ranks)
  OUT/hf/tokenizer.json                                  the same vocabulary as a Hugging Face
                                                         BPE (vocab + merges), Kimi's split
                                                         pattern (read from OUT/pattern.txt),
                                                         ByteLevel, the special ids as
                                                         added_tokens

The vocabulary is trained here by plain BPE (most frequent adjacent pair first) on CORPUS. The
merges of the tokenizer.json form are derived from the ranks as tiktoken-to-tokenizer.json
converters do: a token's merge is the two parts that tiktoken's rank rule, run on the token's
own bytes with only lower ranks allowed, leaves. Usage: tiktoken_vocab.py OUT
"""
import base64
import collections
import json
import os
import re
import sys

CORPUS = """
The quick brown fox jumps over the lazy dog. The dog doesn't care; the fox isn't quick.
I'm sure they're here, we've seen it, you'll see, he'd know. THE END. Don't SHOUT!
def encode(self, text):
    return [self.ranks[b] for b in text.split()]  # 1234567890
    if x == 42 and y != 3.14159:
        print("hello, world\\n")
中文分词和汉字的处理在北京和上海都很常见。你好，世界！我们今天学习中文。
日本語のテキストとカタカナ、ひらがな。한국어 텍스트도 있습니다.
Ελληνικά κείμενα και Русский текст тоже здесь. Café naïve résumé.
Emoji: 😀😀 👍🏽 🇺🇸 ❤️ and numbers 2024-12-31, 3,000,000 and 0.001%.
Tabs\tand    spaces   and
newlines

and CRLF\r\nlines\r\n end.
""" * 3

NUM_MERGES = 700
SPECIAL_OFFSETS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>",
                   4: "<|im_assistant|>", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
                   12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
                   14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
                   17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}
NUM_SPECIAL = 258


def bytes_to_unicode():
    """GPT-2's byte alphabet: printable Latin-1 bytes as themselves, the rest from U+0100."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def train(corpus):
    """Plain BPE over pre-split words; returns the tokens (bytes) in rank order."""
    words = collections.Counter(re.findall(r" ?\w+| ?[^\w\s]+|\s+", corpus))
    # Single bytes first, in a permuted order (ranks are read from the file, not the byte value).
    tokens = [bytes([(b * 167 + 13) % 256]) for b in range(256)]
    split = {w: [bytes([c]) for c in w.encode()] for w in words}
    for _ in range(NUM_MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            s = split[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        tokens.append(merged)
        for w in words:
            s, out, i = split[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            split[w] = out
    return tokens


def rank_parts(ranks, token, max_rank):
    """tiktoken's rule on `token`'s bytes, merging only concatenations ranked below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best, best_rank = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best is None:
            return parts
        parts[best:best + 2] = [parts[best] + parts[best + 1]]


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "pattern.txt"), encoding="utf-8") as f:
        pattern = f.read()
    tokens = train(CORPUS)
    ranks = {t: r for r, t in enumerate(tokens)}
    assert len(ranks) == len(tokens)
    n = len(tokens)
    specials = {n + k: SPECIAL_OFFSETS.get(k, f"<|reserved_token_{n + k}|>") for k in range(NUM_SPECIAL)}

    os.makedirs(os.path.join(out, "tt"), exist_ok=True)
    os.makedirs(os.path.join(out, "hf"), exist_ok=True)
    lines = [f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)]
    lines = lines[1::2] + lines[0::2]  # not in rank order: the rank column decides
    with open(os.path.join(out, "tt", "tiktoken.model"), "w") as f:
        f.writelines(lines)
    decoder = {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True}
               for i, c in specials.items() if not c.startswith("<|reserved_token_")}
    with open(os.path.join(out, "tt", "tokenizer_config.json"), "w") as f:
        json.dump({"added_tokens_decoder": decoder, "bos_token": "[BOS]", "eos_token": "[EOS]",
                   "tokenizer_class": "TikTokenTokenizer"}, f, indent=1)

    b2u = bytes_to_unicode()
    def text(t):
        return "".join(b2u[b] for b in t)
    merges = []
    for r, t in enumerate(tokens):
        if len(t) == 1:
            continue
        parts = rank_parts(ranks, t, r)
        assert len(parts) == 2, (t, parts)
        merges.append([text(parts[0]), text(parts[1])])
    tj = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, c in specials.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {text(t): r for r, t in enumerate(tokens)}, "merges": merges},
    }
    with open(os.path.join(out, "hf", "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(out, "hf", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "[BOS]", "eos_token": "[EOS]"}, f)


if __name__ == "__main__":
    main()
