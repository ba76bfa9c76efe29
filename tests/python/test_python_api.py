"""The Python package against the real local cluster: every call below runs
in its own sandbox through real Slurm and the real Docker engine."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import containers_with_label

import testlib

HEADER = """
import hashlib, json, sys, threading, time
import delegate
def out(**kw):
    print("RESULT: " + json.dumps(kw), flush=True)
"""


def test_return_values_of_several_kinds_and_one_waiter(alice):
    res, _ = alice.result(
        HEADER
        + """
@delegate.remote(time="2m")
def value(kind):
    if kind == "int":
        return 42
    if kind == "dict":
        return {"a": [1, 2, {"b": (3, 4.5)}], "c": {"d": None, "e": "é"}}
    return bytes(range(256)) * (10 * 1024 * 1024 // 256)
futs = [value.submit(k) for k in ("int", "dict", "bytes")]
waiters = [t.name for t in threading.enumerate() if t.name == "delegate-waiter"]
i, d, b = [f.result(timeout=240) for f in futs]
out(i=i, d_ok=d == {"a": [1, 2, {"b": (3, 4.5)}], "c": {"d": None, "e": "é"}},
    blen=len(b), bhash=hashlib.sha256(b).hexdigest(),
    want=hashlib.sha256(bytes(range(256)) * (10 * 1024 * 1024 // 256)).hexdigest(),
    waiters=len(waiters), states=[f.state for f in futs], ids=[f.job_id for f in futs])
"""
    )
    assert res["i"] == 42
    assert res["d_ok"]
    assert res["blen"] == 10 * 1024 * 1024 and res["bhash"] == res["want"]
    assert res["waiters"] == 1, "N futures share one waiter thread"
    assert res["states"] == ["completed"] * 3


def test_lambda_closure_main_function_and_kwargs(alice):
    res, _ = alice.result(
        HEADER
        + """
def scaled(x, *, factor=1, offset=0):
    return x * factor + offset
def make_adder(n):
    def add(x):
        return x + n
    return add
ex = delegate.Executor(time="2m")
f1 = ex.submit(lambda x: x ** 2, 12)
f2 = ex.submit(make_adder(100), 5)
f3 = ex.submit(scaled, 7, factor=3, offset=1)
f4 = delegate.remote(scaled)(2, factor=10)
out(lam=f1.result(240), clo=f2.result(240), main=f3.result(240), direct=f4)
ex.shutdown()
"""
    )
    assert res == {"lam": 144, "clo": 105, "main": 22, "direct": 20}


def test_value_error_is_reraised_with_the_remote_traceback(alice):
    res, _ = alice.result(
        HEADER
        + """
import traceback
@delegate.remote(time="2m")
def check(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")  # the remote line
    return n
try:
    check(-3)
    out(raised=None)
except ValueError as e:
    out(raised=type(e).__name__, msg=str(e), cause=str(e.__cause__),
        text="".join(traceback.format_exception(type(e), e, e.__traceback__)))
"""
    )
    assert res["raised"] == "ValueError"
    assert res["msg"] == "n must be >= 0, got -3"
    assert "in check" in res["cause"]
    assert 'raise ValueError(f"n must be >= 0, got {n}")  # the remote line' in res["cause"]
    assert "remote" in res["text"]


def test_exception_class_defined_by_the_caller(alice):
    res, _ = alice.result(
        HEADER
        + """
class BudgetExceeded(Exception):
    pass
def spend():
    raise BudgetExceeded("over budget by 3")
f = delegate.Executor(time="2m").submit(spend)
e = f.exception(timeout=240)
out(same_class=type(e) is BudgetExceeded, msg=str(e), isinst=isinstance(e, BudgetExceeded))
"""
    )
    assert res == {"same_class": True, "msg": "over budget by 3", "isinst": True}


def test_unpicklable_exception_becomes_remote_error(alice):
    res, _ = alice.result(
        HEADER
        + """
def locked():
    raise RuntimeError("holding", threading.Lock())
try:
    delegate.remote(locked, time="2m")()
    out(raised=None)
except delegate.RemoteError as e:
    out(raised=type(e).__name__, text=str(e), tb=e.remote_traceback, rtype=e.remote_type)
except Exception as e:
    out(raised="other " + repr(e))
"""
    )
    assert res["raised"] == "RemoteError", res
    assert "RuntimeError" in res["text"] and "holding" in res["text"]
    assert "in locked" in res["tb"] and 'raise RuntimeError("holding", threading.Lock())' in res["tb"]
    assert res["rtype"] == "RuntimeError"


def test_stdout_and_stderr_are_shown_and_kept(alice):
    res, r = alice.result(
        HEADER
        + """
@delegate.remote(time="2m")
def chatty():
    print("hello from the sandbox")
    print("warning from the sandbox", file=sys.stderr)
    return 1
f = chatty.submit()
print("before result", flush=True)
v = f.result(timeout=240)
print("after result", flush=True)
out(v=v, so=f.stdout, se=f.stderr)
"""
    )
    assert res["v"] == 1
    assert res["so"] == "hello from the sandbox\n"
    assert res["se"] == "warning from the sandbox\n"
    lines = r.stdout.splitlines()
    assert lines.index("before result") < lines.index("hello from the sandbox") < lines.index("after result")
    assert "warning from the sandbox" in r.stderr


def test_map_over_50_inputs_is_one_sbatch_in_order(alice):
    res, _ = alice.result(
        HEADER
        + """
def sq(x):
    return x * x
with delegate.Executor(time="1m") as ex:
    t = time.time()
    out_ = list(ex.map(sq, range(50), timeout=900))
futs = ex._futures
out(values=out_, sbatch=delegate.sbatch_count(), secs=time.time() - t,
    slurm_ids=sorted({(f.status.get("slurm_id") or "").split("_")[0] for f in futs}),
    ids=len({f.job_id for f in futs}))
""",
        timeout=1000,
    )
    assert res["values"] == [x * x for x in range(50)]
    assert res["sbatch"] == 1, "map must make exactly one sbatch call"
    assert len(res["slurm_ids"]) == 1, f"one Slurm job array, got {res['slurm_ids']}"
    assert res["ids"] == 50, "each call has its own job directory"


def test_cancel_pending_and_running(alice):
    res, _ = alice.result(
        HEADER
        + """
def nap(s):
    time.sleep(s)
    return s
ex = delegate.Executor(time="3m")
running = ex.submit(nap, 120)
pending = ex.submit(nap, 1)  # the node is exclusive: this one waits in the queue
deadline = time.time() + 180
while time.time() < deadline:
    st = {s["id"]: s["state"] for s in delegate.status([running.job_id, pending.job_id])}
    if st[running.job_id] == "running" and st[pending.job_id] == "pending":
        break
    time.sleep(0.5)
before = dict(st)
ok_pending = pending.cancel()
ok_running = running.cancel()
deadline = time.time() + 60
while time.time() < deadline:
    after = {s["id"]: s["state"] for s in delegate.status([running.job_id, pending.job_id])}
    if all(s not in ("pending", "running") for s in after.values()):
        break
    time.sleep(0.2)
out(before=[before[running.job_id], before[pending.job_id]], ok=[ok_running, ok_pending],
    cancelled=[running.cancelled(), pending.cancelled()],
    after=[after[running.job_id], after[pending.job_id]], ids=[running.job_id, pending.job_id])
""",
        timeout=400,
    )
    assert res["before"] == ["running", "pending"], res
    assert res["ok"] == [True, True] and res["cancelled"] == [True, True]
    assert res["after"] == ["cancelled", "cancelled"], res
    for job in res["ids"]:
        testlib.wait_until(
            f"the containers of {job} removed", lambda j=job: containers_with_label(j) == [], 60
        )


def test_reattach_by_id_from_a_fresh_interpreter(alice):
    res, _ = alice.result(
        HEADER
        + """
def slow_sum(n):
    time.sleep(3)
    return sum(range(n))
f = delegate.Executor(time="2m").submit(slow_sum, 1000)
out(id=f.job_id)
""",
        name="first",
    )
    res2, _ = alice.result(
        HEADER
        + f"""
j = delegate.Job({res["id"]!r})
out(v=j.result(timeout=240), state=j.state, id=j.job_id)
""",
        name="second",
    )
    assert res2 == {"v": 499500, "state": "completed", "id": res["id"]}


def test_result_timeout_expires(alice):
    res, _ = alice.result(
        HEADER
        + """
import concurrent.futures as cf
def forever():
    time.sleep(300)
f = delegate.Executor(time="2m").submit(forever)
t = time.time()
try:
    f.result(timeout=2)
    out(raised=None)
except cf.TimeoutError:
    took = time.time() - t
    done = f.done()
    f.cancel()
    out(raised="TimeoutError", took=took, done=done)
"""
    )
    assert res["raised"] == "TimeoutError"
    assert 1.5 <= res["took"] < 10
    assert res["done"] is False


def test_perf_event_open_counts_inside_the_sandbox(alice):
    res, _ = alice.result(
        HEADER
        + """
def count():
    import ctypes, os, struct
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 298, "aarch64": 241}[os.uname().machine]
    flags = (1 << 5) | (1 << 6)  # exclude_kernel | exclude_hv
    attr = struct.pack("IIQQQQQQIIQQ", 1, 64, 1, 0, 0, 0, flags, 0, 0, 0, 0, 0)[:64]
    buf = ctypes.create_string_buffer(attr, 64)
    fd = libc.syscall(nr, buf, 0, -1, -1, 0)  # PERF_TYPE_SOFTWARE, TASK_CLOCK
    if fd < 0:
        raise OSError(ctypes.get_errno(), "perf_event_open: " + os.strerror(ctypes.get_errno()))
    sum(i * i for i in range(200000))
    return struct.unpack("Q", os.read(fd, 8))[0]
out(n=delegate.remote(count, time="2m")())
"""
    )
    assert res["n"] > 0


def test_version_mismatch_is_named(alice):
    res, _ = alice.result(
        HEADER
        + """
import cloudpickle, delegate_sandbox as fmt
from delegate import _core
from delegate._futures import attach
body = cloudpickle.dumps((len, ("abc",), {}))
payload = fmt.encode_payload(body, "3.7.1", "0.5.0")
(jid,) = _core.submit_python([payload], "3.7.1", "0.5.0", time="1m")
try:
    attach(jid).result(timeout=240)
    out(raised=None)
except delegate.VersionMismatchError as e:
    out(raised="VersionMismatchError", msg=str(e))
"""
    )
    assert res["raised"] == "VersionMismatchError"
    for v in ("3.7.1", "0.5.0", "3.11", "3.1.2"):
        assert v in res["msg"], res["msg"]


def test_files_are_shipped_with_each_call(alice):
    """`files=` on @delegate.remote and Executor: each call's sandbox sees
    them under /job (relative paths from where the call is made)."""
    res, _ = alice.result(
        HEADER
        + """
import os, tempfile
d = tempfile.mkdtemp(dir=os.path.expanduser("~"))
os.chdir(d)
os.mkdir("data")
open("data/x.txt", "w").write("shipped data")
open("helpers.py", "w").write("def twice(x):\\n    return 2 * x\\n")
@delegate.remote(time="2m", files=["helpers.py", "data"])
def use(x):
    import sys
    sys.path.insert(0, "/job")
    import helpers
    return helpers.twice(x), open("/job/data/x.txt").read()
one = use(21)
with delegate.Executor(time="2m", files=["data"]) as ex:
    many = list(ex.map(lambda i: (i, open("/job/data/x.txt").read()), range(3)))
try:
    delegate.remote(files=["no-such-file"])(len)("x")
    refused = None
except delegate.DelegateError as e:
    refused = str(e)
out(one=one, many=many, refused=refused)
"""
    )
    assert res["one"] == [42, "shipped data"], res
    assert res["many"] == [[i, "shipped data"] for i in range(3)], res
    assert res["refused"] and "cannot ship" in res["refused"] and "no-such-file" in res["refused"], res


TRACEBACK_SCRIPT = """import delegate
@delegate.remote(time="2m")
def divide(x):
    return x / 0
def student_code():
    return divide(1)
student_code()
"""


def test_no_delegate_frame_in_ipython_or_plain_python(alice):
    """The traceback a student reads, in IPython in a terminal and in plain
    Python: their own lines and the remote line, no frame of delegate's
    (the notebook's is checked by test_notebook.py, JupyterLab's by the
    acceptance suite)."""
    res, _ = alice.result(
        HEADER
        + f"""
import os, subprocess, tempfile
path = os.path.join(tempfile.mkdtemp(), "tb.py")
open(path, "w").write({TRACEBACK_SCRIPT!r})
texts = {{}}
for how, cmd in (("ipython", [sys.executable, "-m", "IPython", "--colors=NoColor", path]),
                 ("python", [sys.executable, path])):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    texts[how] = r.stdout + r.stderr
out(**texts)
"""
    )
    for how in ("ipython", "python"):
        tb = res[how]
        assert "ZeroDivisionError" in tb and "return x / 0" in tb and "return divide(1)" in tb, (how, tb)
        for internal in ("_traceback.py", "raise_remote", "_futures.py", "concurrent/futures", "exec(code"):
            assert internal not in tb, (how, internal, tb)


def test_a_futures_fingerprint_names_the_machine(alice):
    """``fut.fingerprint``: the machine the call ran on, recorded by the
    worker's agent (issue 32); None while the call has not ended."""
    res, _ = alice.result(
        HEADER
        + """
@delegate.remote(time="2m")
def work():
    return sum(range(10**6))
f = work.submit()
before = f.fingerprint
f.result(timeout=240)
fp = f.fingerprint
(row,) = [r for r in delegate.jobs(50) if r["id"] == f.job_id]
out(before=before, node=fp["node"], model=fp["cpu_model"], kernel=fp["kernel"], cores=fp["cores"],
    perf=fp["perf_mode"], governor=fp["governor"], row_cpu=row["cpu"], row_machine=row["machine"])
"""
    )
    model = testlib.cpu0()["model name"]
    assert res["before"] is None
    assert res["model"] == model and res["kernel"] == os.uname().release
    assert res["row_cpu"] == model and model in res["row_machine"], "delegate.jobs() shows the machine"
    assert res["cores"] and res["perf"] in ("seccomp", "perfmon", "off")
    gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    assert res["governor"] == (gov.read_text().strip() if gov.exists() else None)


def test_repeat_runs_the_body_in_one_sandbox_and_compare_interleaves(alice):
    """``repeat=N, warmup=K``: N+K runs of the body in one process of one
    sandbox, the N measured ones returned with their statistics;
    ``delegate.compare``: both functions in one sandbox, one submission.
    (Structure only: tests do not assert on time.)"""
    res, _ = alice.result(
        HEADER
        + """
import os
@delegate.remote(time="2m", repeat=5, warmup=2)
def work(n):
    import sys
    sys.dlg_calls = getattr(sys, "dlg_calls", 0) + 1
    return (os.getpid(), sys.dlg_calls, sum(range(n)))
r = work(10**5)
before = delegate.sbatch_count()
c = delegate.compare(lambda n: sum(range(n)), lambda n: sum(range(4 * n)), 10**5, repeat=8, time="2m")
out(values=[list(v) for v in r.values], n=len(r.seconds), warmup=r.warmup,
    ok=r.stats.min <= r.stats.median <= r.stats.max, warning=r.warning is None or isinstance(r.warning, str),
    ratio=c.ratio, ci=list(c.ci), pairs=(len(c.a.seconds), len(c.b.seconds)), sbatch=delegate.sbatch_count() - before,
    text=repr(c))
"""
    )
    values = res["values"]
    assert len({v[0] for v in values}) == 1, "every run in one process"
    assert [v[1] for v in values] == [3, 4, 5, 6, 7], "two warm-up runs first, then the five measured"
    assert len({v[2] for v in values}) == 1
    assert res["n"] == 5 and res["warmup"] == 2 and res["ok"] and res["warning"]
    assert res["pairs"] == [8, 8] and res["sbatch"] == 1
    assert res["ratio"] > 0 and res["ci"][0] <= res["ratio"] <= res["ci"][1]
    assert "95% CI, 8 pairs" in res["text"], res["text"]


def test_mix_classes_is_a_keyword_of_remote_executor_and_map(alice):
    """``mix_classes=True`` reaches the submission (one class here: the
    calls run either way; the class pinning itself is tried on the stack,
    tests/cluster/test_ranks.py); anything else of its kind is refused."""
    res, _ = alice.result(
        HEADER
        + """
@delegate.remote(time="1m", mix_classes=True)
def sq(x):
    return x * x
with delegate.Executor(time="1m", mix_classes=False) as ex:
    ex_values = list(ex.map(lambda x: x + 1, [1, 2]))
try:
    delegate.remote(mix=True)
    refused = None
except TypeError as e:
    refused = str(e)
out(values=sq.map([1, 2, 3]), ex=ex_values, refused=refused)
"""
    )
    assert res["values"] == [1, 4, 9] and res["ex"] == [2, 3], res
    assert res["refused"] and "unknown resource 'mix'" in res["refused"], res["refused"]
