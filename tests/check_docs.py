"""Docs that hold together (issue 31): every relative link of README.md and
docs/*.md leads to a file that exists, and every #anchor to a heading of
that file (GitHub's anchor rule); the test stages agree (issue 44); the
crate table names every crate and what each links (issue 57). Run by
tests/lint.sh; no cluster needed.
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


SETTING = re.compile(r"\$\{?(DELEGATE_[A-Z0-9_]*[A-Z0-9])")
NAME = re.compile(r"\bDELEGATE_[A-Z0-9_]*[A-Z0-9]\b")
CODE = (
    "*.sh",
    "*.rs",
    "*.py",
    "*.pyi",
    "*.conf",
    "*.yml",
    "*.in",
    "*.j2",
    "*.toml",
    "*Dockerfile",
    "build_cluster.sh",
)


def settings_problems() -> list[str]:
    """Every DELEGATE_* setting build_cluster.sh reads is in
    docs/configuration.md (its settings table is deploy/src/schema.rs's,
    checked by a unit test); every DELEGATE_* name the docs mention exists
    in the code."""
    parts = [REPO / "build_cluster.sh", *sorted((REPO / "build_cluster.d").glob("*.sh"))]
    settings = {n for p in parts for n in SETTING.findall(p.read_text())}
    documented = (REPO / "docs" / "configuration.md").read_text()
    bad = [f"build_cluster.sh reads {n}, which docs/configuration.md does not document"
           for n in sorted(settings) if n not in documented]  # fmt: skip
    code = ""
    for pattern in CODE:
        for f in REPO.rglob(pattern):
            if not {"target", ".git", "node_modules", ".pytest_cache"} & set(f.parts) and f.is_file():
                code += f.read_text(errors="replace")
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for doc in docs:
        for n in sorted(set(NAME.findall(doc.read_text()))):
            if n not in code:
                bad.append(f"{doc.relative_to(REPO)} names {n}, which nothing in the code reads")
    return bad


def stage_problems() -> list[str]:
    """The stages of tests/run.sh (its header's "#   N. pytest -v tests/DIR"
    lines), tests/README.md's numbered list and every suite's "Run by
    tests/run.sh (stage N)" agree (issue 44: they had drifted)."""
    header = (REPO / "tests/run.sh").read_text().split("\nset -", 1)[0]
    run = {}
    for n, rest in re.findall(r"^#\s+(\d+[a-z]?)\. (.*)$", header, re.M):
        m = re.search(r"pytest -v tests/(\w+)", rest)
        if m:
            run[m.group(1)] = n
    readme = (REPO / "tests/README.md").read_text()
    problems = []
    for suite, n in run.items():
        if not re.search(rf"^{n}\. `{suite}/`", readme, re.M):
            problems.append(f"tests/README.md: stage {n} is not `{suite}/` as in tests/run.sh")
    for path in sorted((REPO / "tests").glob("*/*.py")):
        for said in re.findall(r"Run by tests/run\.sh \(stage (\d+[a-z]?)\)", path.read_text()):
            suite = path.parent.name
            if run.get(suite) != said:
                problems.append(
                    f"{path.relative_to(REPO)}: says stage {said}, tests/run.sh runs {suite}/ as {run.get(suite)}"
                )
    if len(run) < 4:
        problems.append(f"tests/run.sh's header names too few suites: {run}")
    return problems


def life_of_a_call_problems() -> list[str]:
    """Each row of docs/architecture.md's "The life of a call" names a file
    and a function defined in it (def, fn, function, or a shell NAME())."""
    text = (REPO / "docs/architecture.md").read_text()
    section = text.split("## The life of a call", 1)[-1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|[^|]+\| `([^`]+)` \| `([^`]+)` \|$", section, re.M)
    problems = [] if len(rows) >= 10 else [f"docs/architecture.md: the life of a call has {len(rows)} steps"]
    for file, name in rows:
        path = REPO / file
        if not path.is_file():
            problems.append(f"docs/architecture.md, the life of a call: {file} does not exist")
            continue
        defined = rf"(\bdef {name}\(|\bfn {name}\b|\bfunction {name}\b|^{name}\(\) *\{{)"
        if not re.search(defined, path.read_text(), re.M):
            problems.append(f"docs/architecture.md, the life of a call: {file} defines no {name}")
    return problems


def docs_listing_problems() -> list[str]:
    """README's "Documentation" list names every document in docs/, and
    only those (issue 44: it named 7 of 12)."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Documentation", 1)[-1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^- \[docs/([\w.-]+\.md)\]", section, re.M))
    present = {p.name for p in (REPO / "docs").glob("*.md")}
    return [f"README.md's Documentation list lacks docs/{n}" for n in sorted(present - listed)] + [
        f"README.md's Documentation list names docs/{n}, which does not exist"
        for n in sorted(listed - present)
    ]


def crate_table_problems() -> list[str]:
    """docs/crate-choices.md's table has a row for every crate of the
    workspace, and its "links" cell names every crate that crate depends on
    (issue 57: it omitted three crates and some of the others' links); the
    workspace's own crates are "the protocol" and "the client"."""
    import tomllib

    own = {"delegate-protocol": "the protocol", "delegate-client": "the client"}
    text = (REPO / "docs/crate-choices.md").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| `([\w-]+)`[^|]*\| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    members = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["members"]
    problems = []
    for member in members:
        cargo = tomllib.loads((REPO / member / "Cargo.toml").read_text())
        name = cargo["package"]["name"]
        if name not in rows:
            problems.append(f"docs/crate-choices.md's table has no row for {name} ({member}/)")
            continue
        for dep in cargo.get("dependencies", {}):
            said = own.get(dep, dep)
            if not re.search(rf"(?<![\w-]){re.escape(said)}(?![\w-])", rows[name]):
                problems.append(
                    f"docs/crate-choices.md: {name}'s row does not name {own.get(dep, dep)}, which it links"
                )
    return problems


if __name__ == "__main__":
    problems = broken_links() + settings_problems() + stage_problems() + life_of_a_call_problems()
    problems += docs_listing_problems() + crate_table_problems()
    for p in problems:
        print(p, file=sys.stderr)
    sys.exit(1 if problems else 0)
