"""The KJV corpus: text from Debian's bible-kjv-text, split into train and held-out chapters.

The data file (/usr/lib/bible.data) is compressed; the `bible` program of Debian's bible-kjv
package (which depends on bible-kjv-text) prints it. Each chapter becomes

    Genesis 1
    1 In the beginning God created the heaven and the earth.
    2 And the earth was without form, ...

(heading line, then one line per verse "N text"), ending with a newline. Chapters are numbered
0..1188 in canonical order (Genesis 1 = 0); chapter k is held out iff k % HELDOUT_EVERY ==
HELDOUT_EVERY - 1. The held-out file is the held-out chapters joined by one blank line.
"""
import re
import subprocess

HELDOUT_EVERY = 20
BIBLE_RANGE = "Genesis1:1-Revelation22:21"


def read_bible_dump():
    out = subprocess.run(["bible", "-l100000", BIBLE_RANGE], check=True,
                         capture_output=True, text=True).stdout
    return out


def parse_chapters(dump):
    """Returns a list of chapter strings in canonical order."""
    chapters = []
    heading = None
    verses = []
    for line in dump.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            assert heading is not None
            verses.append(f"{m.group(1)} {m.group(2).strip()}")
            continue
        if heading is not None:
            chapters.append(heading + "\n" + "\n".join(verses) + "\n")
        heading = line.strip()
        verses = []
    if heading is not None:
        chapters.append(heading + "\n" + "\n".join(verses) + "\n")
    return chapters


def is_heldout(index):
    return index % HELDOUT_EVERY == HELDOUT_EVERY - 1


def split_chapters(chapters):
    train = [c for i, c in enumerate(chapters) if not is_heldout(i)]
    held = [c for i, c in enumerate(chapters) if is_heldout(i)]
    return train, held


def heldout_text(held):
    return "\n".join(held)


def train_text(train):
    """The training chapters joined by one blank line (the calibration text of quantize)."""
    return "\n".join(train)


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--write-train":
        # The training chapters only (never the held-out ones), e.g. as quantize's
        # calibration text.
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            f.write(train_text(split_chapters(parse_chapters(read_bible_dump()))[0]))
        sys.exit(0)
    chs = parse_chapters(read_bible_dump())
    tr, he = split_chapters(chs)
    print(len(chs), "chapters;", len(tr), "train;", len(he), "held out;",
          sum(map(len, tr)), "train chars;", len(heldout_text(he)), "held-out chars")
    print(chs[0][:200])
    print([c.split("\n")[0] for c in he][:10])
