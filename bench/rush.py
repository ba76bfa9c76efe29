"""The deadline rush on the stack (issues 12 and 53), driven by bench/rush.sh.

    rush.py student PLAN TOKEN OUT   on the user node, as one student: wait
                                     for the plan's moment, do its work,
                                     write what each call did (JSON) to OUT
    rush.py phase NAME OUTDIR        on the host, as root: one phase (every
                                     student by the seed's schedule, with or
                                     without the flooder) through `docker
                                     exec` into the user node; sdiag, CPU
                                     and Slurm's records around it
    rush.py report OUTDIR            figures of both phases, ratios of the
                                     rush against the quiet baseline, a plot
                                     when matplotlib is there

What a student does before a deadline, at a moment of the window drawn
from RUSH_SEED (the same schedule in both phases): a map of 10 Python calls
of 1 s (one submission, as CFiddle's run() of an arg_map and Executor.map
make it), its results awaited, then one to three single calls of 1-3 s in
turn, one through delegate.Executor, the others from Python or the CLI. The
flooder submits RUSH_FLOOD calls of `true` in submissions of 100 as the
window opens. Every call returns or prints a token of its own, so
"completed exactly once" is checked against the outputs, not only the
states. Benchmarks print figures; nothing here asserts on time.

The work is the course's by default; RUSH_MAP_CALLS (10), RUSH_CALL_SECS
(1: a map call's length, and the scale of the single calls' 1-3 s) and
RUSH_MAX_SINGLES (3) make it smaller, as the CI's short rush does
(tests/cluster/test_rush.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


# --------------------------------------------------------------- student side
def _sleep_and_tag(token: str, secs: float) -> str:
    import time as t

    t.sleep(secs)
    return token


def _status(ids: list[str]) -> list[dict]:
    r = subprocess.run(["delegate", "--json", "status", *ids], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"delegate status failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def _cli_wait(ids: list[str]) -> None:
    # `delegate wait` exits with the job's code; a failure shows in the states.
    for i in range(0, len(ids), 200):
        subprocess.run(["delegate", "wait", *ids[i : i + 200]], capture_output=True, timeout=7200)


def _cli_outputs(ids: list[str]) -> dict[str, str]:
    out = {}
    for j in ids:
        r = subprocess.run(["delegate", "logs", j], capture_output=True, text=True, timeout=120)
        out[j] = r.stdout
    return out


def _py_calls(futs, toks) -> list[dict]:
    calls = []
    for tk, f in zip(toks, futs, strict=True):
        try:
            got = f.result()
        except Exception as e:  # noqa: BLE001 - reported, not raised
            got = f"error: {type(e).__name__}: {e}"
        calls.append({"id": f.job_id, "want": tk, "got": str(got), "what": "py"})
    return calls


def _cli_calls(token: str, n: int, per: int, cmd_of) -> list[dict]:
    ids: list[str] = []
    want: list[str] = []
    for start in range(0, n, per):
        cnt = min(per, n - start)
        args = ["delegate", "submit", "--time", "10m"]
        if cnt > 1:
            args += ["--count", str(cnt)]
        r = subprocess.run([*args, "--", *cmd_of(start)], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"submit failed: {r.stderr.strip()[-500:]}")
        got = r.stdout.split()
        ids += got
        want += [f"{token}-{start + i}" for i in range(len(got))]
    _cli_wait(ids)
    outs = _cli_outputs(ids)
    return [
        {"id": j, "want": w, "got": outs[j].strip(), "what": "cli"} for j, w in zip(ids, want, strict=True)
    ]


def student(plan_json: str, token: str, out: str) -> None:
    """One student's work by PLAN (JSON: `at`, the epoch second to start;
    `kind`, "student" or "flood"; `map` and `map_secs`, the map's calls and
    their length; `singles`, the single calls after the map, each "py",
    "cli" or "executor"; `secs`, their lengths): a map of `map` (10)
    Python calls of `map_secs` (1 s) (one submission, as CFiddle's run() of an arg_map
    and Executor.map make it), its results awaited, then each single call
    in turn, awaited; or, the flooder, RUSH_FLOOD calls of `true` in
    submissions of 100."""
    plan = json.loads(plan_json)
    time.sleep(max(0.0, plan["at"] - time.time()))
    t0 = time.time()
    calls: list[dict] = []
    if plan["kind"] == "flood":
        n = int(os.environ.get("RUSH_FLOOD", "2000"))
        calls = _cli_calls(
            token, n, 100, lambda start: ["sh", "-c", f"echo {token}-$(({start} + $DELEGATE_INDEX))"]
        )
    else:
        import delegate

        toks = [f"{token}-map-{i}" for i in range(plan.get("map", 10))]
        futs = delegate._submit_many(
            _sleep_and_tag, [((tk, plan.get("map_secs", 1.0)), {}) for tk in toks], {"time": "10m"}
        )
        calls += _py_calls(futs, toks)
        for c in calls:
            c["what"] = "map"
        for i, (what, secs) in enumerate(zip(plan["singles"], plan["secs"], strict=True)):
            tk = f"{token}-{i}"
            if what == "py":
                calls += _py_calls([delegate.remote(_sleep_and_tag, time="10m").submit(tk, secs)], [tk])
            elif what == "executor":
                with delegate.Executor(time="10m") as ex:
                    calls += _py_calls([ex.submit(_sleep_and_tag, tk, secs)], [tk])
                calls[-1]["what"] = "executor"
            else:
                one = _cli_calls(
                    token, 1, 1, lambda _s, secs=secs, tk=tk: ["sh", "-c", f"sleep {secs:.2f}; echo {tk}"]
                )
                one[0]["want"] = tk
                calls += one
    st = {s["id"]: s for s in _status([c["id"] for c in calls])}
    for c in calls:
        s = st.get(c["id"], {})
        c.update(
            state=s.get("state"),
            reason=s.get("reason"),
            slurm_id=s.get("slurm_id"),
            submitted_ms=s.get("submitted_ms"),
            started_ms=s.get("started_ms"),
            finished_ms=s.get("finished_ms"),
        )
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path(out).write_text(
        json.dumps(
            {
                "kind": plan["kind"],
                "token": token,
                "plan": plan,
                "t0": t0,
                "t1": time.time(),
                "rss_kb": rss_kb,
                "calls": calls,
            }
        )
    )


# ------------------------------------------------------------------ host side
STACK = os.environ.get("DELEGATE_STACK_NAME", "delegate-rush")
HOME = os.environ.get("DELEGATE_STACK_HOME", "/srv/delegate-rush/home")


def _cid(service: str) -> str:
    r = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={STACK}_{service}"],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = r.stdout.split()
    if not ids:
        raise SystemExit(f"service {STACK}_{service} has no running container")
    return ids[0]


def _sdiag() -> tuple[float, int, dict[str, int]]:
    """(time, total RPCs slurmctld served so far, the count per message type)."""
    r = subprocess.run(["docker", "exec", _cid("head"), "sdiag"], capture_output=True, text=True, check=True)
    types: dict[str, int] = {}
    in_types = False
    for line in r.stdout.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            in_types = True
            continue
        if line.startswith("Remote Procedure Call statistics by user"):
            break
        if in_types and "count:" in line:
            types[line.split()[0]] = int(line.split("count:")[1].split()[0])
    return time.time(), sum(types.values()), types


# The RPCs of clients following their jobs: the client's `squeue --local
# --user` (one REQUEST_JOB_USER_INFO and one REQUEST_PARTITION_INFO each).
# Not theirs: the workers' agents check each call's job with `squeue -j`
# (REQUEST_JOB_INFO_SINGLE, with REQUEST_FED_INFO), submissions (sbatch, the
# plan's sinfo) and the nodes' own messages (launch, epilog, completion).
STATUS_TYPES = ("REQUEST_JOB_USER_INFO",)


def status_rpcs(first: dict[str, int], last: dict[str, int]) -> int:
    """The RPCs of following jobs between two sdiag samples (squeue's
    partition query counted once per squeue)."""
    d = {k: last.get(k, 0) - first.get(k, 0) for k in set(first) | set(last)}
    squeues = d.get("REQUEST_JOB_USER_INFO", 0)
    return sum(d.get(k, 0) for k in STATUS_TYPES) + min(squeues, d.get("REQUEST_PARTITION_INFO", 0))


def _cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of this machine so far (/proc/stat): the
    stack's workers, head and sandboxes all share its cores."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v) - idle) / hz, sum(v) / hz


def _parts_cpu() -> dict[str, float]:
    """CPU seconds so far by part of the stack, from the cgroup v1 cpuacct
    hierarchy Docker keeps (empty when it is not there): each stack
    service's container (workers, head, user node, databases: slurmd,
    slurmstepd, the agent and runner, the epilog, slurmctld, the clients),
    and "containers", every container of the engine together (cgroup v1
    charges a removed container's usage to its parent, so the sandboxes of
    the phase stay counted there after their removal)."""
    root = Path("/sys/fs/cgroup/cpuacct/docker")
    if not (root / "cpuacct.usage").exists():
        return {}
    r = subprocess.run(
        ["docker", "ps", "--no-trunc", "--filter", f"name={STACK}_",
         "--format", '{{.ID}} {{.Label "com.docker.swarm.service.name"}}'],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    out = {"containers": int((root / "cpuacct.usage").read_text()) / 1e9}
    # This script's own docker CLI processes (each student's `docker exec`,
    # sdiag's), reaped by now: counted apart from the engine.
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["host:the bench's docker CLI"] = ru.ru_utime + ru.ru_stime
    # The engine's long-lived daemons by their own counters (/proc/PID/stat
    # utime + stime); their per-container shims and runc come and go and
    # stay in the host's remainder.
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        if comm in ("dockerd", "containerd"):
            f = stat[stat.rfind(")") + 2 :].split()
            out[f"host:{comm}"] = out.get(f"host:{comm}", 0.0) + (int(f[11]) + int(f[12])) / tick
    for line in r.stdout.splitlines():
        cid, _, svc = line.partition(" ")
        f = root / cid / "cpuacct.usage"
        if svc and f.exists():
            part = svc.removeprefix(f"{STACK}_")
            part = "workers" if part.startswith("worker") else part
            out[part] = out.get(part, 0.0) + int(f.read_text()) / 1e9
    return out


def plans(users: list[str], flooder: str, seed: int, window: float, start: float) -> dict[str, dict]:
    """Each student's plan, the same for a seed: a moment in the window,
    then one to three single calls of 1-3 s after the map, one of them
    through delegate.Executor, the others from Python or the CLI; the
    flooder (when there is one) starts with the window."""
    rnd = random.Random(seed)
    most = int(os.environ.get("RUSH_MAX_SINGLES", "3"))
    scale = float(os.environ.get("RUSH_CALL_SECS", "1"))
    calls = int(os.environ.get("RUSH_MAP_CALLS", "10"))
    out = {}
    for u in users:
        n = rnd.randint(1, most)
        singles = [rnd.choice(("py", "cli")) for _ in range(n)]
        singles[rnd.randrange(n)] = "executor"
        out[u] = {
            "kind": "student",
            "at": start + rnd.uniform(0, window),
            "map": calls,
            "map_secs": scale,
            "singles": singles,
            "secs": [round(rnd.uniform(1, 3) * scale, 2) for _ in range(n)],
        }
    if flooder:
        out[flooder] = {"kind": "flood", "at": start, "singles": [], "secs": []}
    return out


def _cgroup_file(service: str, name: str) -> Path | None:
    """A file of a service's container in the cgroup v1 memory hierarchy."""
    try:
        cid = subprocess.run(
            ["docker", "inspect", "-f", "{{.Id}}", _cid(service)], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (subprocess.CalledProcessError, SystemExit):
        return None
    f = Path("/sys/fs/cgroup/memory/docker") / cid / name
    return f if f.exists() else None


def _sacct_allocations(since: float) -> list[list[str]]:
    """Slurm's own records of every run of the phase's allocations
    (`sacct --duplicates`: a map's allocation that stepped aside was
    requeued and ran again, each run a record of its own): id, submit,
    start, end (epoch seconds) and node list."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 5))
    r = subprocess.run(
        ["docker", "exec", "-e", "SLURM_TIME_FORMAT=%s", _cid("head"), "sacct", "-a", "-X", "-D", "-n", "-P",
         "-S", start, "-E", "now", "-o", "JobIDRaw,Submit,Start,End,NodeList"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    return [line.split("|") for line in r.stdout.splitlines() if line.count("|") == 4]


def _sacct_first_starts(since: float) -> dict[str, int]:
    """Each allocation's first start (epoch seconds), from every run Slurm
    recorded (`sacct --duplicates`): a map's allocation that stepped aside
    was requeued and started again, and its one record without duplicates
    carries its last start only."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 5))
    r = subprocess.run(
        ["docker", "exec", "-e", "SLURM_TIME_FORMAT=%s", _cid("head"), "sacct", "-a", "-X", "-D", "-n", "-P",
         "-S", start, "-E", "now", "-o", "JobIDRaw,Start"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    first: dict[str, int] = {}
    for line in r.stdout.splitlines():
        job, _, at = line.partition("|")
        if at.strip().isdigit():
            first[job] = min(first.get(job, int(at)), int(at))
    return first


def _expected_starts() -> tuple[float, dict[str, int]]:
    """Slurm's expected start of each waiting job now (squeue's %S, the
    estimate a waiting student's line says in minutes: issue 56), by job
    id, as root on the manager."""
    at = time.time()
    r = subprocess.run(
        ["docker", "exec", "-e", "SLURM_TIME_FORMAT=%s", _cid("head"), "squeue", "-h", "-r", "-t", "PD",
         "-o", "%A|%S"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    out = {}
    for line in r.stdout.splitlines():
        job, _, start = line.partition("|")
        if start.strip().isdigit() and int(start) > 0:
            out[job.strip()] = int(start)
    return at, out


def _helper_starts() -> tuple[float, dict[str, int]]:
    """The place helper's likely start of each waiting job now (the
    estimate a waiting student's line says when the helper made one: issue
    56), by job id as squeue --array prints it, asked as root on the user
    node (`delegate-place --ask`: root is told of every job)."""
    at = time.time()
    r = subprocess.run(
        ["docker", "exec", _cid("user"), "delegate-place", "--ask"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    # (the helper names an array's element `123_4`, sacct's JobIDRaw its
    # own job id: squeue on the manager says which is which while it waits)
    raw = subprocess.run(
        ["docker", "exec", _cid("head"), "squeue", "-h", "-r", "-t", "PD", "-o", "%i|%A"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    ids = dict(line.split("|", 1) for line in raw.stdout.splitlines() if line.count("|") == 1)
    out = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[2].isdigit():
            out[ids.get(f[0], f[0]).strip()] = int(f[2])
    return at, out


def estimate_errors(
    first_seen: dict[str, list[float]],
    allocations: list[list[str]],
    prefix: str = "",
    first_starts: dict[str, int] | None = None,
) -> dict:
    """How far off the expected starts were: for each job that had one
    while it waited (the first one seen), its first start (`first_starts`,
    else its start in `allocations`, sacct's last) minus that estimate, in
    seconds (negative: it started earlier). A job is named by its own job
    id (sacct's JobIDRaw, squeue's %A); `prefix` names the source in the
    keys."""
    started = {}
    for job, _submit, start, _end, _nodes in allocations:
        if start.strip().isdigit():
            started[job] = int(start)
    started.update(first_starts or {})
    signed = [started[j] - est for j, (_at, est) in first_seen.items() if j in started]
    absolute = [abs(x) for x in signed]
    return {
        f"{prefix}estimates": len(signed),
        f"{prefix}estimate_abs_err_p50": _pct(absolute, 0.5),
        f"{prefix}estimate_abs_err_p90": _pct(absolute, 0.9),
        f"{prefix}estimate_signed_err_p50": _pct(signed, 0.5),
    }


def phase(name: str, outdir: str) -> None:
    users = os.environ["RUSH_STUDENTS_LIST"].split()
    flooder = os.environ.get("RUSH_FLOODER", "") if name == "rush" else ""
    script = os.environ["RUSH_SCRIPT"]  # this file, readable on the user node
    seed = int(os.environ.get("RUSH_SEED", "1"))
    window = float(os.environ.get("RUSH_WINDOW", "180"))
    user_cid = _cid("user")
    res_dir = Path(HOME) / ".rush" / name
    res_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(res_dir, 0o1777)
    os.chmod(res_dir.parent, 0o755)
    # (the students' processes start first; the window opens when all are up)
    start = time.time() + 15 + len(users) * 0.05
    plan = plans(users, flooder, seed, window, start)

    def one(u: str) -> tuple[str, int, str]:
        out = res_dir / f"{u}.json"
        out.unlink(missing_ok=True)
        cmd = [
            "docker", "exec", "-u", u, "-w", f"{HOME}/{u}", "-e", f"HOME={HOME}/{u}", "-e", f"USER={u}",
            # the student's own Slurm configuration (their own munged), as the hub gives it
            "-e", f"SLURM_CONF=/etc/slurm/users/{u}/slurm.conf",
            "-e", f"RUSH_FLOOD={os.environ.get('RUSH_FLOOD', '2000')}", user_cid,
            "/opt/delegate/venv/bin/python", script, "student", json.dumps(plan[u]), f"{name}-{u}", str(out),
        ]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
        return u, r.returncode, r.stderr[-800:]

    head_peak = _cgroup_file("head", "memory.max_usage_in_bytes")
    if head_peak:
        head_peak.write_text("0")
    rpc0 = _sdiag()
    cpu0 = _cpu()
    parts0 = _parts_cpu()
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=len(plan) + 1) as pool:
        futs = [pool.submit(one, u) for u in plan]
        samples = []
        first_seen: dict[str, list[float]] = {}
        first_helper: dict[str, list[float]] = {}
        while not all(f.done() for f in futs):
            time.sleep(10)
            samples.append(_sdiag())
            at, starts = _expected_starts()
            for job, est in starts.items():
                first_seen.setdefault(job, [at, est])
            at, starts = _helper_starts()
            for job, est in starts.items():
                first_helper.setdefault(job, [at, est])
        problems = [f.result() for f in futs if f.result()[1] != 0]
    t1 = time.time()
    cpu1 = _cpu()
    parts1 = _parts_cpu()
    rpc1 = _sdiag()
    results = []
    for u in plan:
        p = res_dir / f"{u}.json"
        if p.exists():
            results.append(json.loads(p.read_text()))
    meta = {
        "phase": name,
        "t0": t0,
        "t1": t1,
        "window_start": start,
        "window": window,
        "seed": seed,
        "rpc": [rpc0, *samples, rpc1],
        "cpu": [cpu0, cpu1],
        "parts_cpu": [parts0, parts1],
        "head_mem_peak": int(head_peak.read_text()) if head_peak else None,
        "allocations": _sacct_allocations(t0),
        "first_starts": _sacct_first_starts(t0),
        "first_estimates": first_seen,
        "first_helper_estimates": first_helper,
        "lifecycle_s": float(os.environ.get("RUSH_LIFECYCLE_S", "nan")),
        "cpus": os.cpu_count(),
        "problems": problems,
        "students": len(users),
        "flooder": flooder,
        "workers": int(os.environ.get("RUSH_WORKERS", "12")),
    }
    Path(outdir, f"phase-{name}.json").write_text(json.dumps({"meta": meta, "students": results}))
    for u, rc, err in problems:
        print(f"rush: {u} exited {rc}: {err}", file=sys.stderr)


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def jain(xs: list[float]) -> float:
    """Jain's fairness index of xs: 1 when all are equal, 1/n at worst."""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else float("nan")


def student_figures(data: dict) -> list[dict]:
    """For each student (not the flooder): the first submit, the time to
    the first and to the last result from it, their own work (the calls'
    run time) and their slowdown (span / work)."""
    out = []
    for s in data["students"]:
        if s["kind"] == "flood":
            continue
        c = [c for c in s["calls"] if c["submitted_ms"] and c["finished_ms"]]
        if not c:
            continue
        first_submit = min(x["submitted_ms"] for x in c) / 1000
        work = sum((x["finished_ms"] - x["started_ms"]) / 1000 for x in c if x["started_ms"])
        span = max(x["finished_ms"] for x in c) / 1000 - first_submit
        out.append(
            {
                "token": s["token"],
                "first_submit": first_submit,
                "first": min(x["finished_ms"] for x in c) / 1000 - first_submit,
                "last": span,
                "first_call": min(c, key=lambda x: x["finished_ms"]),
                "work": work,
                "slowdown": span / work if work else float("nan"),
                "rss_kb": s.get("rss_kb"),
            }
        )
    return out


def round_robin_bound(students: list[dict], workers: int, call_s: float) -> list[float]:
    """Each student's time to their first result if the workers served the
    students with work at their first submit one call each in turn: the
    rounds before theirs (the students present, themselves included, over
    the workers) of the phase's mean node time per call, then their own
    first call."""
    out = []
    for s in students:
        present = sum(
            1 for o in students if o["first_submit"] <= s["first_submit"] < o["first_submit"] + o["last"]
        )
        fc = s["first_call"]
        own = (fc["finished_ms"] - (fc["started_ms"] or fc["finished_ms"])) / 1000
        out.append((math.ceil(max(present, 1) / workers) - 1) * call_s + own)
    return out


def work_floor(work: float, workers: int, since: float, lost_at: float | None) -> float:
    """The drain's floor from the calls' work: work / workers, or, with one
    worker lost at `lost_at` (epoch seconds; `since` is the first submit),
    every worker until then and one fewer after."""
    if lost_at is None or workers < 2:
        return work / workers
    before = max(lost_at - since, 0.0)
    if work <= workers * before:
        return work / workers
    return before + (work - workers * before) / (workers - 1)


def _at(allocs: list[list[str]], until: float):
    """From Slurm's records of every run of the allocations (sacct
    --duplicates: id, submit, start, end, node list; an allocation that was
    requeued has a record per run), a function of a moment: (the nodes with
    an allocation running, the allocations waiting: submitted, not ended,
    none of their runs running then, as before their first start and
    between two runs)."""

    def num(v: str) -> float | None:
        return float(v) if v.replace(".", "", 1).isdigit() else None

    runs: dict[str, list[tuple[float | None, float | None, float | None, str]]] = {}
    for a in allocs:
        runs.setdefault(a[0], []).append((num(a[1]), num(a[2]), num(a[3]), a[4]))

    def active(st: float | None, en: float | None, t: float) -> bool:
        return st is not None and st <= t < (en or until)

    def state(t: float) -> tuple[set[str], int]:
        running = {
            n
            for rs in runs.values()
            for _, st, en, n in rs
            if active(st, en, t) and n not in ("", "None assigned")
        }
        waiting = 0
        for rs in runs.values():
            subs = [sub for sub, _, _, _ in rs if sub is not None]
            ends = [en for _, st, en, _ in rs if st is not None]
            ended = len(ends) == len(rs) and all(en is not None for en in ends) and max(ends) <= t
            if subs and min(subs) <= t and not ended and not any(active(st, en, t) for _, st, en, _ in rs):
                waiting += 1
        return running, waiting

    return state


def idle_while_waiting(
    allocs: list[list[str]], workers: int, since: float, until: float, lost: tuple[str, float] | None = None
) -> float:
    """Node-seconds idle while work waited, from Slurm's records: at each
    second, the idle nodes (workers less those with an allocation) up to
    the allocations waiting (submitted, not started). A worker `lost`
    (its node, the moment its machine died) is no node from then on: not
    idle, and what Slurm still counts running there is not busy."""
    state = _at(allocs, until)
    idle = 0.0
    t = since
    while t < until:
        running, waiting = state(t)
        up = workers
        if lost is not None and t >= lost[1]:
            up -= 1
            running = running - {lost[0]}
        idle += min(max(up - len(running), 0), waiting)
        t += 1
    return idle


def timeline(allocs: list[list[str]], since: float, until: float, step: float = 5) -> list[list[float]]:
    """[seconds since `since`, allocations waiting, nodes busy] every `step`
    seconds, from Slurm's records: the plot's queue and busy nodes."""
    state = _at(allocs, until)
    out = []
    t = since
    while t < until:
        running, waiting = state(t)
        out.append([round(t - since, 1), waiting, len(running)])
        t += step
    return out


def summarize(data: dict) -> dict:
    meta = data["meta"]
    calls_all = [(s["kind"], s["token"], c) for s in data["students"] for c in s["calls"]]
    ok = [c for _, _, c in calls_all if c["state"] == "completed" and c["got"].strip() == c["want"]]
    wrong = [(t, c) for _, t, c in calls_all if c not in ok]
    others = [(k, c) for k, _, c in calls_all if k != "flood"]
    waits = [(c["started_ms"] - c["submitted_ms"]) / 1000 for _, c in others if c["started_ms"]]
    per_student = {}
    for s in data["students"]:
        if s["kind"] == "flood":
            continue
        w = [(c["started_ms"] - c["submitted_ms"]) / 1000 for c in s["calls"] if c["started_ms"]]
        if w:
            per_student[s["token"]] = max(w)
    # Node-time of the work itself: each call's sandbox run (started ->
    # finished), all calls of the phase, flooder included.
    work = sum(
        (c["finished_ms"] - c["started_ms"]) / 1000
        for _, _, c in calls_all
        if c["started_ms"] and c["finished_ms"]
    )
    first = min((c["submitted_ms"] for _, _, c in calls_all if c["submitted_ms"]), default=0) / 1000
    last = max((c["finished_ms"] for _, _, c in calls_all if c["finished_ms"]), default=0) / 1000
    drain = last - first
    killed = meta.get("killed")
    ideal = work_floor(work, meta["workers"], first, killed["at"] if killed else None)
    # Calls that ran again after their machine was lost (the call's reason
    # names the attempt: "ran again on worker2 (attempt 2): worker1 was lost").
    ran_again = [c for _, _, c in calls_all if "ran again on" in (c.get("reason") or "")]
    rpc = meta["rpc"]
    span = max(rpc[-1][0] - rpc[0][0], 1e-9)
    rate = (rpc[-1][1] - rpc[0][1]) / span
    typed = len(rpc[0]) > 2
    status_rate = status_rpcs(rpc[0][2], rpc[-1][2]) / span if typed else float("nan")
    status_peak = (
        max(
            (status_rpcs(a[2], b[2]) / max(b[0] - a[0], 1e-9) for a, b in zip(rpc, rpc[1:], strict=False)),
            default=status_rate,
        )
        if typed
        else float("nan")
    )
    by_type = (
        sorted(((k, v - rpc[0][2].get(k, 0)) for k, v in rpc[-1][2].items()), key=lambda kv: -kv[1])[:6]
        if typed
        else []
    )
    peak = max(
        ((b[1] - a[1]) / max(b[0] - a[0], 1e-9) for a, b in zip(rpc, rpc[1:], strict=False)),
        default=rate,
    )
    slurm_jobs = {c["slurm_id"] for _, _, c in calls_all if c.get("slurm_id")}
    # How busy the machine's cores were: when they are saturated the drain
    # is bounded by this machine (busy CPU seconds / cores), whatever the
    # scheduling.
    cpu = meta.get("cpu")
    busy_s = cpu[1][0] - cpu[0][0] if cpu else float("nan")
    cpu_total_s = cpu[1][1] - cpu[0][1] if cpu else float("nan")
    # Where those CPU seconds went: the stack's services by their containers,
    # the sandboxes (every container's usage but the services'), the
    # engine's daemons (dockerd, containerd), this script's own docker CLI
    # processes, and the rest of the host (the containers' shims and runc).
    parts: dict[str, float] = {}
    pc = meta.get("parts_cpu")
    if pc and pc[0] and pc[1]:
        d = {k: pc[1].get(k, 0.0) - pc[0].get(k, 0.0) for k in pc[1]}
        containers = d.pop("containers", 0.0)
        daemons = {k.removeprefix("host:"): d.pop(k) for k in [k for k in d if k.startswith("host:")]}
        parts = dict(d)
        parts["sandboxes"] = max(containers - sum(d.values()), 0.0)
        parts.update(daemons)
        parts["host: shims, runc, rest"] = max(busy_s - containers - sum(daemons.values()), 0.0)
    studs = student_figures(data)
    call_s = (work / len([1 for _, _, c in calls_all if c["started_ms"]])) if work else 0.0
    if not math.isnan(meta.get("lifecycle_s", float("nan"))):
        call_s += meta["lifecycle_s"]
    bound = round_robin_bound(studs, meta["workers"], call_s)
    first_ratio = [s["first"] / b for s, b in zip(studs, bound, strict=True) if b > 0]
    lifecycle_floor = work_floor(
        len(calls_all) * meta.get("lifecycle_s", float("nan")),
        meta["workers"],
        first,
        killed["at"] if killed else None,
    )
    floor = max(ideal, lifecycle_floor) if not math.isnan(lifecycle_floor) else ideal
    rss = [s["rss_kb"] / 1024 for s in studs if s.get("rss_kb")]
    idle = (
        idle_while_waiting(
            meta.get("allocations", []),
            meta["workers"],
            first,
            last,
            (killed["worker"], float(killed["at"])) if killed else None,
        )
        if meta.get("allocations")
        else float("nan")
    )
    return {
        "first_p50": _pct([s["first"] for s in studs], 0.5),
        "first_p95": _pct([s["first"] for s in studs], 0.95),
        "first_max": max((s["first"] for s in studs), default=float("nan")),
        "last_p50": _pct([s["last"] for s in studs], 0.5),
        "last_p95": _pct([s["last"] for s in studs], 0.95),
        "last_max": max((s["last"] for s in studs), default=float("nan")),
        "first_vs_round_robin_p95": _pct(first_ratio, 0.95),
        "jain_slowdown": jain([s["slowdown"] for s in studs if not math.isnan(s["slowdown"])]),
        "floor_s": floor,
        "lifecycle_floor_s": lifecycle_floor,
        "drain_vs_floor": drain / floor if floor else float("nan"),
        "idle_node_s_while_waiting": idle,
        "head_mem_peak_mb": meta["head_mem_peak"] / 2**20 if meta.get("head_mem_peak") else float("nan"),
        "head_cpu_s": dict(parts).get("head", float("nan")),
        "client_rss_mb_p50": _pct(rss, 0.5),
        "client_rss_mb_max": max(rss, default=float("nan")),
        "phase": meta["phase"],
        "students": meta["students"],
        "flooder": bool(meta["flooder"]),
        "calls": len(calls_all),
        "calls_ok": len(ok),
        "calls_not_ok": [(t, c["id"], c["state"], c["got"][:80]) for t, c in wrong][:20],
        "machine_killed": killed,
        "ran_again": len(ran_again),
        "ran_again_reasons": sorted({c["reason"] for c in ran_again})[:10],
        "student_calls": len(others),
        "allocations": len(slurm_jobs),
        "wait_p50": _pct(waits, 0.5),
        "wait_p95": _pct(waits, 0.95),
        "wait_max": max(waits, default=float("nan")),
        "per_student_max_p50": _pct(list(per_student.values()), 0.5),
        "per_student_max_p95": _pct(list(per_student.values()), 0.95),
        "per_student_max_max": max(per_student.values(), default=float("nan")),
        "work_s": work,
        "first_submit": first,
        "drain_s": drain,
        "ideal_s": ideal,
        "drain_ratio": drain / ideal if ideal else float("nan"),
        "cpus": meta.get("cpus"),
        "cpu_busy_s": busy_s,
        "cpu_busy_frac": busy_s / cpu_total_s if cpu else float("nan"),
        "cpu_floor_s": busy_s / meta["cpus"] if cpu else float("nan"),
        "cpu_by_part": sorted(parts.items(), key=lambda kv: -kv[1]),
        "rpc_rate": rate,
        "rpc_rate_peak_10s": peak,
        "status_rpc_rate": status_rate,
        "status_rpc_rate_peak_10s": status_peak,
        "rpc_by_type": by_type,
        "waits": waits,
        "timeline": timeline(meta["allocations"], first, last) if meta.get("allocations") and last else [],
        "problems": meta["problems"],
        **estimate_errors(meta.get("first_estimates", {}), meta["allocations"], "", meta.get("first_starts")),
        **estimate_errors(
            meta.get("first_helper_estimates", {}), meta["allocations"], "helper_", meta.get("first_starts")
        ),
    }


def report(outdir: str) -> None:
    out = Path(outdir)
    phases = {}
    for name in ("quiet", "rush"):
        p = out / f"phase-{name}.json"
        if p.exists():
            data = json.loads(p.read_text())
            # (bench/rush.sh --machines --kill-at: which machine it killed, when)
            killed = out / f"killed-{name}.json"
            if killed.exists():
                data["meta"]["killed"] = json.loads(killed.read_text())
            phases[name] = summarize(data)
    print("\n=== the deadline rush (bench/rush.sh) ===")
    for name, s in phases.items():
        flood = " + 1 flooder" if s["flooder"] else ""
        print(
            f"\n[{name}] {s['students']} students{flood}: {s['calls']} calls in {s['allocations']} allocations"
        )
        print(
            f"  completed exactly once: {s['calls_ok']}/{s['calls']}"
            + ("" if not s["calls_not_ok"] else f"  NOT OK: {s['calls_not_ok']}")
        )
        if s["machine_killed"]:
            k = s["machine_killed"]
            print(
                f"  machine {k['machine']} ({k['worker']}) killed {k['at'] - s['first_submit']:.0f} s after the first "
                f"submit: {s['ran_again']} calls ran again on another machine"
                + (f" ({'; '.join(s['ran_again_reasons'][:3])})" if s["ran_again"] else "")
            )
        elif s["ran_again"]:
            print(
                f"  calls that ran again (no machine was killed): {s['ran_again']}: {s['ran_again_reasons'][:3]}"
            )
        print(
            f"  students' calls, wait submit->start: p50 {s['wait_p50']:.1f} s, p95 {s['wait_p95']:.1f} s, "
            f"max {s['wait_max']:.1f} s"
        )
        print(
            f"  per student (their longest wait): p50 {s['per_student_max_p50']:.1f} s, "
            f"p95 {s['per_student_max_p95']:.1f} s, max {s['per_student_max_max']:.1f} s"
        )
        print(
            f"  per student, from their first submit: first result p50 {s['first_p50']:.0f} s, p95 "
            f"{s['first_p95']:.0f} s, max {s['first_max']:.0f} s; last result p50 {s['last_p50']:.0f} s, "
            f"p95 {s['last_p95']:.0f} s, max {s['last_max']:.0f} s"
        )
        print(
            f"  first result against the round-robin bound: p95 x{s['first_vs_round_robin_p95']:.2f} (goal <= 1.5); "
            f"Jain's index of the students' slowdowns {s['jain_slowdown']:.3f} (goal >= 0.9)"
        )
        print(
            f"  drain {s['drain_s']:.0f} s vs the floor {s['floor_s']:.0f} s (work/workers {s['ideal_s']:.0f} s, "
            f"container lifecycle {s['lifecycle_floor_s']:.0f} s): x{s['drain_vs_floor']:.2f} (goal <= 1.15); "
            f"node time idle while work waited {s['idle_node_s_while_waiting']:.0f} node-s"
        )
        print(
            f"  manager (head): {s['head_cpu_s']:.0f} CPU-s, memory peak {s['head_mem_peak_mb']:.0f} MB; "
            f"client memory per student p50 {s['client_rss_mb_p50']:.0f} MB, max {s['client_rss_mb_max']:.0f} MB"
        )
        print(
            f"  drain {s['drain_s']:.0f} s vs work/workers {s['ideal_s']:.0f} s "
            f"(sum of calls' run time {s['work_s']:.0f} s): ratio {s['drain_ratio']:.2f}"
        )
        if s.get("estimates"):
            print(
                f"  Slurm's expected start (a waiting student's 'likely to start within'), first seen per "
                f"job, against its start: |error| p50 {s['estimate_abs_err_p50']:.0f} s, p90 "
                f"{s['estimate_abs_err_p90']:.0f} s over {s['estimates']} jobs; signed p50 "
                f"{s['estimate_signed_err_p50']:.0f} s (negative: earlier than said)"
            )
        if s.get("helper_estimates"):
            print(
                f"  the place helper's likely start (a waiting student's 'likely to start in about'), first seen "
                f"per job, against its start: |error| p50 {s['helper_estimate_abs_err_p50']:.0f} s, p90 "
                f"{s['helper_estimate_abs_err_p90']:.0f} s over {s['helper_estimates']} jobs; signed p50 "
                f"{s['helper_estimate_signed_err_p50']:.0f} s"
            )
        if s.get("cpus"):
            print(
                f"  this machine's {s['cpus']} cores were {s['cpu_busy_frac'] * 100:.0f} % busy over the phase: "
                f"{s['cpu_busy_s']:.0f} CPU-seconds, i.e. at least {s['cpu_floor_s']:.0f} s of drain on these "
                f"cores whatever the scheduling"
            )
        if s.get("cpu_by_part"):
            n = max(s["calls"], 1)
            print(
                "  CPU-seconds by part (per call): "
                + ", ".join(f"{k} {v:.0f} ({v / n:.3f})" for k, v in s["cpu_by_part"])
            )
        print(
            f"  slurmctld RPCs (sdiag): {s['rpc_rate']:.1f}/s over the phase, "
            f"busiest 10 s {s['rpc_rate_peak_10s']:.1f}/s"
        )
        print(
            f"  of which following jobs (squeue, scontrol show job): {s['status_rpc_rate']:.1f}/s, "
            f"busiest 10 s {s['status_rpc_rate_peak_10s']:.1f}/s (goal <= 5/s)"
        )
        print("  by type: " + ", ".join(f"{k} {v}" for k, v in s["rpc_by_type"]))
        for u, rc, err in s["problems"]:
            print(f"  problem: {u} exited {rc}: {err[-300:]}")
    if "quiet" in phases and "rush" in phases:
        q, r = phases["quiet"], phases["rush"]
        print("\n  the flooder's delay on the others (rush / quiet, same students, same run):")
        for k in ("wait_p50", "wait_p95", "wait_max", "first_p95", "last_p50", "last_p95"):
            print(f"    {k}: {r[k]:.1f} s / {q[k]:.1f} s = x{r[k] / q[k] if q[k] else float('nan'):.2f}")
    slim = {k: {kk: vv for kk, vv in v.items() if kk not in ("waits", "timeline")} for k, v in phases.items()}
    (out / "rush.json").write_text(json.dumps(slim, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(no matplotlib: no plot)")
        return
    fig, (ax, ax_q) = plt.subplots(1, 2, figsize=(12, 4))
    for name, s in phases.items():
        w = sorted(s["waits"])
        if w:
            ax.plot(w, [(i + 1) / len(w) for i in range(len(w))], label=f"{name} ({len(w)} calls)")
    ax.set_xlabel("students' calls: wait from submit to start (s)")
    ax.set_ylabel("fraction of calls")
    ax.set_title("Students' waits, quiet vs with a flooder")
    ax.grid(alpha=0.3)
    ax.legend()
    # The queue and the busy nodes over each phase (Slurm's records).
    for name, s in phases.items():
        tl = s.get("timeline") or []
        if tl:
            line = ax_q.plot([p[0] for p in tl], [p[1] for p in tl], label=f"{name}: allocations waiting")
            ax_q.plot([p[0] for p in tl], [p[2] for p in tl], "--", color=line[0].get_color(),
                      label=f"{name}: nodes busy")  # fmt: skip
        k = s.get("machine_killed")
        if k:
            ax_q.axvline(k["at"] - s["first_submit"], color="red", alpha=0.5, label=f"{k['machine']} killed")
    ax_q.set_xlabel("seconds since the phase's first submit")
    ax_q.set_ylabel("count")
    ax_q.set_yscale("symlog")
    ax_q.set_title("Queue length and busy nodes over time")
    ax_q.grid(alpha=0.3)
    ax_q.legend(fontsize=8)
    fig.suptitle("Deadline rush (bench/rush.sh)")
    fig.tight_layout()
    fig.savefig(out / "rush.png", dpi=110)
    print(f"\nplot: {out / 'rush.png'}")


def main(argv: list[str]) -> None:
    if len(argv) >= 4 and argv[0] == "student":
        student(argv[1], argv[2], argv[3])
    elif len(argv) == 3 and argv[0] == "phase":
        phase(argv[1], argv[2])
    elif len(argv) == 2 and argv[0] == "report":
        report(argv[1])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
