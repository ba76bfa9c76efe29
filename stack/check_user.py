"""The user-side part of `build_cluster.sh test`, run on the user node as a
test account (python3 - MODE < check_user.py). Prints one line per check;
exits non-zero with the reason on the first failure.

  basic   a Python function through the delegate package: runs as this
          account's uid, and measures with a perf counter (task-clock)
  excl    4 jobs of 5 s at once: no two on one node at the same time
  map     a map of 3 calls per worker: one sbatch (one job array, an
          allocation per worker pulling the calls), every worker used, calls
          one after another on each node, a fresh container for each call

With a last argument `at-least` (elastic workers: Slurm may keep the work
on the workers that are up rather than power another one up): `excl`
checks only that no two jobs share a node at once (N sets how many jobs:
2N), and `map` that at least N workers were used, in any number of
allocations; no two calls on one node at once still holds.
"""

import os
import sys

import delegate

PERF_NR = {"x86_64": 298, "aarch64": 241}


@delegate.remote(cpus=1, time="2m")
def identity_and_perf():
    import ctypes
    import os
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    flags = (1 << 5) | (1 << 6)  # exclude_kernel | exclude_hv
    # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK: works in VMs too.
    attr = struct.pack("IIQQQQQQIIQQ", 1, 64, 1, 0, 0, 0, flags, 0, 0, 0, 0, 0)[:64]
    buf = ctypes.create_string_buffer(attr, 64)
    fd = libc.syscall({"x86_64": 298, "aarch64": 241}[os.uname().machine], buf, 0, -1, -1, 0)
    if fd < 0:
        return os.getuid(), os.getgid(), "perf_event_open failed: " + os.strerror(ctypes.get_errno())
    sum(i * i for i in range(200000))
    return os.getuid(), os.getgid(), struct.unpack("Q", os.read(fd, 8))[0]


@delegate.remote(cpus=1, time="2m")
def nap(i):
    import time

    t0 = time.time()
    time.sleep(5)
    return i, t0, time.time()


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def basic():
    fut = identity_and_perf.submit()
    uid, gid, perf = fut.result(timeout=240)
    st = fut.status
    if uid != os.getuid() or gid != os.getgid():
        fail(f"the sandbox ran as {uid}:{gid}, not as {os.getuid()}:{os.getgid()}")
    if not isinstance(perf, int) or perf <= 0:
        fail(f"perf counter measurement: {perf}")
    print(f"ok: Python function as uid {uid} on {st.get('host')}, task-clock {perf} ns", flush=True)


def excl(workers, at_least=False):
    futs = [nap.submit(i) for i in range(2 * workers)]
    runs = []
    for f in futs:
        f.result(timeout=300)
        st = f.status
        # Seconds since the epoch, from the job's outcome (runner's clock).
        runs.append((st["host"], st["started"], st["finished"], f.job_id))
    for a in runs:
        for b in runs:
            if a is not b and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]:
                fail(f"jobs {a[3]} and {b[3]} overlapped on node {a[0]}")
    hosts = sorted({r[0] for r in runs})
    for h, s, e, j in sorted(runs, key=lambda r: r[1]):
        print(f"   {j} on {h}: {s:.1f} .. {e:.1f}", flush=True)
    if len(hosts) != workers and not (at_least and len(hosts) >= 1):
        fail(f"{len(runs)} jobs ran on {hosts}, expected all {workers} workers used")
    print(
        f"ok: {len(runs)} jobs of 5 s, never two on one node at once (nodes {', '.join(hosts)})", flush=True
    )


def stamp(i):
    import os
    import socket
    import time

    t0 = time.time()
    # A fresh container's /tmp is empty; this call leaves a mark in it.
    leftovers = sorted(os.listdir("/tmp"))
    open(f"/tmp/call-{i}", "w").close()
    time.sleep(1)
    # Inside the sandbox the hostname is the node's.
    return i, socket.gethostname(), t0, time.time(), leftovers


def map_check(workers, at_least=False):
    from delegate import _core

    n = 3 * workers
    s0 = _core.sbatch_count()
    with delegate.Executor(cpus=1, time="2m") as ex:
        got = list(ex.map(stamp, range(n), timeout=300))
        sts = [f.status for f in ex._futures]
    if [g[0] for g in got] != list(range(n)):
        fail(f"map results out of order: {[g[0] for g in got]}")
    if _core.sbatch_count() - s0 != 1:
        fail(f"a map of {n} used {_core.sbatch_count() - s0} sbatch calls, not one")
    if any(g[4] for g in got):
        fail(f"calls shared a container: /tmp held {[g[4] for g in got]}")
    if [g[1] for g in got] != [st["host"] for st in sts]:
        fail(f"a sandbox's hostname is not its node's: {[g[1] for g in got]}")
    allocs = {st["slurm_id"] for st in sts}
    hosts = {st["host"] for st in sts}
    if len(allocs) != 1:
        fail(f"a map of {n} is not one Slurm job (array): {sorted(allocs)}")
    spread = len(hosts) >= workers if at_least else len(hosts) == workers
    if not spread:
        fail(f"a map of {n} ran on {sorted(hosts)}; expected every one of {workers} workers")
    runs = [(st["host"], g[2], g[3]) for st, g in zip(sts, got)]
    for a in runs:
        for b in runs:
            if a is not b and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]:
                fail(f"two calls of one map overlapped on node {a[0]}")
    print(
        f"ok: map of {n}: one sbatch, job {', '.join(sorted(allocs))} pulled on {', '.join(sorted(hosts))}, "
        f"{n} containers, calls one after another per node",
        flush=True,
    )


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "basic":
        basic()
    elif mode == "excl":
        excl(int(sys.argv[2]), sys.argv[3:] == ["at-least"])
    elif mode == "map":
        map_check(int(sys.argv[2]), sys.argv[3:] == ["at-least"])
    else:
        fail(f"unknown mode {mode}")
