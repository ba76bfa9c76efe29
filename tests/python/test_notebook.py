"""The Jupyter face: a real IPython kernel (ipykernel, driven by nbclient the
way Jupyter runs a cell). A single call keeps one live line that ends
``done``; a map of 12 gets ONE aggregated line (one display, updated in
place) with its final counts; a call that raised says ``raised
ZeroDivisionError`` and its traceback shows the remote frame and the
caller's line without delegate's internals; ``delegate.jobs()`` is an HTML
table. The same notebook runs on the cluster and in local mode.

The executed notebooks are written beside the test's scripts
(``executed-*.ipynb``), so a person (or a browser test) can render them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

NOTEBOOK = r'''
import json, os, sys, nbformat
from nbclient import NotebookClient
cells = [
"""
import delegate
@delegate.remote(time="2m")
def square(x):
    print("hello from the sandbox")
    return x * x
square(7)
""",
"""
squares = delegate.Executor(time="2m").map(lambda x: x * x, range(12))
sum(squares)
""",
"""
@delegate.remote(time="2m")
def divide(x):
    return x / 0

def student_code():
    return divide(1)   # the caller's own line

student_code()
""",
"""
delegate.jobs(3)
""",
]
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
if len(sys.argv) > 1:
    nbformat.write(nb, os.path.join(sys.argv[1], "executed-%s.ipynb" % os.environ.get("DELEGATE_BACKEND", "cluster")))
print("RESULT: " + json.dumps([c.outputs for c in nb.cells]))
'''


def text(o) -> str:
    return o.get("text") or "".join(o.get("data", {}).get("text/plain", ""))


def check(cells):
    single, mapped, raised, table = cells
    dump = lambda o: json.dumps(o, indent=1)  # noqa: E731

    status = [o for o in single if o["output_type"] == "display_data"]
    assert len(status) == 1, dump(single)
    line = text(status[0])
    assert line.startswith("delegate: square [") and "— done ·" in line, line
    assert "\n" not in line.strip(), "one line per call"
    assert any("hello from the sandbox" in text(o) for o in single if o["output_type"] == "stream"), dump(
        single
    )
    assert [text(o) for o in single if o["output_type"] == "execute_result"] == ["49"], dump(single)

    status = [o for o in mapped if o["output_type"] == "display_data"]
    assert len(status) == 1, "ONE line for a map of 12, not 12: " + dump(mapped)
    line = text(status[0])
    assert line.startswith("delegate: <lambda> × 12 — 12/12 done ·"), line  # noqa: RUF001
    assert "running" not in line and "pending" not in line and "ETA" not in line, line
    assert "<pre" in status[0]["data"]["text/html"], "the line was updated in place (its final state)"
    assert [text(o) for o in mapped if o["output_type"] == "execute_result"] == [
        str(sum(x * x for x in range(12)))
    ]

    status = [o for o in raised if o["output_type"] == "display_data"]
    assert len(status) == 1 and "— raised ZeroDivisionError ·" in text(status[0]), dump(raised)
    assert "completed" not in text(status[0])
    (err,) = [o for o in raised if o["output_type"] == "error"]
    assert err["ename"] == "ZeroDivisionError", dump(err)
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err["traceback"]))
    assert "return x / 0" in tb, "the remote frame: " + tb
    assert "student_code()" in tb and "return divide(1)" in tb, "the caller's own lines: " + tb
    assert "_futures.py" not in tb and "concurrent/futures" not in tb and "__get_result" not in tb, tb
    assert "_traceback.py" not in tb and "raise_remote" not in tb, "a delegate frame is shown: " + tb
    assert "skipping hidden" in tb, tb
    last = tb.rsplit("in divide", 1)
    assert len(last) == 2 and "return x / 0" in last[1], "the last frame is the remote line: " + tb

    (res,) = [o for o in table if o["output_type"] == "execute_result"]
    html = res["data"]["text/html"]
    assert html.startswith("<table class='delegate-jobs'>"), html
    for col in ("function or command", "state", "node", "elapsed", "submitted"):
        assert col in html, (col, html)
    assert "divide()" in html and "raised ZeroDivisionError" in html and "#c62828" in html, html
    assert "&lt;lambda&gt;()" in html, html


def test_notebook_on_the_cluster(alice):
    cells, _ = alice.result(NOTEBOOK, timeout=600, name="notebook")
    check(cells)


def test_notebook_in_local_mode(tmp_path):
    """The same notebook with DELEGATE_BACKEND=local: no cluster involved."""
    script = tmp_path / "nb.py"
    script.write_text(textwrap.dedent(NOTEBOOK))
    env = dict(os.environ, DELEGATE_BACKEND="local", DELEGATE_ROOT=str(tmp_path / "unused"))
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600, env=env
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT: ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    check(json.loads(lines[-1][len("RESULT: ") :]))
    assert (tmp_path / "executed-local.ipynb").is_file()


def test_plain_script_prints_nothing_but_the_jobs_output(alice):
    res, proc = alice.result("""
import delegate, json
@delegate.remote(time="2m")
def f():
    print("only this")
    return 1
v = f()
print("RESULT: " + json.dumps(v))
""")
    assert res == 1
    assert proc.stdout.splitlines() == ["only this", "RESULT: 1"], proc.stdout
    assert proc.stderr == "", proc.stderr


FOLLOW = r'''
import json, sys, nbformat
from nbclient import NotebookClient
cell = """
import delegate, sys, time

def talk():
    for i in range(3):
        print("line", i, flush=True)
        time.sleep(1)
    print("to stderr", file=sys.stderr, flush=True)
    return "done"

fut = delegate.remote(time="2m")(talk).submit()
delegate.logs(fut, follow=True)
print("followed until", fut.result(timeout=120))
"""
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(cell)]
NotebookClient(nb, timeout=300, kernel_name="python3").execute()
print("RESULT: " + json.dumps(nb.cells[0].outputs))
'''


def test_a_jobs_output_is_followed_in_a_notebook(alice):
    """Issue 44, item 2: `delegate.logs(job, follow=True)` (the client's
    follow_output, as `delegate logs --follow`) shows a running call's
    output in the cell as it is written, stdout and stderr apart, and
    returns when the call is over."""
    outputs, _ = alice.result(FOLLOW, timeout=300, name="follow")
    streams = [(o["name"], o["text"]) for o in outputs if o["output_type"] == "stream"]
    out = "".join(t for n, t in streams if n == "stdout")
    err = "".join(t for n, t in streams if n == "stderr")
    assert (
        out.index("line 0") < out.index("line 1") < out.index("line 2") < out.index("followed until done")
    ), out
    assert "to stderr" in err, streams
