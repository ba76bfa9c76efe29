"""Dask (issue 43, seed 003): a task graph whose every task runs in a
sandbox, by handing delegate.Executor to Dask as its scheduler
(`dask.compute(..., scheduler=executor)`: Dask's local scheduler submits
its tasks to any concurrent.futures executor). Dask is pinned once
(python/requirements-cfiddle.txt) for both sides: its task code runs in
the sandbox. Run by tests/run.sh (stage 5), as a student, on the real
local cluster."""

from __future__ import annotations

HEADER = """
import json, os
import dask, dask.array as da
import delegate
def out(**kw):
    print("RESULT: " + json.dumps(kw), flush=True)
"""


def test_a_delayed_graph_runs_each_task_in_a_sandbox(alice):
    """Four `dask.delayed` tasks and the one that sums them: each runs as
    the student in a sandbox of its own (a call each, /job inside, named by
    its task), and the graph's value is the one Dask computes with its
    threads."""
    res, _ = alice.result(
        HEADER
        + """
@dask.delayed
def inc(x):
    return {"v": x + 1, "uid": os.getuid(), "job": os.path.isdir("/job")}
@dask.delayed
def total(parts):
    return {"sum": sum(p["v"] for p in parts), "parts": parts, "job": os.path.isdir("/job")}
graph = total([inc(i) for i in range(4)])
root = os.path.expanduser("~/.delegate/jobs")
before = set(os.listdir(root)) if os.path.isdir(root) else set()
with delegate.Executor(time="2m") as ex:
    (got,) = dask.compute(graph, scheduler=ex)
calls = [n for n in set(os.listdir(root)) - before if os.path.isdir(os.path.join(root, n))]
(local,) = dask.compute(graph, scheduler="threads")
whats = sorted(r["what"] for r in delegate.jobs() if r["id"] in calls)
out(sum=got["sum"], local=local["sum"], uids=[p["uid"] for p in got["parts"]],
    jobs=[p["job"] for p in got["parts"]] + [got["job"]], me=os.getuid(), calls=len(calls), whats=whats)
""",
        timeout=600,
    )
    assert res["sum"] == res["local"] == 10, res
    assert res["uids"] == [res["me"]] * 4, res
    assert res["jobs"] == [True] * 5, res
    assert res["calls"] == 5, res  # (a call per task, each its own sandbox)
    # Each named by its task (delegate list, delegate.jobs()), not by
    # Dask's batch_execute_tasks.
    assert res["whats"] == ["inc()"] * 4 + ["total()"], res


def test_a_dask_array_reduction_through_the_executor(alice):
    """A `dask.array` reduction (four chunks, the sum of their sums): the
    same value as numpy's, every chunk computed in a sandbox."""
    res, _ = alice.result(
        HEADER
        + """
import numpy as np
x = da.arange(100_000, chunks=25_000)
with delegate.Executor(time="2m") as ex:
    got = int((x * 2).sum().compute(scheduler=ex))
out(got=got, want=int((np.arange(100_000) * 2).sum()))
""",
        timeout=600,
    )
    assert res["got"] == res["want"], res
