"""Byte-level BPE: training (incremental pair counts), encoding, decoding, tokenizer.json.

Pre-tokenization is the GPT-2 split pattern
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
(Split, behavior Isolated), then every piece is mapped byte-by-byte to GPT-2's printable
"byte-level" alphabet and merged by rank. Python's `re` has no \\p{..}; \\p{L} is written
[^\\W\\d_] and \\p{N} is \\d, which agree with the Unicode classes on ASCII (the corpus is
ASCII) and on most letters and decimal digits beyond it.

Token ids: the special tokens first (0 = BOS, 1 = EOS, 2 = <｜User｜>, 3 = <｜Assistant｜>), then
the 256 byte symbols, then one id per merge in the order learned.
"""
import collections
import json
import re

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SPECIAL_TOKENS = [BOS, EOS, USER, ASSISTANT]

SPLIT_PATTERN_HF = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                    r"|\s+(?!\S)|\s+")
_SPLIT_PATTERN_PY = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|"
                               r"\s+(?!\S)|\s+")


def pretokenize(text):
    return _SPLIT_PATTERN_PY.findall(text)


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def to_symbols(piece):
    return tuple(BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))


def train_bpe(texts, vocab_size):
    """Learns vocab_size - 4 - 256 merges from the pieces of `texts`.

    Works on the multiset of distinct pieces; keeps pair -> count and pair -> set of piece
    indices, and after each merge updates only the pieces that contain the merged pair.
    Ties between equally frequent pairs go to the lexicographically smallest pair, so the
    result is deterministic.
    """
    freq = collections.Counter()
    for t in texts:
        freq.update(pretokenize(t))
    words = [list(to_symbols(p)) for p in freq]
    counts = list(freq.values())
    pair_count = collections.Counter()
    pair_where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += counts[wi]
            pair_where[(a, b)].add(wi)
    n_merges = vocab_size - len(SPECIAL_TOKENS) - 256
    merges = []
    # Lazy max-heap keyed by (-count, pair); stale entries are skipped.
    import heapq
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue
        merges.append(pair)
        a, b = pair
        new = a + b
        touched = set()
        for wi in list(pair_where[pair]):
            w = words[wi]
            c = counts[wi]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= c
                touched.add((x, y))
            out = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += c
                pair_where[(x, y)].add(wi)
                touched.add((x, y))
        del pair_count[pair]
        del pair_where[pair]
        for p in touched:
            if p in pair_count:
                if pair_count[p] <= 0:
                    del pair_count[p]
                    pair_where.pop(p, None)
                else:
                    heapq.heappush(heap, (-pair_count[p], p))
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        self.rank = {m: i for i, m in enumerate(self.merges)}
        self.vocab = {}
        for i, s in enumerate(SPECIAL_TOKENS):
            self.vocab[s] = i
        for b in range(256):
            self.vocab[BYTE_TO_CHAR[b]] = len(self.vocab)
        for a, b in self.merges:
            self.vocab[a + b] = len(self.vocab)
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self._cache = {}
        self.bos_id = self.vocab[BOS]
        self.eos_id = self.vocab[EOS]

    def __len__(self):
        return len(self.vocab)

    def _bpe(self, piece):
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        w = list(to_symbols(piece))
        while len(w) > 1:
            best = None
            for i in range(len(w) - 1):
                r = self.rank.get((w[i], w[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            w[i:i + 2] = [w[i] + w[i + 1]]
        ids = [self.vocab[s] for s in w]
        self._cache[piece] = ids
        return ids

    def encode(self, text, add_bos=False):
        """Encodes plain text (special-token strings are not recognised here)."""
        ids = [self.bos_id] if add_bos else []
        for p in pretokenize(text):
            ids.extend(self._bpe(p))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t = self.id_to_token[int(i)]
            if t in SPECIAL_TOKENS:
                out.extend(t.encode("utf-8"))
            else:
                out.extend(CHAR_TO_BYTE[c] for c in t)
        return out.decode("utf-8", errors="replace")


def tokenizer_json(tok):
    """The Hugging Face tokenizer.json document (a dict) for `tok`."""
    added = [{"id": tok.vocab[s], "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for s in SPECIAL_TOKENS]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN_HF},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False},
            ],
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [tok.bos_id], "tokens": [BOS]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": tok.vocab,
            "merges": [[a, b] for a, b in tok.merges],
        },
    }


def dumps_tokenizer_json(tok):
    return json.dumps(tokenizer_json(tok), ensure_ascii=False, indent=2) + "\n"


def load_tokenizer_json(text):
    """Reads back a tokenizer.json written by dumps_tokenizer_json."""
    doc = json.loads(text)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in doc["model"]["merges"]]
    tok = Tokenizer(merges)
    if tok.vocab != doc["model"]["vocab"]:
        raise ValueError("tokenizer.json vocab does not match its merges")
    return tok


CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


def tokenizer_config(model_max_length):
    special = {s: {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                   "single_word": False, "special": True} for s in SPECIAL_TOKENS}
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {str(i): special[s] for i, s in enumerate(SPECIAL_TOKENS)},
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": model_max_length,
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
