#!/usr/bin/env python3
"""Turnover of calls in a shared allocation against the container lifecycle
limit, in one run (issue 18, part 2). Run as root on the single-machine
cluster (./build_cluster.sh --local):

    bench/turnover.py [--calls 40] [--rounds 3] [--out FILE.json]

Each round, alternately:

  floor     the engine's own lifecycle of the sandbox's container, through
            the Docker API as the agent drives it (create, start, wait,
            remove; the same HostConfig as a running sandbox's, `true`),
            --calls times in a row;
  delegate  `delegate submit --count CALLS -- true` as $BENCH_USER (default
            delegate-bench): the calls share allocations, each in its own
            fresh container.

Printed: per call, the engine floor and delegate's turnover (from one call's
outcome to the next one's, inside an allocation), their ratio, and
delegate's per-phase breakdown from the agent's log (the runner's next
request and the agent's checks -> created -> started -> ended -> removed).
Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import time
import urllib.parse
from datetime import datetime
from pathlib import Path

DOCKER_SOCKET = "/var/run/docker.sock"
AGENT_LOG = Path("/var/log/delegate/agent.log")
USER = os.environ.get("BENCH_USER", "delegate-bench")
IMAGE = os.environ.get("BENCH_IMAGE", "delegate-sandbox:latest")


class _Unix(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost", timeout=60)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(DOCKER_SOCKET)


def api(method: str, path: str, body=None):
    c = _Unix()
    c.request(method, "/v1.41" + path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})  # fmt: skip
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status >= 300:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:200]!r}")
    return json.loads(data) if data else None


def as_user(*args: str, timeout: float = 600) -> str:
    r = subprocess.run(["runuser", "-u", USER, "--", *args], capture_output=True, text=True, timeout=timeout,
                       cwd="/tmp")  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()[-400:]}")
    return r.stdout


def sandbox_host_config() -> dict:
    """The HostConfig of a real sandbox: one call held running while it is
    read (so the floor pays exactly what the agent's containers pay)."""
    job = json.loads(as_user("delegate", "submit", "--json", "--", "sleep", "30"))
    job_id = job[0]["id"] if isinstance(job, list) else job["id"]
    try:
        for _ in range(300):
            found = api(
                "GET",
                "/containers/json?filters="
                + urllib.parse.quote(json.dumps({"label": [f"delegate.job={job_id}"]})),
            )
            if found:
                hc = api("GET", f"/containers/{found[0]['Id']}/json")["HostConfig"]
                hc["Mounts"] = [{"Type": "bind", "Source": "/tmp", "Target": "/job"}]
                return hc
            time.sleep(0.2)
        raise RuntimeError("the held call never started")
    finally:
        as_user("delegate", "cancel", job_id)


def floor(hc: dict, n: int) -> dict:
    phases = {"create": [], "start": [], "wait": [], "remove": [], "total": []}
    body = {"Image": IMAGE, "Cmd": ["true"], "User": "65534:65534", "NetworkDisabled": True, "HostConfig": hc}
    for _ in range(n):
        t0 = time.perf_counter()
        cid = api("POST", "/containers/create", body)["Id"]
        t1 = time.perf_counter()
        api("POST", f"/containers/{cid}/start")
        t2 = time.perf_counter()
        api("POST", f"/containers/{cid}/wait")
        t3 = time.perf_counter()
        api("DELETE", f"/containers/{cid}?force=1&v=1")
        t4 = time.perf_counter()
        for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
            phases[k].append(v)
    return {k: statistics.median(v) for k, v in phases.items()}


_LINE = re.compile(r"^(\S+Z)\s+\S+\s+(.*)$")
_EVENTS = (
    ("created", re.compile(r"^job (\S+) \(Slurm job \S+, uid \d+\): created container (\w+)")),
    ("started", re.compile(r"^started container (\w+)")),
    ("ended", re.compile(r"^container (\w+) ended")),
    ("removed", re.compile(r"^removed container (\w+)")),
)


def agent_phases(jobs: set[str], since: int) -> dict:
    """Per-phase medians of this run's calls, from the agent's log."""
    t: dict[str, dict[str, float]] = {}
    cid_job: dict[str, str] = {}
    with AGENT_LOG.open("rb") as f:
        f.seek(since)
        for raw in f:
            m = _LINE.match(raw.decode("utf-8", "replace").rstrip())
            if not m:
                continue
            ts = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            for name, rx in _EVENTS:
                e = rx.match(m.group(2))
                if not e:
                    continue
                if name == "created":
                    if e.group(1) in jobs:
                        cid_job[e.group(2)] = e.group(1)
                        t[e.group(2)] = {"created": ts}
                elif e.group(1) in t:
                    t[e.group(1)][name] = ts
    calls = sorted((v for v in t.values() if len(v) == 4), key=lambda v: v["created"])
    out = {
        "created->started": [c["started"] - c["created"] for c in calls],
        "started->ended": [c["ended"] - c["started"] for c in calls],
        "ended->removed": [c["removed"] - c["ended"] for c in calls],
        # The next call of the same allocation: the runner's outcome and next
        # request, the agent's checks, staging and create.
        "removed->next created": [
            b["created"] - a["removed"]
            for a, b in zip(calls, calls[1:])
            if 0 <= b["created"] - a["removed"] < 1.0
        ],
    }
    return {k: statistics.median(v) if v else None for k, v in out.items()}


def delegate_round(n: int) -> dict:
    since = AGENT_LOG.stat().st_size if AGENT_LOG.exists() else 0
    t0 = time.perf_counter()
    jobs = json.loads(as_user("delegate", "submit", "--count", str(n), "--json", "--", "true"))
    ids = [j["id"] for j in jobs]
    as_user("delegate", "wait", *ids, timeout=1200)
    wall = time.perf_counter() - t0
    st = json.loads(as_user("delegate", "status", "--json", *ids))
    st = st if isinstance(st, list) else [st]
    by_alloc: dict[str, list] = {}
    for s in st:
        if s.get("state") != "completed":
            raise RuntimeError(f"call {s.get('id')} ended {s.get('state')}: {s.get('reason')}")
        by_alloc.setdefault(s["slurm_id"], []).append(s)
    gaps = []
    for calls in by_alloc.values():
        calls.sort(key=lambda s: s["started_ms"])
        gaps += [(b["started_ms"] - a["started_ms"]) / 1000 for a, b in zip(calls, calls[1:])]
    return {
        "wall": wall,
        "per_call": statistics.median(gaps),
        "allocations": len(by_alloc),
        "phases": agent_phases(set(ids), since),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    hc = sandbox_host_config()
    rounds = []
    for r in range(a.rounds):
        f = floor(hc, a.calls)
        d = delegate_round(a.calls)
        rounds.append({"floor": f, "delegate": d})
        print(
            f"round {r + 1}: engine floor {f['total'] * 1000:.0f} ms per container "
            f"(create {f['create'] * 1000:.0f}, start {f['start'] * 1000:.0f}, wait {f['wait'] * 1000:.0f}, "
            f"remove {f['remove'] * 1000:.0f}); delegate {d['per_call'] * 1000:.0f} ms per call "
            f"({d['per_call'] / f['total']:.2f}x the floor), {a.calls} calls in {d['wall']:.1f} s, "
            f"{d['allocations']} allocations",
            flush=True,
        )
    fl = statistics.median(r["floor"]["total"] for r in rounds)
    dl = statistics.median(r["delegate"]["per_call"] for r in rounds)
    print(f"\nmedian of {a.rounds} rounds: delegate {dl * 1000:.0f} ms per call, engine floor {fl * 1000:.0f} ms "
          f"per container: {dl / fl:.2f}x")  # fmt: skip
    print("delegate's phases (median over the run's calls, from the agent's log):")
    for k in rounds[0]["delegate"]["phases"]:
        vals = [r["delegate"]["phases"][k] for r in rounds if r["delegate"]["phases"][k] is not None]
        if vals:
            print(f"  {k:22s} {statistics.median(vals) * 1000:6.0f} ms")
    if a.out:
        Path(a.out).write_text(json.dumps({"calls": a.calls, "rounds": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
