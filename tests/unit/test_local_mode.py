"""Local mode (``backend="local"``, ``DELEGATE_BACKEND=local``): every call
runs in a fresh local subprocess through the same payload, executor and
result files as in the sandbox. No cluster is used (run by tests/run.sh
(stage 2), the fast tier, before there is one), and no Slurm command may
run: PATH holds a fake ``sbatch`` that records any call.
Also the trimmed tracebacks of a plain interpreter and the terminal's
progress line, which behave the same with either backend."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap

import pytest

PYTHON = sys.executable

HEADER = """
import json, os, sys, time
import delegate
def out(**kw):
    print("RESULT: " + json.dumps(kw), flush=True)
"""


@pytest.fixture
def run(tmp_path):
    """Runs a script with DELEGATE_BACKEND=local and a PATH whose Slurm
    commands record that they were called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "slurm-called"
    for tool in ("sbatch", "squeue", "scancel", "sacct", "scontrol"):
        p = bin_dir / tool
        p.write_text(f"#!/bin/sh\necho {tool} >> {called}\nexit 1\n")
        p.chmod(0o755)

    def go(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        script = tmp_path / "script.py"
        script.write_text(textwrap.dedent(HEADER + code))
        e = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "DELEGATE_BACKEND": "local",
            "DELEGATE_ROOT": str(tmp_path / "no-root"),
        }
        e.update(env or {})
        r = subprocess.run(
            [PYTHON, str(script)], capture_output=True, text=True, timeout=timeout, env=e, cwd=tmp_path
        )
        assert not called.exists(), f"local mode ran Slurm: {called.read_text()}"
        return r

    return go


def result(r: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT: ")]
    assert r.returncode == 0 and lines, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT: ") :])


def test_calls_run_in_fresh_subprocesses_with_the_cluster_semantics(run):
    r = run("""
@delegate.remote(time="1m")
def where(x):
    print("out", x)
    print("err", x, file=sys.stderr)
    return os.getpid(), x * x
class Bad(Exception):
    pass
def boom():
    raise Bad("no luck")
def unpicklable():
    return (i for i in range(3))
ex = delegate.Executor()
squares = list(ex.map(lambda x: x * x, range(12)))
p1, v1 = where(3)
p2, v2 = where(4)
f = ex.submit(boom)
try:
    f.result(60)
    raised = None
except Bad as e:
    raised = [type(e).__name__, str(e), "raise Bad" in str(e.__cause__), f.outcome]
u = ex.submit(unpicklable)
try:
    u.result(60)
except delegate.RemoteError as e:
    unp = [e.kind, u.outcome]
out(squares=squares, pids=[p1, p2, os.getpid()], values=[v1, v2], raised=raised, unp=unp,
    ids=[f.job_id, u.job_id], sbatch=delegate.sbatch_count(), state=f.state)
""")
    res = result(r)
    assert res["squares"] == [x * x for x in range(12)]
    assert res["values"] == [9, 16]
    assert len(set(res["pids"])) == 3, "each call in its own fresh process"
    assert res["raised"] == ["Bad", "no luck", True, "raised Bad"]
    assert res["unp"] == ["unpicklable-result", "failed: the return value could not be sent back"]
    assert all(i.startswith("local-") for i in res["ids"])
    assert res["sbatch"] == 0 and res["state"] == "completed"
    # The output of each call is printed where the caller is, as on the cluster.
    assert "out 3\nout 4\n" in r.stdout and "err 3\nerr 4\n" in r.stderr, (r.stdout, r.stderr)
    assert "\r" not in r.stderr, "no progress line when stderr is not a terminal"


def test_time_limit_cancel_and_jobs_table(run):
    res = result(
        run("""
ex = delegate.Executor(time="2s")
slow = ex.submit(time.sleep, 30)
t0 = time.monotonic()
try:
    slow.result(60)
    timed = None
except delegate.JobTimedOut as e:
    timed = [slow.state, slow.outcome, round(time.monotonic() - t0)]
never = delegate.Executor(time="1m").submit(time.sleep, 30)
deadline = time.monotonic() + 30
while never.state != "running":
    assert time.monotonic() < deadline, never.state
    time.sleep(0.05)
cancelled = [never.cancel(), never.cancelled()]
table = delegate.jobs()
out(timed=timed, cancelled=cancelled, text=str(table), html=table._repr_html_(),
    states=[r["state"] for r in table], whats=[r["what"] for r in table])
""")
    )
    state, words, secs = res["timed"]
    assert state == "timed-out" and words.startswith("timed out: time limit of 2s") and secs < 20, res
    assert res["cancelled"] == [True, True]
    assert res["whats"] == ["sleep()", "sleep()"]
    assert res["states"][0] == "timed-out"
    assert "ID" in res["text"] and "timed out: time limit of 2s" in res["text"], res["text"]
    assert "<table" in res["html"] and "sleep()" in res["html"] and "#c62828" in res["html"], res["html"]


def test_dask_tasks_are_named_by_their_functions(run):
    """Dask's local scheduler hands the executor its own batch function;
    each call is named by the Dask task it runs (``inc()``), not by
    ``batch_execute_tasks()``."""
    res = result(
        run("""
import dask
@dask.delayed
def inc(x):
    return x + 1
@dask.delayed
def total(parts):
    return sum(parts)
with delegate.Executor(time="1m") as ex:
    (got,) = dask.compute(total([inc(i) for i in range(3)]), scheduler=ex)
out(got=got, whats=sorted(r["what"] for r in delegate.jobs()))
""")
    )
    assert res == {"got": 6, "whats": ["inc()", "inc()", "inc()", "total()"]}, res


def test_an_unknown_backend_is_refused(run):
    r = run("delegate.Executor(backend='moon')\n")
    assert r.returncode != 0 and "unknown backend 'moon'" in r.stderr, r.stderr


TRACEBACK = """
import delegate

@delegate.remote
def divide(x):
    return x / 0

def student_code():
    return divide(1)   # the caller's own line

student_code()
"""


def test_plain_interpreter_traceback_hides_delegate_frames(run):
    r = run(TRACEBACK)
    assert r.returncode == 1
    tb = r.stderr
    assert "ZeroDivisionError: division by zero" in tb, tb
    assert "return x / 0" in tb, "the remote frame, with its source line"
    assert "return divide(1)   # the caller's own line" in tb, tb
    assert "delegate/" not in tb.replace("delegate job", ""), tb
    assert "concurrent/futures" not in tb, tb
    full = run(TRACEBACK, env={"DELEGATE_TRACEBACK": "full"}).stderr
    assert "delegate/_futures.py" in full and "ZeroDivisionError" in full, full


def test_terminal_gets_one_carriage_return_line(run, tmp_path):
    """With stderr a TTY, a map of 6 shows ONE line rewritten in place with
    carriage returns, and erased at the end."""
    script = tmp_path / "tty.py"
    script.write_text(
        textwrap.dedent(
            HEADER
            + """
vals = list(delegate.Executor().map(lambda x: time.sleep(0.5 + x % 3 / 2) or x, range(6)))
out(vals=vals)
"""
        )
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin/stdout/stderr are the pty
        os.environ.update({"DELEGATE_BACKEND": "local", "DELEGATE_LOCAL_WORKERS": "2"})
        os.execv(PYTHON, [PYTHON, str(script)])
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    _, status = os.waitpid(pid, 0)
    text = data.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert 'RESULT: {"vals": [0, 1, 2, 3, 4, 5]}' in text, text
    lines = [seg for seg in text.split("\r") if seg.startswith("\x1b[Kdelegate: <lambda> × 6")]  # noqa: RUF001
    assert len(lines) >= 2, f"the line is rewritten in place: {text!r}"
    assert any("done" in ln and "running" in ln for ln in lines), lines
    assert "\n" not in "".join(lines), "never a new line per update"
    assert text.rstrip().endswith('RESULT: {"vals": [0, 1, 2, 3, 4, 5]}'), "the line was erased at the end"
