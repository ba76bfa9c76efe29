"""Maps through the Python package: `Executor.map` of N calls is ONE
sbatch and ONE exclusive Slurm job (one allocation per node: this cluster
has one) whose runner claims and runs the calls one after another, each in
its own container; results come back in order; cancelling one map future
cancels only that call."""

from __future__ import annotations

import socket

from conftest import containers_with_label

import testlib

HEADER = """
import json, os, socket, sys, time
import delegate
from delegate import _core
def out(**kw):
    print("RESULT: " + json.dumps(kw), flush=True)
def slurm_file(f):
    with open(os.path.join(_core.job_dir(f.job_id), "slurm-id")) as fh:
        return fh.read()
"""


def test_map_is_one_sbatch_one_shared_allocation_in_order(alice):
    res, _ = alice.result(
        HEADER
        + """
def work(x):
    # Nothing of an earlier call is left: /tmp is the container's own, /job the call's own.
    seen = sorted(os.listdir("/tmp")), sorted(os.listdir("/job"))
    open("/tmp/mark-%d" % x, "w").close()
    open("/job/mark-%d" % x, "w").close()
    return x * x, socket.gethostname(), seen
with delegate.Executor(time="1m") as ex:
    values = list(ex.map(work, range(4), timeout=240))
    futs = list(ex._futures)
st = delegate.status([f.job_id for f in futs])
out(values=[v[0] for v in values], hosts=[v[1] for v in values], sbatch=delegate.sbatch_count(),
    seen=[v[2] for v in values],
    slurm_ids=[s["slurm_id"] for s in st], states=[s["state"] for s in st],
    files=[slurm_file(f) for f in futs], ids=[f.job_id for f in futs])
"""
    )
    assert res["values"] == [0, 1, 4, 9], res
    assert res["sbatch"] == 1, "a map must make exactly one sbatch call"
    sid = res["slurm_ids"][0]
    assert sid and sid.isdigit(), f"one plain Slurm job expected, got {res['slurm_ids']}"
    assert res["slurm_ids"] == [sid] * 4, res
    assert res["files"] == [f"{sid}\nshared 4\n"] * 4, res
    assert res["states"] == ["completed"] * 4, res
    # Each call in its own container (its /tmp is empty, below), named
    # after the node it ran on: this machine.
    assert set(res["hosts"]) == {socket.gethostname().split(".")[0]}, res["hosts"]
    for tmp, job in res["seen"]:
        assert tmp == [], f"/tmp of a call holds another call's files: {res['seen']}"
        assert not any(n.startswith("mark-") for n in job), (
            f"/job of a call holds another call's files: {res['seen']}"
        )
    assert len(set(res["ids"])) == 4


def test_cancel_of_one_map_future_cancels_only_that_call(alice):
    res, _ = alice.result(
        HEADER
        + """
def nap(x):
    time.sleep(x)
    return x
ex = delegate.Executor(time="2m")
gen = ex.map(nap, [30, 1, 2, 1])
futs = list(ex._futures)
ids = [f.job_id for f in futs]
deadline = time.time() + 120
while time.time() < deadline:
    st = delegate.status(ids)
    if st[0]["state"] == "running" and st[0]["started"] is not None:
        break
    time.sleep(0.3)
before = [(s["state"], s["reason"]) for s in delegate.status(ids)]
# A call that has not started: over at once, the allocation goes on.
ok_pending = futs[2].cancel()
after_pending = delegate.status([ids[2]])[0]
# The call that is running (its container started): its container is
# stopped, the next call starts.
t = time.time()
ok_running = futs[0].cancel()
st0 = delegate.status([ids[0]])[0]
while st0["state"] not in ("cancelled", "completed", "failed", "lost") and time.time() - t < 30:
    time.sleep(0.2)
    st0 = delegate.status([ids[0]])[0]
took = time.time() - t
r1 = futs[1].result(timeout=120)
r3 = futs[3].result(timeout=120)
final = delegate.status(ids)
out(before=before, ok=[ok_pending, ok_running], after_pending=[after_pending["state"], after_pending["reason"]],
    st0=[st0["state"], st0["reason"]], took=took, r=[r1, r3],
    cancelled=[f.cancelled() for f in futs], final=[s["state"] for s in final],
    sids=sorted({s["slurm_id"] for s in final}), sbatch=delegate.sbatch_count(), ids=ids)
ex.shutdown(wait=False)
""",
        timeout=400,
    )
    assert res["sbatch"] == 1 and len(res["sids"]) == 1, res
    before = res["before"]
    assert before[0][0] == "running", before
    for state, reason in before[1:]:
        assert state == "pending" and reason == "waiting for an allocation of its map to claim it", before
    assert res["ok"] == [True, True], res
    assert res["after_pending"] == ["cancelled", "cancelled by the user before it started"], res
    assert res["st0"] == ["cancelled", "cancelled by the user"], res
    assert res["took"] < 15, res
    assert res["r"] == [1, 1], res
    assert res["cancelled"] == [True, False, True, False], res
    assert res["final"] == ["cancelled", "completed", "cancelled", "completed"], res
    for job in res["ids"]:
        testlib.wait_until(
            f"the containers of {job} removed", lambda j=job: containers_with_label(j) == [], 60
        )


def test_calls_per_allocation_1_is_a_job_array_again(alice):
    res, _ = alice.result(
        HEADER.replace(
            "import delegate", "os.environ['DELEGATE_CALLS_PER_ALLOCATION'] = '1'\nimport delegate", 1
        )
        + """
def sq(x):
    return x * x
with delegate.Executor(time="1m") as ex:
    values = list(ex.map(sq, range(3), timeout=240))
    futs = list(ex._futures)
st = delegate.status([f.job_id for f in futs])
out(values=values, sbatch=delegate.sbatch_count(), slurm_ids=[s["slurm_id"] for s in st],
    files=[slurm_file(f) for f in futs])
"""
    )
    assert res["values"] == [0, 1, 4]
    assert res["sbatch"] == 1, "a map is still one sbatch (a job array)"
    base = res["slurm_ids"][0].split("_")[0]
    assert res["slurm_ids"] == [f"{base}_{i}" for i in range(3)], res
    assert res["files"] == [f"{base}_{i}\n" for i in range(3)], res


def test_a_failing_call_does_not_stop_the_others(alice):
    res, _ = alice.result(
        HEADER
        + """
def inv(x):
    return 1 / x
ex = delegate.Executor(time="1m")
ex.map(inv, [1, 0, 4])  # submitted at once; read through the futures, not the generator
futs = list(ex._futures)
e = futs[1].exception(timeout=240)
out(r0=futs[0].result(timeout=240), r2=futs[2].result(timeout=240), exc=type(e).__name__,
    states=[f.state for f in futs], sids=sorted({f.status.get("slurm_id") for f in futs}),
    sbatch=delegate.sbatch_count())
ex.shutdown()
"""
    )
    assert res["exc"] == "ZeroDivisionError", res
    assert (res["r0"], res["r2"]) == (1.0, 0.25), res
    # (A call that raised still ran to its end: its job is completed, the exception is its result.)
    assert res["states"] == ["completed"] * 3, res
    assert res["sbatch"] == 1 and len(res["sids"]) == 1 and res["sids"][0].isdigit(), res


def test_a_maps_dropped_calls_say_why_and_a_raised_call_reads_raised(alice):
    """A map stops at its first failing call and cancels the calls it has
    not run: their state says which call raised (not "cancelled by the
    user", which the student did not do), in this process and from the CLI
    of another; the call that raised reads "raised ZeroDivisionError" in
    `delegate list` and `delegate.jobs()` of a fresh process."""
    res, _ = alice.result(
        HEADER
        + """
def inv(x):
    import time
    time.sleep(2)
    return 1 / x
with delegate.Executor(time="1m") as ex:
    try:
        list(ex.map(inv, [1, 0, 2, 3, 4, 5], timeout=240))
    except ZeroDivisionError:
        pass
    futs = list(ex._futures)
st = delegate.status([f.job_id for f in futs])
out(ids=[f.job_id for f in futs], words=[f.outcome for f in futs],
    states=[s["state"] for s in st], reasons=[s["reason"] for s in st])
"""
    )
    assert res["words"][1] == "raised ZeroDivisionError", res
    dropped = [i for i, s in enumerate(res["states"]) if s == "cancelled"]
    assert dropped, f"no call was dropped: {res}"
    for i in dropped:
        assert res["reasons"][i] == "cancelled: call 1 of this map raised ZeroDivisionError", res
        assert res["words"][i] == "cancelled: call 1 of this map raised ZeroDivisionError", res
    listing = alice.run(
        "import subprocess; print(subprocess.run(['delegate', 'list'], capture_output=True, text=True).stdout)"
    ).stdout
    mine = {i: line for line in listing.splitlines() for i in res["ids"] if line.startswith(i)}
    assert "raised ZeroDivisionError" in mine[res["ids"][1]], listing
    for i in dropped:
        assert "cancelled: call 1 of this map raised ZeroDivisionError" in mine[res["ids"][i]], listing
    assert not any("cancelled by the user" in line for line in mine.values()), listing
    table, _ = alice.result(
        HEADER + "t = delegate.jobs(50)\nout(rows={r['id']: r['outcome'] for r in t}, html=t._repr_html_())\n"
    )
    assert table["rows"][res["ids"][1]] == "raised ZeroDivisionError", table
    assert "#c62828" in table["html"], table["html"]
