#!/usr/bin/env python3
"""Maps whose allocations pull their calls (issue 42), each figure against
its baseline in the same run. Run as root on the single-machine cluster
(./build_cluster.sh --local), nothing else running:

    bench/maps.py [--calls 200] [--out FILE.json]

Printed, one row each:

  limit      a map of CALLS trivial calls (`delegate submit --count CALLS
             --time 5m -- true`, submit to every call done) against the same
             map with `--time 1m`: the calls' limits no longer decide how
             they share allocations (goal: within 1.1x);
  lifecycle  the 5-minute map against CALLS times the engine's own container
             lifecycle (create, start, wait, remove through the Docker API,
             the sandbox's HostConfig; turnover.py's floor) (goal: 1.2x);
  waits      another student's call submitted while a map's call of 3 s
             runs: from its submission to its start, against the time the
             map's current call still had to run then (goal: that plus
             Slurm's scheduling tick);
  jobs       a held map of 1,000 calls: the Slurm jobs (array tasks
             included) it counts toward the student's MaxSubmitJobs;
  aside      a map of 30 x `sleep 2` (`--time 5m`) alone, and the same
             map while the other student's one call of `sleep 1` comes
             10 s after the map's first call started: the map's span with
             it against its span alone plus that call's run (goal: within
             1.1x: stepping aside idles no node beyond Slurm's tick), and
             the other student's wait against what the map's current
             call still had to run.

The maps run as $BENCH_MAP_USER (default delegate-load0), the other student
is $BENCH_OTHER_USER (default delegate-load1): accounts of the course, not
admins. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import turnover

USER = os.environ.get("BENCH_MAP_USER", "delegate-load0")
OTHER = os.environ.get("BENCH_OTHER_USER", "delegate-load1")


def as_user(user: str, *args: str, timeout: float = 1200) -> str:
    r = subprocess.run(["runuser", "-u", user, "--", *args], capture_output=True, text=True, timeout=timeout,
                       cwd="/tmp")  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"{user}: {' '.join(args)}: {r.stderr.strip()[-400:]}")
    return r.stdout


def submit(user: str, *args: str) -> list[dict]:
    out = json.loads(as_user(user, "delegate", "submit", "--json", *args))
    return out if isinstance(out, list) else [out]


def statuses(user: str, ids: list[str]) -> list[dict]:
    st = json.loads(as_user(user, "delegate", "status", "--json", *ids))
    return st if isinstance(st, list) else [st]


def idle() -> None:
    """Until Slurm runs and queues nothing."""
    for _ in range(600):
        if not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
            return
        time.sleep(0.5)
    raise RuntimeError("the cluster never became idle")


def timed_map(calls: int, limit: str) -> float:
    idle()
    t0 = time.perf_counter()
    ids = [j["id"] for j in submit(USER, "--count", str(calls), "--time", limit, "--", "true")]
    as_user(USER, "delegate", "wait", *ids)
    wall = time.perf_counter() - t0
    bad = [s for s in statuses(USER, ids) if s["state"] != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} calls did not complete: {bad[0]}")
    return wall


def other_student_waits() -> dict:
    """A map of 5 calls of 3 s; the other student submits once the first
    runs. Returns the wait, and how long the map's call still ran then."""
    idle()
    ids = [j["id"] for j in submit(USER, "--count", "5", "--time", "1m", "--", "sleep", "3")]
    while statuses(USER, ids[:1])[0]["state"] != "running":
        time.sleep(0.05)
    t_sub = time.time()
    other = submit(OTHER, "--time", "1m", "--", "true")[0]["id"]
    as_user(OTHER, "delegate", "wait", other)
    o = statuses(OTHER, [other])[0]
    as_user(USER, "delegate", "wait", *ids)
    st = statuses(USER, ids)
    current = next(s for s in st if s["started_ms"] / 1000 <= t_sub <= s["finished_ms"] / 1000)
    return {
        "waited": o["started_ms"] / 1000 - t_sub,
        "current_left": current["finished_ms"] / 1000 - t_sub,
        "map_done_after": max(s["finished_ms"] for s in st) / 1000 - t_sub,
    }


def map_of_sleeps(other_after: float | None) -> dict:
    """A map of 30 x `sleep 2`, alone or with the other student's `sleep 1`
    submitted `other_after` seconds after the map's first call started
    (the schedule of the figure, not a wait for a state). Returns the
    map's span (submit to its last call done) and, with the other call,
    that call's wait, its run and what the map's current call had left."""
    idle()
    t0 = time.time()
    ids = [j["id"] for j in submit(USER, "--count", "30", "--time", "5m", "--", "sleep", "2")]
    out: dict = {}
    if other_after is not None:
        while statuses(USER, ids[:1])[0]["state"] == "pending":
            time.sleep(0.05)
        time.sleep(other_after)
        t_sub = time.time()
        other = submit(OTHER, "--time", "1m", "--", "sleep", "1")[0]["id"]
        as_user(OTHER, "delegate", "wait", other)
        o = statuses(OTHER, [other])[0]
        out["other_waited"] = o["started_ms"] / 1000 - t_sub
        out["other_ran"] = (o["finished_ms"] - o["started_ms"]) / 1000
    as_user(USER, "delegate", "wait", *ids)
    st = statuses(USER, ids)
    bad = [s for s in st if s["state"] != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} calls of the map did not complete: {bad[0]}")
    out["span"] = max(s["finished_ms"] for s in st) / 1000 - t0
    if other_after is not None:
        current = [s for s in st if s["started_ms"] / 1000 <= t_sub <= s["finished_ms"] / 1000]
        out["current_left"] = current[0]["finished_ms"] / 1000 - t_sub if current else 0.0
    return out


def jobs_of_a_map(calls: int) -> int:
    idle()
    handles = submit(USER, "--hold", "--count", str(calls), "--time", "1m", "--", "true")
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-u", USER], capture_output=True, text=True).stdout
        return len(out.splitlines())
    finally:
        # (the map's calls end cancelled with their allocations)
        subprocess.run(["scancel", handles[0]["slurm_id"]], check=False)
        subprocess.run(["runuser", "-u", USER, "--", "delegate", "cancel", *[h["id"] for h in handles]],
                       capture_output=True, cwd="/tmp", check=False)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()
    turnover.USER = USER
    hc = turnover.sandbox_host_config()
    res = {"calls": a.calls, "date": time.strftime("%Y-%m-%d")}
    res["map_1m"] = timed_map(a.calls, "1m")
    res["map_5m"] = timed_map(a.calls, "5m")
    res["floor"] = turnover.floor(hc, a.calls)["total"] * a.calls
    res["waits"] = other_student_waits()
    res["jobs_1000"] = jobs_of_a_map(1000)
    res["aside"] = {"alone": map_of_sleeps(None), "with_other": map_of_sleeps(10.0)}
    w = res["waits"]
    alone, both = res["aside"]["alone"], res["aside"]["with_other"]
    aside = both["span"] / (alone["span"] + both["other_ran"])
    rows = [
        (f"map of {a.calls} true, --time 5m", f"{res['map_5m']:.1f} s", f"{res['map_5m'] / res['map_1m']:.2f}x --time 1m ({res['map_1m']:.1f} s)", "<= 1.1x"),
        (f"  against {a.calls} container lifecycles", f"{res['floor']:.1f} s", f"{res['map_5m'] / res['floor']:.2f}x", "<= 1.2x"),
        ("another student's call, submit to start", f"{w['waited']:.1f} s", f"the map's call had {w['current_left']:.1f} s left", "that + tick"),
        ("  the map of 5 x 3 s done after that submit", f"{w['map_done_after']:.1f} s", "(requeued, resumed)", ""),
        ("Slurm jobs of a held map of 1,000", str(res["jobs_1000"]), "toward MaxSubmitJobs", "a handful"),
        ("map of 30 x sleep 2 with another's call 10 s in", f"{both['span']:.1f} s", f"{aside:.2f}x alone ({alone['span']:.1f} s) + that call ({both['other_ran']:.1f} s)", "<= 1.1x"),
        ("  the other student's call, submit to start", f"{both['other_waited']:.1f} s", f"the map's call had {both['current_left']:.1f} s left", "<= that"),
    ]  # fmt: skip
    for r in rows:
        print(f"{r[0]:46s} {r[1]:>9s}  {r[2]:42s} {r[3]}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
