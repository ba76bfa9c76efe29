"""Maps, end to end: the calls of one submission (`delegate submit --count
N`) are pulled by the map's allocations, one per usable node (ONE exclusive
Slurm job on this one-node cluster, `sandbox-runner pull <dir>...`), each
call claimed once and run in its own fresh container with its own output,
state, log and outcome; cancelling one call leaves the others running;
`scancel` of the allocation ends them all; a refused directory fails only
its own call; another student's call waits only for the map's current
call (the allocation requeues itself to step aside).
`DELEGATE_CALLS_PER_ALLOCATION=1` gives back one Slurm job (array element)
per call.

Every call reads `$DELEGATE_INDEX` (set by `submit --count`) to know which
call it is; the waits are generous, the sleeps short.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
from conftest import containers_created_since, containers_with_label, sh

import testlib

TERMINAL = {"completed", "failed", "timed-out", "cancelled", "lost"}
WAITING_REASON = "waiting for an allocation of its map to claim it"
JOB_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{8}$")


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

_SUBMITTED: list[str] = []


@pytest.fixture(autouse=True)
def _no_leftover_allocations():
    """A failing test must not leave a held or sleeping allocation that
    blocks the (only, exclusive) node for the tests after it."""
    _SUBMITTED.clear()
    yield
    sids = sorted({s.split("_")[0] for s in _SUBMITTED})
    if sids:
        sh("scancel", *sids, check=False)


def submit_count(user, n, *cmd, opts=(), env=None):
    """`delegate submit --json --count n`; returns the job ids in order.
    The calls get `--time 1m` unless opts say otherwise: (60 + 30) s each,
    six share one allocation within the site's 10-minute bound."""
    if "--time" not in opts:
        opts = ("--time", "1m", *opts)
    r = run_env(user, env, "submit", "--json", "--count", str(n), *opts, "--", *cmd)
    assert r.returncode == 0, f"submit failed: {r.stderr}"
    handles = json.loads(r.stdout)
    assert isinstance(handles, list) and len(handles) == n, r.stdout
    ids = [h["id"] for h in handles]
    _SUBMITTED.extend(h["slurm_id"] for h in handles)
    assert len(set(ids)) == n, ids
    return ids, handles


def run_env(user, env, *args, timeout=180):
    """Like User.run, with extra environment variables for the client."""
    return user.run(*args, timeout=timeout, env_extra=env)


def statuses(user, jobs):
    r = user.run("status", "--json", *jobs)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    if isinstance(data, dict):
        data = [data]
    by = {d["id"]: d for d in data}
    return [by[j] for j in jobs]


def wait_all(user, jobs, timeout=120):
    r = user.run("wait", "--json", "--timeout", f"{int(timeout)}s", *jobs, timeout=timeout + 30)
    assert r.stdout, f"wait printed nothing: rc={r.returncode} {r.stderr}"
    st = statuses(user, jobs)
    assert all(s["state"] in TERMINAL for s in st), st
    return st


def wait_until(user, jobs, pred, timeout=90, what="the condition"):
    """Polls `delegate status` until pred(statuses) holds; returns them."""
    deadline = time.monotonic() + timeout
    while True:
        st = statuses(user, jobs)
        if pred(st):
            return st
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {st}"
        time.sleep(0.2)


def sacct_states(job_id, *flags, want, timeout=60):
    """The job's states in sacct, polled until `want` is among them:
    slurmctld sends a job's end to slurmdbd on its own schedule, so a
    record read at once may not be there yet."""
    deadline = time.monotonic() + timeout
    while True:
        out = sh("sacct", "-n", "-X", "-P", *flags, "-j", job_id, "-o", "State").stdout
        states = out.split()
        if want in states:
            return states
        assert time.monotonic() < deadline, f"sacct never showed {want} for {job_id}: {states}"
        time.sleep(0.5)


def slurm_id_file(user, job):
    return (user.job_dir(job) / "slurm-id").read_text()


def allocation_of(user, job):
    """The Slurm id (first line of the slurm-id file)."""
    return slurm_id_file(user, job).splitlines()[0].strip()


def stdout_of(user, job):
    return (user.job_dir(job) / "stdout").read_text()


def in_squeue(slurm_id):
    r = sh("squeue", "-h", "-j", slurm_id, "-o", "%i %T", check=False)
    return r.stdout.strip()


def wait_slurm_gone(slurm_id, timeout=60):
    deadline = time.monotonic() + timeout
    while in_squeue(slurm_id):
        assert time.monotonic() < deadline, f"Slurm job {slurm_id} still there: {in_squeue(slurm_id)}"
        time.sleep(0.5)


def first_sleeps(seconds):
    """A command: call 0 sleeps, every call then prints its index."""
    return (
        "sh",
        "-c",
        f'if [ "$DELEGATE_INDEX" = 0 ]; then sleep {seconds}; fi; echo "done-$DELEGATE_INDEX"',
    )


# ---------------------------------------------------------------------------
# One allocation for a --count submission
# ---------------------------------------------------------------------------


def test_count_is_one_slurm_job_and_every_call_runs_in_its_own_container(alice):
    t0 = time.time() - 1
    n = 3
    r = alice.run(
        "submit",
        "--time",
        "1m",
        "--count",
        str(n),
        "--",
        "sh",
        "-c",
        'echo "call=$DELEGATE_INDEX host=$(hostname)"; echo "err=$DELEGATE_INDEX" >&2',
    )
    assert r.returncode == 0, r.stderr
    jobs = r.stdout.split("\n")
    assert jobs[-1] == "" and len(jobs) == n + 1, f"one id per line expected: {r.stdout!r}"
    jobs = jobs[:-1]
    assert all(JOB_ID.match(j) for j in jobs), jobs
    assert len(set(jobs)) == n

    # One Slurm job (not an array element) shared by all n calls.
    sid = allocation_of(alice, jobs[0])
    _SUBMITTED.append(sid)
    assert sid.isdigit(), f"one plain Slurm job expected, got {sid!r}"
    for j in jobs:
        assert slurm_id_file(alice, j) == f"{sid}\nshared {n}\n", j
    # Its batch script runs the runner's pull mode on the job dirs, in order.
    script = sh("scontrol", "write", "batch_script", sid, "-", check=False)
    if script.returncode == 0:
        line = [ln for ln in script.stdout.splitlines() if "sandbox-runner" in ln]
        assert line and " pull " in line[0], script.stdout
        positions = [line[0].find(str(alice.job_dir(j))) for j in jobs]
        assert all(p > 0 for p in positions) and positions == sorted(positions), (line, jobs)

    st = wait_all(alice, jobs)
    assert [s["state"] for s in st] == ["completed"] * n, st
    assert [s["exit_code"] for s in st] == [0] * n, st
    assert {s["slurm_id"] for s in st} == {sid}, st

    hosts = []
    for i, j in enumerate(jobs):
        out = stdout_of(alice, j)
        m = re.fullmatch(rf"call={i} host=(\S+)\n", out)
        assert m, (j, out)
        hosts.append(m.group(1))
        assert (alice.job_dir(j) / "stderr").read_text() == f"err={i}\n"
        # Its own log beside the directory (written by the runner per call).
        assert (alice.root / f"{j}.log").is_file(), f"no per-call log for {j}"
        # Exactly one container was ever created for each call, none is left.
        assert len(containers_created_since(j, t0)) == 1, j
        assert containers_with_label(j) == [], j
    # Each call in its own fresh container (counted above), named after
    # the node as `hostname` on the node says.
    node = sh("hostname", "-s").stdout.strip()
    assert set(hosts) == {node}, hosts

    # One after another: a call starts after the previous one finished.
    for a, b in zip(st, st[1:]):
        assert a["finished_ms"] and b["started_ms"] and b["started_ms"] >= a["finished_ms"] - 1000, (a, b)


def test_count_wait_prints_every_output_in_order(alice):
    r = alice.run(
        "submit",
        "--time",
        "1m",
        "--count",
        "4",
        "--wait",
        "--",
        "sh",
        "-c",
        'echo "out-$DELEGATE_INDEX"; echo "err-$DELEGATE_INDEX" >&2',
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["out-0", "out-1", "out-2", "out-3"], r.stdout
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("err-")]
    assert errs == ["err-0", "err-1", "err-2", "err-3"], r.stderr


def test_count_wait_exit_code_is_that_of_a_failing_call(alice):
    token = uuid.uuid4().hex  # other jobs of alice's may appear meanwhile: find ours by it
    t0 = time.time() - 2
    r = alice.run(
        "submit",
        "--time",
        "1m",
        "--count",
        "3",
        "--wait",
        "--",
        "sh",
        "-c",
        'echo "ran-$DELEGATE_INDEX $0"; [ "$DELEGATE_INDEX" != 1 ] || exit 5',
        token,
    )
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    # The failing call does not stop the ones after it.
    assert r.stdout.splitlines() == [f"ran-{i} {token}" for i in range(3)], r.stdout
    ours = {}
    for p in alice.root.iterdir():
        try:
            if p.stat().st_mtime < t0 or not p.is_dir():
                continue
            with open(p / "stdout", "rb") as f:
                text = f.read(200).decode("utf-8", "replace")
        except OSError:
            continue
        if token in text:
            ours[int(text.split()[0].split("-")[1])] = p.name
    assert sorted(ours) == [0, 1, 2], ours
    st = statuses(alice, [ours[i] for i in range(3)])
    assert [s["exit_code"] for s in st] == [0, 5, 0], st
    assert [s["state"] for s in st] == ["completed", "failed", "completed"], st


# ---------------------------------------------------------------------------
# States inside the allocation
# ---------------------------------------------------------------------------


def test_later_calls_are_pending_while_the_first_runs(alice):
    jobs, handles = submit_count(alice, 3, *first_sleeps(6))
    sid = handles[0]["slurm_id"]
    assert {h["slurm_id"] for h in handles} == {sid}, handles
    st = wait_until(
        alice, jobs, lambda s: s[0]["state"] == "running" or s[0]["state"] in TERMINAL, what="call 0 running"
    )
    assert st[0]["state"] == "running", st
    for s in st[1:]:
        assert s["state"] == "pending", st
        assert s["reason"] == WAITING_REASON, st
        assert s["slurm_id"] == sid, st
    assert st[0]["slurm_id"] == sid
    # While call 0 sleeps, the next calls have not started a container.
    assert not (alice.job_dir(jobs[1]) / "started").exists()
    # Following a waiting call's output waits for its turn and ends with it.
    r = alice.run("logs", "--follow", jobs[1], timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done-1\n", r.stdout
    assert alice.status(jobs[1])["state"] == "completed"
    st = wait_all(alice, jobs)
    assert [s["state"] for s in st] == ["completed"] * 3, st
    assert [stdout_of(alice, j) for j in jobs] == ["done-0\n", "done-1\n", "done-2\n"]


# ---------------------------------------------------------------------------
# Cancelling one call
# ---------------------------------------------------------------------------


def test_cancel_of_a_pending_call_leaves_the_others_running(alice):
    t0 = time.time() - 1
    jobs, handles = submit_count(alice, 3, *first_sleeps(5))
    sid = handles[0]["slurm_id"]
    wait_until(alice, jobs, lambda s: s[0]["state"] != "pending", what="call 0 leaving pending")
    r = alice.run("cancel", "--json", jobs[1])
    assert r.returncode == 0, r.stderr
    st1 = alice.status(jobs[1])
    assert st1["state"] == "cancelled", st1
    assert st1["reason"] == "cancelled by the user before it started", st1
    # The allocation was not cancelled: the calls before and after it complete.
    assert in_squeue(sid) or alice.status(jobs[2])["state"] == "completed", "the allocation was scancelled"
    st = wait_all(alice, jobs)
    assert [s["state"] for s in st] == ["completed", "cancelled", "completed"], st
    assert st[1]["reason"] == "cancelled by the user before it started", st
    assert stdout_of(alice, jobs[0]) == "done-0\n"
    assert stdout_of(alice, jobs[2]) == "done-2\n"
    assert containers_created_since(jobs[1], t0) == [], "the cancelled call must never get a container"
    assert not (alice.job_dir(jobs[1]) / "started").exists()


def test_cancel_of_the_running_call_starts_the_next(alice):
    jobs, _handles = submit_count(alice, 2, *first_sleeps(60))
    alice.wait_started(jobs[0])
    st = alice.wait_for_state(jobs[0], {"running"} | TERMINAL, timeout=30)
    assert st["state"] == "running", st
    assert alice.status(jobs[1])["state"] == "pending"
    t0 = time.monotonic()
    r = alice.run("cancel", jobs[0])
    assert r.returncode == 0, r.stderr
    st = alice.wait_for_state(jobs[0], TERMINAL, timeout=30)
    elapsed = time.monotonic() - t0
    assert st["state"] == "cancelled", st
    assert st["reason"] == "cancelled by the user", st
    assert elapsed < 15, f"cancel of the running call took {elapsed:.1f}s"
    assert stdout_of(alice, jobs[0]) == "", "the cancelled call got to its echo"
    # The next call of the allocation runs and completes (well before call 0's 60 s).
    st = wait_all(alice, jobs, timeout=60)
    assert [s["state"] for s in st] == ["cancelled", "completed"], st
    assert stdout_of(alice, jobs[1]) == "done-1\n"
    assert time.monotonic() - t0 < 45, "the next call waited for the cancelled one's sleep"
    for j in jobs:
        assert containers_with_label(j) == [], j


def test_cancel_of_every_call_cancels_the_allocation_once(alice):
    t0 = time.time() - 1
    jobs, handles = submit_count(alice, 3, "sleep", "60")
    sid = handles[0]["slurm_id"]
    alice.wait_started(jobs[0])
    r = alice.run("cancel", *jobs)
    assert r.returncode == 0, r.stderr
    st = wait_all(alice, jobs, timeout=60)
    assert [s["state"] for s in st] == ["cancelled"] * 3, st
    wait_slurm_gone(sid)
    for j in jobs[1:]:
        assert containers_created_since(j, t0) == [], j
    for j in jobs:
        assert containers_with_label(j) == [], j


def test_scancel_of_the_allocation_ends_every_call(alice):
    t0 = time.time() - 1
    jobs, handles = submit_count(alice, 3, "sleep", "60")
    sid = handles[0]["slurm_id"]
    alice.wait_started(jobs[0])
    start = time.monotonic()
    sh("scancel", sid)  # the admin (plain Slurm, not `delegate cancel`)
    st = wait_all(alice, jobs, timeout=90)
    took = time.monotonic() - start
    assert [s["state"] for s in st] == ["cancelled"] * 3, st
    assert all(s["reason"] for s in st), st
    for s in st[1:]:
        assert "allocation" in s["reason"] and "before" in s["reason"], s
    assert took < 45, f"the calls took {took:.0f}s to end after the scancel"
    for j in jobs[1:]:
        assert containers_created_since(j, t0) == [], f"{j} started after the scancel"
        assert not (alice.job_dir(j) / "started").exists()
    for j in jobs:
        assert containers_with_label(j) == [], j
    wait_slurm_gone(sid)


def test_a_student_requeueing_their_maps_allocation_runs_nothing_past_its_retries(alice):
    """Hostile (issues 42, 52): a map's allocations are requeueable, so a
    student may `scontrol requeue` their own map's allocation, again and
    again, while it runs a call. Slurm takes the allocation back as it
    would from a lost node: the call it ran leaves no outcome, and the
    allocation, started again (at once: she makes it eligible), runs it
    again as a new attempt from a fresh directory (the earlier one kept
    beside it), within its retries, then the calls nobody had claimed,
    each once. No call runs more than 1 + retries times, none mixes with
    another's files, no container is left."""
    t0 = time.time() - 1
    jobs, handles = submit_count(alice, 3, "sh", "-c", "echo ran-$DELEGATE_INDEX; sleep 8")
    sid = handles[0]["slurm_id"]
    alice.wait_started(jobs[0])
    tries = [alice.as_user("scontrol", "requeue", sid, check=False) for _ in range(5)]
    assert tries[0].returncode == 0, tries[0].stderr  # (the others find it pending)
    # (and makes it eligible again at once, as she may: Slurm's begin time
    # for a requeued job, cred_expire, is test_attempts.py's to show)
    testlib.wait_until(
        f"Slurm job {sid} pending on its begin time",
        lambda: sh("squeue", "-h", "-j", sid, "-o", "%T %r").stdout.split() == ["PENDING", "BeginTime"],
        60,
        0.5,
    )
    r = alice.as_user("scontrol", "update", f"jobid={sid}", "StartTime=now", check=False)
    assert r.returncode == 0, r.stderr
    st = wait_all(alice, jobs, timeout=300)
    assert all(s["reason"] for s in st), st
    assert [s["state"] for s in st] == ["completed", "completed", "completed"], st
    assert "ran again" in st[0]["reason"], st[0]
    for i, j in enumerate(jobs):
        runs = 1 + len((alice.job_dir(j) / "attempts").read_text().splitlines()) if i == 0 else 1
        assert len(containers_created_since(j, t0)) == runs <= 3, f"call {i}: {runs} attempts"
        assert (alice.job_dir(j) / "stdout").read_text().count(f"ran-{i}") == 1
        assert containers_with_label(j) == [], j


def map_of_two_allocations(user, n, *cmd, time_limit="1m"):
    """A map's form written by hand as an array of two on this one node
    (the client makes one allocation here) over N calls `delegate submit
    --hold` prepared; returns the calls and the array's id once the first
    call has started (in element 0: the node is exclusive)."""
    jobs, handles = submit_count(user, n, *cmd, opts=("--time", time_limit, "--hold"))
    sh("scancel", handles[0]["slurm_id"])  # (delegate's own, held: replaced by the array below)
    runner = "/usr/local/bin/sandbox-runner"
    dirs = " ".join(f"'{user.job_dir(j)}'" for j in jobs)
    script = f"#!/bin/sh\n#SBATCH --array=0-1\nexec '{runner}' pull {dirs}\n"
    r = user.as_user(
        "sh", "-c", f"cd && sbatch --parsable --exclusive --time=13 --output=/dev/null <<'EOF'\n{script}EOF",
        check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    array = r.stdout.strip().split(";")[0]
    _SUBMITTED.append(array)
    started = user.job_dir(jobs[0]) / "started"
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline, "the first call never started"
        time.sleep(0.2)
    return jobs, array


def wait_outcomes(user, jobs, timeout=120):
    deadline = time.monotonic() + timeout
    while not all((user.job_dir(j) / "outcome").exists() for j in jobs):
        assert time.monotonic() < deadline, [sorted(p.name for p in user.job_dir(j).iterdir()) for j in jobs]
        time.sleep(0.5)


def test_an_allocation_cancelled_mid_call_leaves_the_rest_to_another(alice):
    """Issue 42: one of a map's two allocations is scancelled while it runs
    the first call: that call ends cancelled, and the other allocation
    claims and runs the two calls nobody had claimed; each call is claimed
    once."""
    jobs, array = map_of_two_allocations(alice, 3, "sleep", "4")
    sh("scancel", f"{array}_0")
    wait_outcomes(alice, jobs)
    claims = [(alice.job_dir(j) / "claim").read_text().split()[0] for j in jobs]
    assert claims == [f"{array}_0", f"{array}_1", f"{array}_1"], claims
    st = statuses(alice, jobs)
    assert [s["state"] for s in st] == ["cancelled", "completed", "completed"], st
    assert "Slurm" in st[0]["reason"], st[0]


def test_an_allocation_out_of_time_mid_call_leaves_the_rest_to_another(alice):
    """Issue 42: one of a map's two allocations reaches its Slurm time
    limit while it runs the first call (an administrator ended it now: with
    the limits the client sets, a call cannot outlast its allocation). That
    call ends with a state and a reason that names the time limit; the
    other allocation claims and runs the two calls nobody had claimed."""
    # (the first call, DELEGATE_INDEX=0, outlasts the allocation's new end,
    # now, and Slurm's 30 s pass that enforces it, well within its own
    # limit of five minutes)
    jobs, array = map_of_two_allocations(
        alice, 3, "sh", "-c", 'if [ "$DELEGATE_INDEX" = 0 ]; then sleep 120; fi', time_limit="5m"
    )
    sh("scontrol", "update", f"jobid={array}_0", "EndTime=now")
    # (slurmctld enforces time limits in its background pass, every 30 s)
    wait_outcomes(alice, jobs, timeout=180)
    claims = [(alice.job_dir(j) / "claim").read_text().split()[0] for j in jobs]
    assert claims == [f"{array}_0", f"{array}_1", f"{array}_1"], claims
    st = statuses(alice, jobs)
    assert [s["state"] for s in st[1:]] == ["completed", "completed"], st
    assert st[0]["state"] in ("cancelled", "timed_out"), st[0]
    assert "time limit" in st[0]["reason"], st[0]
    sacct_states(f"{array}_0", want="TIMEOUT")


# ---------------------------------------------------------------------------
# A refused call among good ones
# ---------------------------------------------------------------------------


def test_a_refused_directory_fails_only_its_own_call(alice):
    t0 = time.time() - 1
    # The last call sleeps: the refusals must show while the allocation still runs.
    jobs, handles = submit_count(
        alice,
        4,
        "sh",
        "-c",
        '[ "$DELEGATE_INDEX" != 3 ] || sleep 6; echo "good-$DELEGATE_INDEX"',
        opts=("--hold",),
    )
    sid = handles[0]["slurm_id"]
    assert in_squeue(sid), "the held allocation is not in Slurm's queue"
    # Call 1: a garbage spec body.
    d1 = alice.job_dir(jobs[1])
    spec = bytearray((d1 / "spec").read_bytes())
    spec[8:] = b"\xff" * (len(spec) - 8)
    (d1 / "spec").write_bytes(bytes(spec))
    # Call 2: its directory replaced by a symlink.
    d2 = alice.job_dir(jobs[2])
    real = d2.with_name(jobs[2] + ".real")
    alice.as_user("mv", str(d2), str(real))
    alice.as_user("ln", "-s", str(real), str(d2))
    try:
        alice.as_user("scontrol", "release", sid)
        alice.wait_started(jobs[3])
        st = statuses(alice, jobs)
        assert st[3]["state"] == "running", st
        assert st[0]["state"] == "completed", st
        assert st[1]["state"] == "failed" and st[1]["refused"] is True, st[1]
        assert "could not be decoded" in st[1]["reason"], st[1]
        st = wait_all(alice, jobs, timeout=120)
        assert [s["state"] for s in st] == ["completed", "failed", "failed", "completed"], st
        assert stdout_of(alice, jobs[0]) == "good-0\n"
        assert stdout_of(alice, jobs[3]) == "good-3\n"
        assert st[1]["refused"] is True and "could not be decoded" in st[1]["reason"], st[1]
        assert st[2]["refused"] is True and "symbolic link" in st[2]["reason"], st[2]
        assert not st[0]["refused"] and not st[3]["refused"]
        # (The symlinked call's directory is not read at all: it shows no Slurm id.)
        assert [st[i]["slurm_id"] for i in (0, 1, 3)] == [sid] * 3, st
        for j in jobs[1:3]:
            assert containers_created_since(j, t0) == [], j
        for j in (jobs[0], jobs[3]):
            assert len(containers_created_since(j, t0)) == 1, j
    finally:
        alice.as_user("rm", "-f", str(d2), check=False)
        alice.as_user("mv", str(real), str(d2), check=False)


def test_time_limit_of_one_call_does_not_end_the_others(alice):
    jobs, _ = submit_count(alice, 2, *first_sleeps(600), opts=("--time", "5s"))
    st = wait_all(alice, jobs, timeout=120)
    assert [s["state"] for s in st] == ["timed-out", "completed"], st
    assert "time limit" in st[0]["reason"], st[0]
    assert stdout_of(alice, jobs[1]) == "done-1\n"
    for j in jobs:
        assert containers_with_label(j) == [], j


def test_scancel_of_a_queued_allocation_cancels_every_call(alice):
    t0 = time.time() - 1
    jobs, handles = submit_count(alice, 2, "true", opts=("--hold",))
    st = statuses(alice, jobs)
    assert all(s["state"] == "pending" and "queue" in s["reason"] for s in st), st
    sh("scancel", handles[0]["slurm_id"])
    st = wait_all(alice, jobs, timeout=60)
    assert [s["state"] for s in st] == ["cancelled"] * 2, st
    for s in st:
        assert "allocation" in s["reason"] and "before" in s["reason"], s
    for j in jobs:
        assert containers_created_since(j, t0) == [], j


def test_cancelling_the_calls_one_by_one_frees_the_queue(alice):
    """Each cancel ends one call; the last one also cancels the allocation
    (held here, so it would otherwise stay in the queue for ever)."""
    t0 = time.time() - 1
    jobs, handles = submit_count(alice, 3, "true", opts=("--hold",))
    sid = handles[0]["slurm_id"]
    calls = (alice.root / f"shared-{sid}.calls").read_text().split()
    assert calls == jobs, calls
    for i, j in enumerate(jobs):
        r = alice.run("cancel", j)
        assert r.returncode == 0, r.stderr
        assert [s["state"] for s in statuses(alice, jobs[: i + 1])] == ["cancelled"] * (i + 1)
        if i < len(jobs) - 1:
            assert in_squeue(sid), f"the allocation went away with calls left to run ({i + 1} cancelled)"
    wait_slurm_gone(sid)
    st = statuses(alice, jobs)
    assert all(s["reason"] == "cancelled by the user before it started" for s in st), st
    for j in jobs:
        assert containers_created_since(j, t0) == [], j


# ---------------------------------------------------------------------------
# One Slurm job per call when sharing is turned off
# ---------------------------------------------------------------------------


def test_calls_per_allocation_1_gives_one_array_element_per_call(alice):
    jobs, handles = submit_count(
        alice, 3, "sh", "-c", 'echo "idx=$DELEGATE_INDEX"', env={"DELEGATE_CALLS_PER_ALLOCATION": "1"}
    )
    base = handles[0]["slurm_id"].split("_")[0]
    for i, (j, h) in enumerate(zip(jobs, handles)):
        assert h["slurm_id"] == f"{base}_{i}", handles
        assert slurm_id_file(alice, j) == f"{base}_{i}\n", "no 'shared' line for an unshared call"
    st = wait_all(alice, jobs)
    assert [s["state"] for s in st] == ["completed"] * 3, st
    assert [s["slurm_id"] for s in st] == [f"{base}_{i}" for i in range(3)], st
    assert [stdout_of(alice, j) for j in jobs] == [f"idx={i}\n" for i in range(3)]


def test_calls_per_allocation_env_must_be_a_positive_number(alice):
    for bad in ("0", "many", "-2"):
        r = run_env(alice, {"DELEGATE_CALLS_PER_ALLOCATION": bad}, "submit", "--count", "2", "--", "true")
        assert r.returncode == 1, (bad, r.returncode, r.stdout, r.stderr)
        assert r.stderr.startswith("delegate: error:") and "DELEGATE_CALLS_PER_ALLOCATION" in r.stderr, (
            r.stderr
        )
        assert r.stdout == ""


def test_a_map_is_one_allocation_per_node_whatever_its_calls_limits(alice):
    """Issue 42: calls were planned into allocations by their time limits,
    so `--count 30 --time 5m` was 30 Slurm jobs and `--time 1m` 4. The
    map's allocations now pull its calls: one allocation per usable node
    (one here) either way, each call's `claim` made by the allocation that
    runs it."""
    for limit in ("5m", "1m"):
        jobs, handles = submit_count(alice, 30, "true", opts=("--hold", "--time", limit))
        assert len({h["slurm_id"] for h in handles}) == 1, handles
        sid = handles[0]["slurm_id"]
        assert sid.isdigit(), sid
        assert sh("squeue", "-h", "-r", "-j", sid, "-o", "%i").stdout.split() == [sid]
        alice.run("cancel", *jobs, timeout=120)
    jobs, _ = submit_count(alice, 3, "true", opts=("--time", "5m"))
    st = wait_all(alice, jobs)
    assert [s["state"] for s in st] == ["completed"] * 3, st
    for j in jobs:
        claim = (alice.job_dir(j) / "claim").read_text()
        # (and the allocation's restart count when it claimed: 0, a first start)
        assert claim == f"{allocation_of(alice, j)} {st[0]['host']} 0\n", claim


def test_a_maps_allocation_holds_its_node_at_most_the_bound_and_one_call(alice):
    """Security round 3, item 6, and issue 42: a map's allocation claims
    calls while it is younger than the site's max_allocation_time (10
    minutes by default): its Slurm limit is that, plus one call's limit
    (1 minute) and 30 s, plus Slurm's minute of slack."""
    jobs, handles = submit_count(alice, 60, "true", opts=("--hold", "--time", "1m"))
    sids = sorted({h["slurm_id"] for h in handles})
    assert len(sids) == 1, sids
    limits = sh("squeue", "-h", "-r", "-j", sids[0], "-o", "%l").stdout.split()
    assert limits == ["13:00"], limits
    alice.run("cancel", *jobs, timeout=120)


def test_the_gate_refuses_a_longer_map_allocation_by_hand(alice, tmp_path):
    """The same bound when a student writes the map's form by hand with
    `sbatch --time=100`: refused at submission (10 minutes, the site's max
    time of an hour, 30 s and the client's minute: 72)."""
    runner = "/usr/local/bin/sandbox-runner"
    dirs = [str(alice.root / (time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8])) for _ in range(2)]
    script = f"#!/bin/sh\nexec '{runner}' pull " + " ".join(f"'{d}'" for d in dirs) + "\n"
    r = alice.as_user(
        "sh", "-c", f"cd && sbatch --hold --time=100 --output=/dev/null <<'EOF'\n{script}EOF", check=False
    )
    assert r.returncode != 0 and "has a time limit of at most 72 minutes" in r.stderr, r.stderr


def test_another_students_call_waits_only_for_the_maps_current_call(alice, bob):
    """Issue 42: a map's allocation checks between its calls whether
    another user's job waits for the partition; when one does, it ends
    after its current call and requeues itself. Bob's call, submitted while
    Alice's first call (4 s) runs, starts before her second; her map goes
    on afterwards and every call completes once. Issue 53: the requeued
    allocation does not sit out Slurm's requeue delay (cred_expire, 30 s)
    while the node idles: the agent makes it eligible again as soon as
    Bob's job has the node, and says so in its log."""
    jobs, handles = submit_count(alice, 3, "sleep", "4", opts=("--time", "1m"))
    wait_until(alice, jobs[:1], lambda st: st[0]["state"] == "running", what="the first call running")
    r = bob.run("submit", "--json", "--time", "1m", "--", "true")
    assert r.returncode == 0, r.stderr
    bob_job = json.loads(r.stdout)["id"]
    _SUBMITTED.append(json.loads(r.stdout)["slurm_id"])
    b = wait_all(bob, [bob_job])[0]
    assert b["state"] == "completed", b
    st = wait_all(alice, jobs, timeout=240)
    assert [s["state"] for s in st] == ["completed"] * 3, st
    assert b["started_ms"] < st[1]["started_ms"], (b, st)
    assert st[0]["finished_ms"] <= b["started_ms"], (st[0], b)
    log = (alice.job_dir(jobs[0]).parent / f"{jobs[0]}.map.log").read_text()
    assert "steps aside after 1 calls: another user's job waits for the partition" in log, log
    restarts = sacct_states(handles[0]["slurm_id"], "-D", want="REQUEUED")
    assert restarts[:1] == ["REQUEUED"], restarts
    agent = Path("/var/log/delegate/agent.log").read_text(errors="replace")
    hastened = f"Slurm job {handles[0]['slurm_id']} stepped aside and the node it gave up is taken"
    assert hastened in agent, agent[-3000:]


def test_a_stopped_map_is_requeued_when_another_student_waits(alice, bob):
    """Security round 5, item 1: a student stops their own map's runner
    (`scancel --signal=STOP --batch`): it never asks whether others wait
    and never steps aside, and the node idled while Bob's call waited until
    the map's time limit. The node's agent now requeues a map's allocation
    that ran no sandbox and asked nothing for 20 s while another user's job
    waits: Bob's call runs, and Alice's map, started again, runs every call
    (one its stopped runner had claimed and not finished again, as a new
    attempt)."""
    jobs, handles = submit_count(alice, 3, "sleep", "4", opts=("--time", "1m"))
    sid = handles[0]["slurm_id"]
    wait_until(alice, jobs[:1], lambda st: st[0]["state"] == "running", what="the first call running")
    r = alice.as_user("scancel", "--signal=STOP", "--batch", sid, check=False)
    assert r.returncode == 0, r.stderr
    r = bob.run("submit", "--json", "--time", "1m", "--", "true")
    assert r.returncode == 0, r.stderr
    bob_job = json.loads(r.stdout)["id"]
    _SUBMITTED.append(json.loads(r.stdout)["slurm_id"])
    b = wait_all(bob, [bob_job], timeout=120)[0]
    assert b["state"] == "completed", b
    agent = Path("/var/log/delegate/agent.log").read_text(errors="replace")
    assert f"Slurm job {sid} (a map's allocation of uid {alice.uid}) ran no sandbox" in agent, agent[-3000:]
    st = wait_all(alice, jobs, timeout=240)
    assert [s["state"] for s in st] == ["completed"] * 3, st
    # (the call the stopped runner had claimed, if any, as a new attempt)
    assert sum("ran again" in s["reason"] for s in st) <= 1, st


def test_an_allocation_older_than_its_bound_starts_no_more_calls(alice):
    """Security round 4, item 2: a shared allocation whose time limit was
    raised held its node for hours while another student waited. Whatever
    its Slurm limit and whatever its runner believes, the agent starts no
    call of a map's allocation older than max_allocation_time. Three calls
    of 6 s share one allocation, whose runner read the site's 10 minutes
    when it started; the bound is then cut to 4 s (the agent reads the
    policy at every call): the first call completes, the later ones end
    with the reason."""
    policy = Path("/etc/delegate/policy.toml")
    old = policy.read_text()
    ids, _ = submit_count(alice, 3, "sleep", "6")
    try:
        wait_until(alice, ids[:1], lambda st: st[0]["state"] == "running", what="the first call running")
        keep = [ln for ln in old.splitlines() if not ln.strip().startswith("max_allocation_time")]
        policy.write_text("\n".join([*keep, 'max_allocation_time = "4s"']) + "\n")
        st = wait_all(alice, ids)
    finally:
        policy.write_text(old)
    assert len({s["slurm_id"] for s in st}) == 1, st
    assert st[0]["state"] == "completed", st[0]
    assert all(s["state"] != "completed" for s in st[1:]), st
    reasons = " ".join(str(s.get("reason")) for s in st[1:])
    assert "longer than the site's max_allocation_time" in reasons, st
