"""Accounting in a real database (slurmdbd + MariaDB, build_cluster.d/
accounting.sh): sacct records every student's jobs, a per-student limit
refuses in one sentence and leaves nothing behind, a user without an
association is refused with the same care, fair share puts a heavy user's
pending job after a fresh student's, and the instructor's view (`delegate
admin usage|queue`) is for admins only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DELEGATE, User, record_started, sh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import testlib


@pytest.fixture(autouse=True)
def _accounting():
    """slurmdbd and MariaDB start here: no accounting is a broken setup."""
    testlib.require_accounting()


def slurm_id(user: User, job: str) -> str:
    return (user.job_dir(job) / "slurm-id").read_text().split()[0]


def job_dirs(user: User) -> set[str]:
    if not user.root.is_dir():
        return set()
    return {p.name for p in user.root.iterdir() if p.is_dir()}


def sacct(*args: str) -> list[list[str]]:
    r = sh("sacct", "-n", "-P", *args)
    return [line.split("|") for line in r.stdout.splitlines() if line.strip()]


def test_sacct_shows_each_students_jobs(alice, bob):
    ids = {}
    for u in (alice, bob):
        job = u.submit("true")
        assert u.wait(job, timeout=240)["state"] == "completed"
        ids[u.name] = slurm_id(u, job)
    # Root sees both; records reach the database within a few seconds.
    deadline = time.monotonic() + 60
    while True:
        rows = sacct("-a", "-X", "-o", "JobID,User,State,Account", "-j", ",".join(ids.values()))
        seen = {r[0]: r for r in rows}
        if (
            all(seen.get(sid, [""] * 3)[2] == "COMPLETED" for sid in ids.values())
            or time.monotonic() > deadline
        ):
            break
        time.sleep(2)
    for name, sid in ids.items():
        assert sid in seen, f"sacct has no record of {name}'s job {sid}: {rows}"
        assert seen[sid][1] == name and seen[sid][2] == "COMPLETED", seen[sid]
        assert seen[sid][3] == testlib.COURSE_ACCOUNT, seen[sid]
    # PrivateData: a student's sacct shows their own jobs only.
    r = bob.as_user("sacct", "-a", "-X", "-n", "-P", "-o", "JobID,User", check=False)
    assert ids[alice.name] not in r.stdout and alice.name not in r.stdout, r.stdout


@pytest.fixture
def limited():
    """delegate-carol, whose only QOS allows one job at a time."""
    with testlib.tight_qos("delegate-carol"):
        yield User("delegate-carol")


def test_a_limit_refuses_in_one_sentence_and_leaves_nothing(limited):
    held = limited.submit("true", opts=("--hold",))
    before = job_dirs(limited)
    for opts in ((), ("--count", "5")):
        r = limited.run("submit", *opts, "--", "true")
        assert r.returncode == 1, r.stdout + r.stderr
        msg = r.stderr.strip()
        assert len(msg.splitlines()) == 1, msg
        assert "MaxSubmitJobsPerUser" in msg and "wait for some to finish or cancel some" in msg, msg
        assert "QOSMax" not in msg and "violates" not in msg and "sbatch" not in msg, msg
        assert job_dirs(limited) == before, "a refused submission left a job directory behind"
    r = limited.run("cancel", held, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_user_without_association_is_told_so():
    name = "delegate-noassoc"
    pw = testlib._ensure_unix_user(name, testlib.FIRST_ID)
    sh("sacctmgr", "-i", "delete", "user", f"name={name}", check=False)
    u = User(pw.pw_name)
    before = job_dirs(u)
    r = u.run("submit", "--", "true")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not registered with Slurm for this course" in r.stderr and "roster" in r.stderr, r.stderr
    assert "Invalid account" not in r.stderr, r.stderr
    assert job_dirs(u) == before


def raw_usage(name: str) -> float:
    r = sh("sshare", "-n", "-P", "-A", testlib.COURSE_ACCOUNT, "-u", name, "-o", "User,RawUsage", check=False)
    for line in r.stdout.splitlines():
        user, _, usage = line.partition("|")
        if user == name:
            try:
                return float(usage)
            except ValueError:
                return 0.0
    return 0.0


def heavy_and_fresh() -> tuple[User, User]:
    """Two students: `heavy` has used the node more than `fresh` ever did
    (usage is folded in every minute, PriorityCalcPeriod=1)."""
    heavy = User(testlib.ensure_user("delegate-heavy").pw_name)
    fresh = User(testlib.ensure_user("delegate-fresh").pw_name)
    if raw_usage(heavy.name) <= 2 * raw_usage(fresh.name) + 1:
        r = heavy.run("submit", "--wait", "--", "sleep", "15", timeout=300)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 150
        while raw_usage(heavy.name) <= 2 * raw_usage(fresh.name) + 1:
            assert time.monotonic() < deadline, "the heavy user's usage never reached sshare"
            time.sleep(5)
    return heavy, fresh


def test_fair_share_puts_a_heavy_users_job_after_a_fresh_students():
    heavy, fresh = heavy_and_fresh()
    # Hold the node with an admin's job, queue the heavy user's job first,
    # then the fresh student's.
    blocker = sh(
        "sbatch", "--parsable", "--exclusive", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300"
    ).stdout
    blocker = blocker.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while sh("squeue", "-h", "-j", blocker, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the blocking job did not start"
            time.sleep(1)
        hj = heavy.submit("true")
        time.sleep(1)
        fj = fresh.submit("true")
        hs, fs = slurm_id(heavy, hj), slurm_id(fresh, fj)
        # Priorities are (re)computed every PriorityCalcPeriod (1 min); a
        # new association's fair share counts from its first calculation.
        deadline = time.monotonic() + 150
        while True:
            prio = {}
            for line in sh("squeue", "-h", "-j", f"{hs},{fs}", "-o", "%i|%Q").stdout.splitlines():
                sid, _, p = line.partition("|")
                prio[sid] = int(p)
            if prio.get(fs, 0) > prio.get(hs, 0) or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert prio[fs] > prio[hs], (
            f"fresh student's priority {prio[fs]} not above the heavy user's {prio[hs]}"
        )
    finally:
        sh("scancel", blocker, check=False)
    # Once the node is free, the fresh student's job starts first.
    for u, j in ((fresh, fj), (heavy, hj)):
        st = u.wait(j, timeout=240)
        assert st["state"] == "completed", st
    starts = {r[0]: r[1] for r in sacct("-a", "-X", "-o", "JobID,Start", "-j", f"{hs},{fs}")}
    assert starts[fs] <= starts[hs], starts


def test_a_flood_does_not_keep_a_fresh_students_call_waiting():
    """One student queues 300 calls; another's single call, submitted while
    the flood runs, starts within two of the flooder's allocations (the one
    running when it came, and at most one more), not after the flood."""
    heavy, fresh = heavy_and_fresh()
    r = heavy.run("submit", "--count", "300", "--time", "1m", "--", "sleep", "1", timeout=300)
    assert r.returncode == 0, r.stderr
    flood = r.stdout.split()
    assert len(flood) == 300, r.stdout[-500:]
    try:
        deadline = time.monotonic() + 120
        while "RUNNING" not in sh("squeue", "-h", "-u", heavy.name, "-o", "%T").stdout:
            assert time.monotonic() < deadline, "the flood never started"
            time.sleep(0.5)
        fj = fresh.submit("true")
        st = fresh.wait(fj, timeout=300)
        assert st["state"] == "completed", st
        fs = slurm_id(fresh, fj)
        ((_, f_submit, f_start),) = sacct("-a", "-X", "-o", "JobID,Submit,Start", "-j", fs)
        allocs = sacct("-a", "-X", "-u", heavy.name, "-S", f_submit, "-o", "JobID,Start,State")
        before = [a for a in allocs if f_submit <= a[1] < f_start]
        assert len(before) <= 2, (
            f"the fresh call (submitted {f_submit}, started {f_start}) waited for {before}"
        )
        pending = sh("squeue", "-h", "-u", heavy.name, "-t", "PD", "-o", "%i").stdout.split()
        assert pending, "the flood was over before the fresh call started: nothing was shown"
    finally:
        heavy.run("cancel", *flood, timeout=300)


def test_admin_usage_for_admins_only(alice):
    r = alice.run("submit", "--wait", "--count", "3", "--", "true", timeout=300)
    assert r.returncode == 0, r.stderr
    # slurmctld sends its records to slurmdbd on its own pace (seconds on a
    # fresh database): wait for them rather than for a fixed time.
    deadline = time.monotonic() + 120
    while True:
        r = subprocess.run(
            [DELEGATE, "admin", "usage", "--since", "now-1days", "--csv"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("user,calls,"), lines
        rows = {line.split(",")[0]: line.split(",") for line in lines[1:]}
        if alice.name in rows and int(rows[alice.name][1]) >= 3:
            break
        assert time.monotonic() < deadline, f"alice's 3 calls never reached the accounting: {r.stdout}"
        time.sleep(1)
    r = subprocess.run([DELEGATE, "admin", "queue"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("SLURM-ID"), r.stdout + r.stderr
    for args in (("usage",), ("queue",)):
        r = alice.run("admin", *args)
        assert r.returncode == 1, r.stdout
        assert "for the course's instructors only" in r.stderr and alice.name not in r.stdout, r.stderr


def _pid_of(name: str, pidfile: str) -> int:
    """The pid of build_cluster.sh's daemon `name` (from its pid file)."""
    pid = int(Path(pidfile).read_text().split()[0])
    assert Path(f"/proc/{pid}/comm").read_text().strip() == name, f"{pidfile}: pid {pid} is not {name}"
    return pid


def _stop(pid: int, timeout: float = 60) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.2)


def test_slurmdbd_and_mariadb_restart_mid_run(alice, bob):
    """The database and slurmdbd stop while a job runs: the running job
    finishes, a new one is accepted and scheduled (slurmctld keeps the
    associations and queues the records), and after the restart sacct has
    both."""
    db_pid = _pid_of("mariadbd", "/run/delegate/mariadb/mariadb.pid")
    dbd_pid = _pid_of("slurmdbd", "/run/delegate/slurmdbd.pid")
    db_cmd = Path(f"/proc/{db_pid}/cmdline").read_bytes().split(b"\0")[:-1]
    running = alice.submit("sleep", "15")
    alice.wait_started(running)
    _stop(dbd_pid)
    _stop(db_pid)
    try:
        queued = bob.submit("true")
        for u, j in ((alice, running), (bob, queued)):
            st = u.wait(j, timeout=240)
            assert st["state"] == "completed", st
    finally:
        db = subprocess.Popen(
            db_cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        record_started("mariadbd", db.pid)
        sock = "/run/delegate/mariadb/mariadb.sock"
        ping = ["mariadb-admin", "--no-defaults", f"--socket={sock}", "-u", "root", "ping"]
        testlib.wait_until(
            "the database answers on its socket",
            lambda: subprocess.run(ping, capture_output=True).returncode == 0,
            60,
        )
        subprocess.run(["slurmdbd"], check=True, timeout=60)
        testlib.wait_until(
            "slurmdbd answers sacctmgr",
            lambda: (
                subprocess.run(["sacctmgr", "-n", "show", "cluster"], capture_output=True).returncode == 0
            ),
            60,
            1,
        )
        record_started("slurmdbd", _pid_of("slurmdbd", "/run/delegate/slurmdbd.pid"))
    ids = {slurm_id(alice, running): alice.name, slurm_id(bob, queued): bob.name}
    deadline = time.monotonic() + 180
    while True:
        rows = {r[0]: r for r in sacct("-a", "-X", "-o", "JobID,User,State", "-j", ",".join(ids))}
        if all(rows.get(sid, ["", "", ""])[2] == "COMPLETED" for sid in ids):
            break
        assert time.monotonic() < deadline, f"accounting did not catch up: {rows}"
        time.sleep(3)
    for sid, name in ids.items():
        assert rows[sid][1] == name
