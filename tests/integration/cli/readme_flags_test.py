#!/usr/bin/python3
"""README.md documents every flag of every xdeepserve subcommand.

Discovery: runs `xdeepserve --help`, takes every name listed under its "Subcommands:" heading,
runs `xdeepserve <sub> --help` (and recurses the same way into sub-subcommands), and collects
every long flag the help lists as an option: a line that starts with exactly two spaces and a
dash (CLI11's option column; wrapped descriptions are indented further), each `--name` on it
before the description. `--help` itself is left out. New subcommands are picked up without
touching this test.

The rule (simple on purpose): README.md must have a heading (any level) whose text contains
`xdeepserve <sub>` in backquotes, e.g. "### `xdeepserve generate`"; the section runs until
the next heading of the same or a higher level. A flag counts as present if `--name` appears
in that section as a whole word (not as the prefix of a longer flag). The test fails naming
every subcommand without a section and every subcommand/flag pair its section lacks.

Usage: readme_flags_test.py --xdeepserve PATH [--readme PATH]
"""
import argparse
import os
import re
import subprocess
import sys

OPTION_LINE = re.compile(r"^  -")  # exactly two spaces, then the option's names
LONG_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9-]*")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


def run_help(binary, path):
    cmd = [binary] + path + ["--help"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    text = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise SystemExit(f"FAIL: '{' '.join(cmd)}' exited with {proc.returncode}:\n{text}")
    return text


def subcommands_of(help_text):
    """Names listed under a 'Subcommands:' heading (first word of each indented line)."""
    names, inside = [], False
    for line in help_text.splitlines():
        if re.match(r"^\S.*:\s*$", line):  # a section heading such as "Options:"
            inside = line.strip().rstrip(":").lower() == "subcommands"
            continue
        if inside:
            m = re.match(r"^  (\S+)", line)
            if m and not m.group(1).startswith("-"):
                names.append(m.group(1))
    return names


def flags_of(help_text):
    """Long flags in the option column of a help text, in order, without --help."""
    flags = []
    for line in help_text.splitlines():
        if not OPTION_LINE.match(line):
            continue
        names = re.split(r"\s", line.strip(), maxsplit=1)[0]  # e.g. "-h,--help" or "--model"
        for flag in LONG_FLAG.findall(names):
            if flag != "--help" and flag not in flags:
                flags.append(flag)
    return flags


def discover(binary):
    """{('generate',): ['--model', ...], ...} for every subcommand, recursively."""
    out, todo = {}, [[name] for name in subcommands_of(run_help(binary, []))]
    while todo:
        path = todo.pop(0)
        text = run_help(binary, path)
        out[tuple(path)] = flags_of(text)
        todo.extend(path + [name] for name in subcommands_of(text))
    return out


def sections(readme_text):
    """{'xdeepserve generate': section text} for headings that name `xdeepserve ...`."""
    lines = readme_text.splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = HEADING.match(line)
        if not m:
            continue
        named = re.findall(r"`(xdeepserve(?: [a-z0-9][a-z0-9-]*)+)`", m.group(2))
        if not named:
            continue
        level, body = len(m.group(1)), []
        for nxt in lines[i + 1:]:
            h = HEADING.match(nxt)
            if h and len(h.group(1)) <= level:
                break
            body.append(nxt)
        for name in named:
            found[name] = found.get(name, "") + "\n".join(body) + "\n"
    return found


def mentions(section, flag):
    return re.search(re.escape(flag) + r"(?![A-Za-z0-9-])", section) is not None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--readme", default=os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                      "README.md"))
    args = ap.parse_args()
    with open(args.readme, encoding="utf-8") as f:
        docs = sections(f.read())
    commands = discover(args.xdeepserve)
    if not commands:
        print("FAIL: 'xdeepserve --help' lists no subcommands")
        return 1
    problems, checked = [], 0
    for path, flags in sorted(commands.items()):
        name = "xdeepserve " + " ".join(path)
        if name not in docs:
            problems.append(f"{name}: no README section (a heading containing `{name}`)")
            continue
        for flag in flags:
            checked += 1
            if not mentions(docs[name], flag):
                problems.append(f"{name}: {flag} is not in its README section")
    if problems:
        print(f"FAIL: README.md misses {len(problems)} item(s):")
        for p in problems:
            print("  " + p)
        return 1
    print(f"ok: {len(commands)} subcommands, {checked} flags, all in README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
