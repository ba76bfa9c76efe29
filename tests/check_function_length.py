"""No long functions in the product (issue 31): every function of the Rust
crates, the shell scripts and the Python package is at most LIMIT lines,
comments included, unless its first lines say it is a flat table
("flat table" in a comment within its first three lines). A shell
script's top-level blocks (an `if`, `case`, `for`, `while` or `until` at
the start of a line, outside any function: code that runs as the script
is read) are held to the same limit (issue 44). Tests and the benchmarks
(tests/, bench/, a crate's tests/) are not held to it. Run by
tests/lint.sh; no cluster needed. Prints the longest functions it saw."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 100
SKIP = re.compile(r"(^|/)(tests|bench|target)/")
RUST_FN = re.compile(
    r'^\s*(pub(\([a-z]+\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)'
)
SH_FN = re.compile(r"^\s*(function\s+)?([A-Za-z_]\w*)\s*\(\)\s*\{?\s*(#.*)?$")
PY_FN = re.compile(r"^(\s*)(async\s+)?def\s+(\w+)")
SH_BLOCK = re.compile(r"^(if|case|for|while|until)\b")
SH_CLOSE = {"if": "fi", "case": "esac", "for": "done", "while": "done", "until": "done"}
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


def braced_length(lines: list[str], start: int, rust: bool) -> int:
    """Lines from `start` to the brace closing the body (0: a declaration)."""
    depth, opened = 0, False
    for j in range(start, len(lines)):
        s = re.sub(r'"([^"\\]|\\.)*"', "", lines[j])
        s = re.sub(r"'(\\.|[^'\\])'", "", s) if rust else s
        s = re.sub(r"//.*", "", s) if rust else re.sub(r"(^|\s)#.*", "", s)
        depth += s.count("{") - s.count("}")
        opened = opened or "{" in s
        if opened and depth <= 0:
            return j - start + 1
        if not opened and s.rstrip().endswith(";"):
            return 0
    return 0


def indented_length(lines: list[str], start: int) -> int:
    indent = len(lines[start]) - len(lines[start].lstrip())
    j = start + 1
    while j < len(lines):
        s = lines[j]
        if s.strip() and len(s) - len(s.lstrip()) <= indent and not s.lstrip().startswith(")"):
            break
        j += 1
    while j > start + 1 and not lines[j - 1].strip():
        j -= 1
    return j - start


def top_level_blocks(lines: list[str]):
    """(keyword, first line index, length) of each top-level shell block
    (heredoc bodies skipped; a block closed on its own line counts 1)."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := HEREDOC.search(line):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == m.group(1)), len(lines))
            if not SH_BLOCK.match(line):
                i = end + 1
                continue
        m = SH_BLOCK.match(line)
        if not m:
            i += 1
            continue
        close = SH_CLOSE[m.group(1)]
        if re.search(rf"(;|\s){close}\b", line):
            i += 1
            continue
        j = next((j for j in range(i + 1, len(lines)) if re.match(rf"{close}\b", lines[j])), len(lines) - 1)
        yield m.group(1), i, j - i + 1
        i = j + 1


def functions(path: Path):
    """(name, first line, length) of each function of one file, and of each
    top-level block of a shell script."""
    lines = path.read_text(errors="replace").split("\n")
    kind = path.suffix
    for i, line in enumerate(lines):
        if kind == ".rs" and (m := RUST_FN.match(line)):
            yield m.group(7), i + 1, braced_length(lines, i, True), lines[i : i + 4]
        elif kind == ".sh" and (m := SH_FN.match(line)):
            yield m.group(2), i + 1, braced_length(lines, i, False), lines[i : i + 4]
        elif kind == ".py" and (m := PY_FN.match(line)):
            yield m.group(3), i + 1, indented_length(lines, i), lines[i : i + 4]
    if kind == ".sh":
        for word, i, length in top_level_blocks(lines):
            yield f"top-level {word} block", i + 1, length, lines[i : i + 4]


def main() -> int:
    out = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "*.rs",
            "*.sh",
            "*.py",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    seen, bad = [], []
    for rel in out:
        if SKIP.search(rel) or not (REPO / rel).is_file():
            continue
        for name, line, length, head in functions(REPO / rel):
            seen.append((length, f"{rel}:{line} {name}"))
            if length > LIMIT and not any("flat table" in h for h in head):
                bad.append(f"{rel}:{line}: {name} is {length} lines (the limit is {LIMIT}; split it)")
    seen.sort(reverse=True)
    print("longest functions:", "; ".join(f"{w} ({n})" for n, w in seen[:3]))
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
