#!/usr/bin/env python3
"""Dask through delegate (issue 43): the overhead per task of a Dask graph
whose every task runs in a sandbox (`dask.compute(..., scheduler=
delegate.Executor())`), against the same graph on Dask's threads in the
same run. Run as root on the single-machine cluster (./build_cluster.sh
--local), nothing else running; the graph runs as $BENCH_MAP_USER
(default delegate-load0), a course account:

    bench/dask_graph.py [--tasks 20] [--out FILE.json]

Printed: the graph of TASKS independent trivial tasks and their sum, on
threads and through the executor (each task a call of its own), against
delegate's own map of as many calls (one sbatch, its allocations pulling
the calls); the overhead per task, and the task length at which that
overhead is a tenth of the work (docs/ml.md). Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap

from maps import USER, as_user

SCRIPT = """
import json, sys, time
import dask, delegate

n = int(sys.argv[1])

def plain(i):
    return i

one = dask.delayed(plain)
graph = dask.delayed(sum)([one(i) for i in range(n)])
t = time.monotonic()
(want,) = dask.compute(graph, scheduler="threads")
threads = time.monotonic() - t
with delegate.Executor(time="1m") as ex:
    t = time.monotonic()
    with dask.config.set(num_workers=n):
        (got,) = dask.compute(graph, scheduler=ex)
    sandboxed = time.monotonic() - t
    t = time.monotonic()
    list(ex.map(plain, range(n + 1)))
    mapped = time.monotonic() - t
print(json.dumps({"tasks": n + 1, "threads_s": threads, "sandboxed_s": sandboxed, "map_s": mapped,
                  "same": got == want}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, dir="/tmp") as f:
        f.write(textwrap.dedent(SCRIPT))
    os.chmod(f.name, 0o644)
    try:
        out = as_user(USER, sys.executable, f.name, str(a.tasks), timeout=1800)
    finally:
        os.unlink(f.name)
    res = json.loads(out.strip().splitlines()[-1])
    per_task = (res["sandboxed_s"] - res["threads_s"]) / res["tasks"]
    res["overhead_per_task_s"] = per_task
    print(f"graph of {res['tasks']} tasks on Dask's threads: {res['threads_s']:.3f} s")
    print(
        f"the same, each task in a sandbox (delegate.Executor): {res['sandboxed_s']:.1f} s; same value: {res['same']}"
    )
    ratio = res["sandboxed_s"] / res["map_s"]
    print(f"delegate's own map of as many calls: {res['map_s']:.1f} s (the graph took {ratio:.2f}x that)")
    print(
        f"overhead per task: {per_task:.2f} s; a task of {10 * per_task:.0f} s or more keeps it under a tenth"
    )
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
