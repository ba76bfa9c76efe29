"""Docs that hold together (issue 31): every relative link of README.md and
docs/*.md leads to a file that exists, and every #anchor to a heading of
that file (GitHub's anchor rule). Run by tests/lint.sh; no cluster needed.
The policy keys and the CLI flags are checked against the docs by the unit
tests (protocol/src/policy.rs, broker/cli/src/cli.rs)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def anchors(path: Path) -> set[str]:
    out = set()
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for line in text.splitlines():
        m = re.match(r"^#+ (.*)$", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def broken_links() -> list[str]:
    bad = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = m.group(1)
            if re.match(r"^[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = doc if not path else (doc.parent / path).resolve()
            name = doc.relative_to(REPO)
            if not target.exists():
                bad.append(f"{name}: {link}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                bad.append(f"{name}: {link}: no heading #{anchor} in {target.relative_to(REPO)}")
    return bad


if __name__ == "__main__":
    problems = broken_links()
    for p in problems:
        print(p, file=sys.stderr)
    sys.exit(1 if problems else 0)
