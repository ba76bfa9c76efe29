"""The Jupyter face: a real IPython kernel (ipykernel, driven by nbclient the
way Jupyter runs a cell) calls a remote function. The cell shows one live
status line that ends 'completed', the remote print() output, and the value."""

from __future__ import annotations

import json

NOTEBOOK = r'''
import json, nbformat
from nbclient import NotebookClient
cell = """
import delegate
@delegate.remote(time="2m")
def square(x):
    print("hello from the sandbox")
    return x * x
square(7)
"""
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(cell)]
NotebookClient(nb, timeout=300, kernel_name="python3").execute()
print("RESULT: " + json.dumps(nb.cells[0].outputs))
'''


def test_notebook_cell_shows_status_output_and_value(alice):
    outputs, _ = alice.result(NOTEBOOK, timeout=400, name="notebook")
    text = lambda o: o.get("text") or "".join(o.get("data", {}).get("text/plain", ""))  # noqa: E731
    status = [o for o in outputs if o["output_type"] == "display_data"]
    streams = [o for o in outputs if o["output_type"] == "stream"]
    results = [o for o in outputs if o["output_type"] == "execute_result"]
    assert len(status) == 1, json.dumps(outputs, indent=1)
    line = text(status[0])
    assert line.startswith("delegate:") and "completed" in line, line
    assert "\n" not in line.strip(), "one line per call"
    assert any("hello from the sandbox" in text(o) for o in streams), outputs
    assert results and text(results[0]) == "49", outputs


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
