"""CFiddle experiments through delegate (issue 14), against the real local
cluster: a student builds a small C function with CFiddle at two
optimization levels on the caller's side, runs it locally and through
``delegate.cfiddle`` (a sandbox on an exclusive node, real Slurm and
Docker), and gets the same table; CFiddle's errors come back as CFiddle
raises them locally; the size bound and a version mismatch are named.

Each test runs a script as a test student with the test venv's Python (it
has CFiddle at python/requirements-cfiddle.txt's pins, as the sandbox image
does). About 1-2 minutes in all on the 2-core machine.
"""

from __future__ import annotations

import re
import threading

import pytest
from conftest import REPO, Student

import testlib

# A CFiddle experiment as CFiddle's documentation writes them: measured
# between start_measurement() and end_measurement(), `extern "C"` on its own
# line (CFiddle's prototype parser wants it so).
HEADER = r'''
import json, os, shutil, sys, tempfile
# Where an activated venv or a notebook kernel finds cfiddle-run (local runs).
os.environ["PATH"] = os.path.dirname(sys.executable) + ":" + os.environ["PATH"]
os.chdir(tempfile.mkdtemp(prefix="cfiddle-test-", dir=os.path.expanduser("~")))
import delegate, delegate.cfiddle
from delegate import _core
from cfiddle import *
from cfiddle.Exceptions import CFiddleException
from cfiddle.Runner import RunnerDelegateException

def out(**kw):
    print("RESULT: " + json.dumps(kw, default=str), flush=True)

SRC = code(r"""
#include <cfiddle.hpp>
extern "C"
long loop(long count, int k) {
    long s = 0;
    start_measurement();
    for (long i = 0; i < count; i++) s += i * k;
    end_measurement();
    return s;
}
extern "C"
int crash(int x) {
    if (x) { volatile int *p = 0; *p = 1; }
    return 0;
}
""")
exes = build(SRC, arg_map(OPTIMIZE=["-O0", "-O3"]))

def staged(job_id):
    """The files under cfiddle/ of a job directory (what reached the sandbox)."""
    root = os.path.join(_core.job_dir(job_id), "cfiddle")
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
'''

COUNTERS = ["PERF_COUNT_SW_TASK_CLOCK", "PERF_COUNT_SW_PAGE_FAULTS"]


def pinned_cfiddle() -> str:
    text = (REPO / "python" / "requirements-cfiddle.txt").read_text()
    m = re.search(r"^cfiddle==(\S+)", text, re.M)
    assert m, "python/requirements-cfiddle.txt pins cfiddle"
    return m.group(1)


def test_delegated_run_gives_the_local_table(alice):
    res, _ = alice.result(
        HEADER
        + """
kw = dict(arguments=arg_map(count=[1000, 200000], k=[1, 3]),
          perf_counters=["PERF_COUNT_SW_TASK_CLOCK", "PERF_COUNT_SW_PAGE_FAULTS"])
local = run(exes, "loop", **kw)
delegate.cfiddle.enable(time="5m")
n0 = delegate.sbatch_count()
remote = run(exes, "loop", **kw)
one = dict(sbatch=delegate.sbatch_count() - n0, jobs=delegate.cfiddle.last_job_ids())
one["files"] = staged(one["jobs"][0])
delegate.cfiddle.enable(time="5m", invocations_per_job=3)
n0 = delegate.sbatch_count()
split = run(exes, "loop", **kw)
two = dict(sbatch=delegate.sbatch_count() - n0, jobs=delegate.cfiddle.last_job_ids())
local.as_csv("local.csv"); remote.as_csv("remote.csv")
key = ["OPTIMIZE", "function", "count", "k"]
def table(r):
    df = r.as_df()
    return dict(cols=list(df.columns), dtypes=[str(t) for t in df.dtypes], keys=df[key].values.tolist(),
                ret=[x.return_value for x in r], tc=df["PERF_COUNT_SW_TASK_CLOCK"].tolist(),
                pf=df["PERF_COUNT_SW_PAGE_FAULTS"].tolist(), et=df["ET"].tolist(),
                libs=[x.invocation.executable.lib for x in r],
                exe_types=[type(x.invocation.executable).__name__ for x in r])
out(local=table(local), remote=table(remote), split=table(split), one=one, two=two,
    libs=sorted(os.path.basename(e.lib) for e in exes), exe_libs=[e.lib for e in exes],
    csv=[open(f).readline() for f in ("local.csv", "remote.csv")],
    types=[type(local).__name__, type(remote).__name__, type(remote[0]).__name__])
shutil.rmtree(os.getcwd(), ignore_errors=True)
""",
        timeout=600,
    )
    local, remote, split = res["local"], res["remote"], res["split"]
    assert local["cols"] == ["OPTIMIZE", "function", "count", "k", "ET", *COUNTERS]
    for other in (remote, split):
        assert other["cols"] == local["cols"]
        assert other["dtypes"] == local["dtypes"]
        assert other["keys"] == local["keys"], "the same rows in the same order"
        assert other["ret"] == local["ret"], "the functions' return values"
        assert other["libs"] == local["libs"], (
            "results name the caller's executables, not the sandbox's copies"
        )
        assert other["exe_types"] == local["exe_types"]
    assert res["csv"][0] == res["csv"][1], "as_csv() writes the same header"
    assert res["types"] == ["InvocationResultsList", "InvocationResultsList", "InvocationResult"]
    assert set(local["libs"]) == set(res["exe_libs"])
    # Plausible values: a task clock in ns, more for 200x the iterations;
    # page faults counted (a non-negative integer); elapsed time positive.
    for t in (local, remote, split):
        assert all(isinstance(v, int) and v > 0 for v in t["tc"]), t["tc"]
        assert all(isinstance(v, int) and v >= 0 for v in t["pf"]), t["pf"]
        assert all(v > 0 for v in t["et"])
        by = {tuple(k): tc for k, tc in zip(t["keys"], t["tc"])}
        for opt in ("-O0", "-O3"):
            for k in (1, 3):
                assert by[(opt, "loop", 200000, k)] > by[(opt, "loop", 1000, k)], by
    # One run: one job, one sbatch; only the two executables crossed over.
    one = res["one"]
    assert one["sbatch"] == 1 and len(one["jobs"]) == 1
    sos = sorted(f.split("/", 1)[1] for f in one["files"] if f.endswith(".so"))
    assert sos == res["libs"], one["files"]
    assert not [f for f in one["files"] if f.endswith((".o", ".s", ".ii", ".d", ".cpp"))], one["files"]
    assert {"run/runner.pickle", "run/results.pickle"} <= set(one["files"])
    # Split into jobs of 3 invocations: 3 jobs, still one sbatch.
    assert res["two"]["sbatch"] == 1 and len(res["two"]["jobs"]) == 3


def test_errors_come_back_as_cfiddle_raises_them(alice):
    res, _ = alice.result(
        HEADER
        + """
cases = {
    "missing": dict(function="loop", arguments=arg_map(count=[1])),
    "type": dict(function="loop", arguments=arg_map(count=["many"], k=[1])),
    "counter": dict(function="loop", arguments=arg_map(count=[1], k=[1]), perf_counters=["NO_SUCH_COUNTER"]),
    "crash": dict(function="crash", arguments=arg_map(x=[1])),
}
got = {}
for name, kw in cases.items():
    for side in ("local", "remote"):
        (delegate.cfiddle.disable if side == "local" else lambda: delegate.cfiddle.enable(time="2m"))()
        try:
            run(exes[:1], **kw)
            got[name + "/" + side] = None
        except Exception as e:
            got[name + "/" + side] = dict(type=type(e).__name__, msg=str(e),
                                          cfiddle=isinstance(e, CFiddleException),
                                          delegate_runner=isinstance(e, RunnerDelegateException),
                                          job=getattr(e, "job_id", ""))
out(got=got, jobs=delegate.cfiddle.last_job_ids())
shutil.rmtree(os.getcwd(), ignore_errors=True)
""",
        timeout=600,
    )
    got = res["got"]
    for name, typ in (
        ("missing", "MissingArgument"),
        ("type", "IncorrectArgumentType"),
        ("counter", "UnknownPerformanceCounter"),
    ):
        local, remote = got[name + "/local"], got[name + "/remote"]
        assert local and local["type"] == typ, local
        assert remote == local, f"{name}: the remote error is CFiddle's own, word for word"
    local, remote = got["crash/local"], got["crash/remote"]
    assert local["type"] == "RunnerDelegateException" and "error code -11" in local["msg"], local
    assert remote["type"] == "DelegatedRunError" and remote["delegate_runner"] and remote["cfiddle"], remote
    assert "error code -11" in remote["msg"] and "Segmentation fault" in remote["msg"], remote["msg"]
    assert remote["job"] and remote["job"] in remote["msg"] and remote["job"] == res["jobs"][0]


def test_size_bound_is_named_before_submitting(alice):
    res, _ = alice.result(
        HEADER
        + """
first = os.path.getsize(exes[0].lib)
got = {}
# Nothing fits; the first executable fits and the second does not.
for bound in (1000, first + 100):
    delegate.cfiddle.enable(max_bytes=bound)
    n0 = delegate.sbatch_count()
    try:
        run(exes, "loop", arg_map(count=[1], k=[1]))
        got[bound] = None
    except Exception as e:
        got[bound] = dict(type=type(e).__name__, msg=str(e), cfiddle=isinstance(e, CFiddleException))
    got[bound]["sbatch"] = delegate.sbatch_count() - n0
try:
    delegate.cfiddle.enable(max_bytes=10**12)
    bad = None
except ValueError as e:
    bad = str(e)
out(got=got, first=first, libs=[e.lib for e in exes], bad=bad)
shutil.rmtree(os.getcwd(), ignore_errors=True)
"""
    )
    small, one_fits = res["got"]["1000"], res["got"][str(res["first"] + 100)]
    for g in (small, one_fits):
        assert g["type"] == "RunTooLarge" and g["cfiddle"], g
        assert g["sbatch"] == 0, "nothing is submitted past the bound"
        assert "max_bytes" in g["msg"], g["msg"]
    lib0, lib1 = res["libs"]
    assert "1000 bytes" in small["msg"] and lib0 in small["msg"], small["msg"]
    # Names the executable that did not fit and the ones before it.
    assert f"{lib1} is " in one_fits["msg"] and f"after {res['first']} bytes" in one_fits["msg"], one_fits[
        "msg"
    ]
    assert f"({lib0} {res['first']} bytes)" in one_fits["msg"], one_fits["msg"]
    assert res["bad"] and "max_bytes" in res["bad"]


def test_cfiddle_version_mismatch_is_named(alice):
    pin = pinned_cfiddle()
    res, _ = alice.result(
        HEADER
        + """
import importlib.metadata
here = importlib.metadata.version("cfiddle")
# The caller claims another CFiddle; the sandbox compares with its own.
delegate.cfiddle._caller_version = lambda: "0.0.1"
delegate.cfiddle.enable(time="2m")
try:
    run(exes, "loop", arg_map(count=[1], k=[1]))
    err = None
except Exception as e:
    err = dict(type=type(e).__name__, msg=str(e), vm=isinstance(e, delegate.VersionMismatchError),
               cfiddle=isinstance(e, CFiddleException), job=e.job_id)
out(err=err, here=here, jobs=delegate.cfiddle.last_job_ids())
shutil.rmtree(os.getcwd(), ignore_errors=True)
""",
        timeout=300,
    )
    assert res["here"] == pin, "the test venv installs python/requirements-cfiddle.txt"
    err = res["err"]
    assert err and err["type"] == "CFiddleVersionMismatch" and err["vm"] and err["cfiddle"], err
    assert f"cfiddle 0.0.1 on the caller's side but cfiddle {pin} in the sandbox" in err["msg"], err["msg"]
    assert err["job"] == res["jobs"][0]


def test_two_students_at_once_see_only_their_own_builds(alice):
    """Alice and Bob run at the same time, each their own function under the
    same name; Bob's Python is configured as in a notebook kernel (CFiddle's
    Jupyter executables and progress bars). Each gets their own values, and
    each job directory holds only its owner's executable."""
    bob = Student("delegate-bob")
    script = """
import json, os, sys, tempfile
{pre}
os.environ["PATH"] = os.path.dirname(sys.executable) + ":" + os.environ["PATH"]
os.chdir(tempfile.mkdtemp(prefix="cfiddle-test-", dir=os.path.expanduser("~")))
import delegate, delegate.cfiddle
from delegate import _core
from cfiddle import *
exe = build(code(r'''
extern "C"
int who(int x) {{ return x * {mult}; }}
'''))
delegate.cfiddle.enable(time="2m")
r = run(exe, "who", arg_map(x=[1, 2]))
job = delegate.cfiddle.last_job_ids()[0]
root = os.path.join(_core.job_dir(job), "cfiddle")
files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
print("RESULT: " + json.dumps(dict(ret=[x.return_value for x in r], files=files, job=job,
      lib=os.path.basename(exe[0].lib), kind=type(exe[0]).__module__)), flush=True)
"""
    out = {}

    def go(student, mult, pre):
        try:
            out[student.name] = student.result(script.format(mult=mult, pre=pre), timeout=300)[0]
        except BaseException as e:  # noqa: BLE001 - reported below
            out[student.name] = e

    try:
        threads = [
            threading.Thread(target=go, args=(alice, 10, "")),
            threading.Thread(target=go, args=(bob, 100, "import ipykernel")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(360)
    finally:
        bob.cleanup()
    a, b = out.get("delegate-alice"), out.get("delegate-bob")
    for r in (a, b):
        if isinstance(r, BaseException) or r is None:
            pytest.fail(f"a student's run failed: {r}")
    assert a["ret"] == [10, 20] and b["ret"] == [100, 200]
    assert b["kind"] == "cfiddle.jupyter.source", "Bob's executables are CFiddle's notebook ones"
    assert a["job"] != b["job"]
    for r in (a, b):
        sos = [f for f in r["files"] if f.endswith(".so")]
        assert sos == [f"exe0/{r['lib']}"], r["files"]


def test_machine_columns_name_the_machine_of_each_row(alice):
    """``machine_columns=True``: each row of the table says which machine
    measured it (the call's fingerprint, issue 32); a run on one machine
    raises no classes warning."""
    res, _ = alice.result(
        HEADER
        + """
import warnings
delegate.cfiddle.enable(time="5m", machine_columns=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    r = run(exes, "loop", arguments=arg_map(count=[1000], k=[1]), perf_counters=["PERF_COUNT_SW_TASK_CLOCK"])
df = r.as_df()
out(cols=list(df.columns), model=df["machine_cpu_model"].tolist(), node=df["machine_node"].tolist(),
    warned=[str(w.message) for w in caught if "machine classes" in str(w.message)])
shutil.rmtree(os.getcwd(), ignore_errors=True)
""",
        timeout=600,
    )
    model = testlib.cpu0()["model name"]
    for col in ("machine_node", "machine_cpu_model", "machine_governor", "machine_boost"):
        assert col in res["cols"], res["cols"]
    assert res["model"] == [model, model], res["model"]
    assert res["warned"] == [], res["warned"]


def test_repeat_runs_each_measurement_n_times_in_one_sandbox(alice):
    """``repeat=3, warmup=1`` (issue 32): the run's invocations run once
    unmeasured and three times measured in one job (one sandbox, the same
    cores); the table has each measurement three times, told apart by
    ``repeat``."""
    res, _ = alice.result(
        HEADER
        + """
delegate.cfiddle.enable(time="5m", repeat=3, warmup=1)
r = run(exes, "loop", arguments=arg_map(count=[1000], k=[1]), perf_counters=["PERF_COUNT_SW_TASK_CLOCK"])
df = r.as_df()
out(n=len(df), repeats=sorted(df["repeat"].tolist()), jobs=delegate.cfiddle.last_job_ids(),
    clock=[float(v) for v in df["PERF_COUNT_SW_TASK_CLOCK"].tolist()])
shutil.rmtree(os.getcwd(), ignore_errors=True)
""",
        timeout=600,
    )
    per_run = res["n"] // 3
    assert per_run >= 1 and res["n"] == 3 * per_run, res
    assert res["repeats"] == sorted(list(range(3)) * per_run), res["repeats"]
    assert len(res["jobs"]) == 1, res["jobs"]
    assert all(c > 0 for c in res["clock"]), res["clock"]
