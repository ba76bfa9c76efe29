"""A student in JupyterHub while the rush runs (issue 53: "tried as
students in the hub during a rush"), driven by bench/rush.sh --hub.

    rush_in_hub.py USER OUTDIR [INSTRUCTOR]

As USER (a rush account: its initial password from the stack's secrets,
root only), in chromium through Playwright: log in, open a notebook, run
the README's CFiddle example unchanged (a `run()` of an `arg_map`: one map
of four calls), watching the cell's live line while it waits in the
rush's queue, then show the results table. Every line the cell showed
goes to OUTDIR/hub-student.json, each new kind of line a screenshot in
OUTDIR. With INSTRUCTOR (an account of the roster's instructor role), the
instructor's rush page (/services/rush/) is shot as the student's cell
starts and once it has its results; its text goes to the same record. The stack is bench/rush.sh's (DELEGATE_STACK_NAME, _DIR and
DELEGATE_JUPYTER_PORT from its environment). Prints what the page showed;
asserts nothing on time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "cluster"))

from browser import URL, HubSession, browser_for  # noqa: E402

from stacklib import initial_password, readme_block  # noqa: E402


def rush_page(browser, instructor: str, out: Path):
    """The instructor's session on the rush page; None without one."""
    if not instructor:
        return None
    prof = HubSession(browser, instructor, initial_password(instructor), out)
    prof.login(lab=False)
    prof.page.goto(f"{URL}/services/rush/")
    return prof


def shot_of_page(prof, what: str) -> str:
    """The rush page's text once its plots are drawn (two samples), shot."""
    if prof is None:
        return ""
    deadline = time.monotonic() + 60
    while prof.page.locator("#p-queue polyline").count() < 2 and time.monotonic() < deadline:
        time.sleep(1)
    prof.shot(what)
    return prof.page.inner_text("body")


def main(user: str, outdir: str, instructor: str = "") -> None:
    out = Path(outdir)
    t0 = time.time()
    with browser_for(out) as browser:
        prof = rush_page(browser, instructor, out)
        s = HubSession(browser, user, initial_password(user), out)
        s.login()
        s.new_notebook()
        page_before = shot_of_page(prof, "rush-page-as-the-cell-starts")
        states, _ = s.watch_cell(
            readme_block("### CFiddle experiments"),
            "delegate:",
            "['",  # (the block ends with the ids of the jobs that ran it)
            "cfiddle-in-the-rush",
            timeout=1_800_000,
        )
        table = s.run_cell("print(results.as_df().to_string())", "PERF_COUNT_SW_TASK_CLOCK", "cfiddle-table")
        page_after = shot_of_page(prof, "rush-page-after-the-results")
    record = {
        "user": user,
        "started": t0,
        "ended": time.time(),
        "lines": states,
        "table": table,
        "rush_page": [page_before, page_after],
    }
    (out / "hub-student.json").write_text(json.dumps(record, indent=1))
    print(f"rush: {user} in the hub, the CFiddle cell's lines while it ran ({time.time() - t0:.0f} s):")
    for line in states:
        print(f"  {line}")
    print(f"rush: {user}'s results table:\n{table}")
    for text in record["rush_page"]:
        if text:
            print(f"rush: the instructor's page said:\n{text[:1500]}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
