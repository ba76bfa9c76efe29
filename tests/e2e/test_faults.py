"""Faults (issue 5): cancellation, time limits, a killed runner, a restarted
Docker engine, a crashed node (slurmd killed), a killed caller, a full
delegate root, many users at once. In each the job ends with a state and a
reason (nothing hangs), no result is lost or read half-written, no container
is left, and the cluster is healthy afterwards.

Some of these stop and start the local daemons (dockerd, slurmd): they
restore them before they return, record the new pids where build_cluster.sh
keeps them (so `build_cluster.sh --local stop` still works) and check the
cluster answers. The cases that need the Python package (a full root and a
Python result, a failing map, 500 jobs by 10 users) are in
tests/python/test_python_faults.py, which runs after the wheel is installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import DELEGATE, RUNNER, containers_created_since, containers_with_label, record_started, sh

import testlib

SLURM_CONF = "/etc/slurm/slurm.conf"
TERMINAL = {"completed", "failed", "timed-out", "cancelled", "lost"}


def slurm_id(user, job):
    return (user.job_dir(job) / "slurm-id").read_text().strip()


def pids_of(pattern):
    """This machine's processes whose command line matches `pattern`: those
    of its own pid namespace (the stack's and the site's containers, whose
    slurmd and dockerd this host sees too, are not this cluster's)."""
    r = subprocess.run(
        ["pgrep", "--ns", str(os.getpid()), "--nslist", "pid", "-f", pattern], capture_output=True, text=True
    )
    return [int(p) for p in r.stdout.split()]


def node_state():
    return sh("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()


def ensure_cluster_healthy(timeout=60):
    """slurmd and dockerd running and answering, every node back in service."""
    if not pids_of("^slurmd( |$)"):
        sh("slurmd", "-f", SLURM_CONF)
        pid = Path("/run/delegate/slurmd.pid")
        deadline = time.monotonic() + 20
        while not pid.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        record_started("slurmd", pid.read_text().strip())
    deadline = time.monotonic() + timeout
    while True:
        nodes = sh("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
        bad = [
            ln.split()[0]
            for ln in nodes
            if ln.strip() and any(b in ln.split()[1] for b in ("down", "drain", "fail"))
        ]
        for n in bad:
            sh("scontrol", "update", f"nodename={n}", "state=resume", check=False)
        if not bad and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
            return
        assert time.monotonic() < deadline, f"cluster not healthy: {nodes}"
        time.sleep(0.5)


@pytest.fixture
def healthy_after():
    yield
    ensure_cluster_healthy()


# ---------------------------------------------------------------------------
# Cancellation and time limits
# ---------------------------------------------------------------------------


def test_scancel_while_pending(alice):
    t0 = time.time() - 1
    job = alice.submit("true", opts=("--hold",))
    alice.as_user("scancel", slurm_id(alice, job))  # plain Slurm, not `delegate cancel`
    st = alice.wait(job, timeout=180)
    assert st["state"] == "cancelled" and "Slurm" in st["reason"], st
    assert containers_created_since(job, t0) == []


def test_delegate_cancel_while_pending(alice):
    t0 = time.time() - 1
    job = alice.submit("true", opts=("--hold",))
    r = alice.run("cancel", job)
    assert r.returncode == 0, r.stderr
    st = alice.status(job)
    assert st["state"] == "cancelled" and st["reason"], st
    assert containers_created_since(job, t0) == []


def test_scancel_while_running(alice):
    job = alice.submit("sleep", "600")
    alice.wait_started(job)
    alice.as_user("scancel", slurm_id(alice, job))
    st = alice.wait(job, timeout=180)
    assert st["state"] == "cancelled" and "SIGTERM from Slurm" in st["reason"], st
    assert containers_with_label(job) == []


def test_slurm_time_limit_backstop(alice):
    # The runner enforces the job's own limit (test_cli.py::test_time_limit);
    # Slurm's limit (with a margin) is the backstop when that did not happen.
    # The job's end moved to now (a time limit is whole minutes): slurmctld
    # ends it in its background pass, within 30 s.
    job = alice.submit("sleep", "600", opts=("--time", "5m"))
    alice.wait_started(job)
    sh("scontrol", "update", f"jobid={slurm_id(alice, job)}", "EndTime=now")
    st = alice.wait(job, timeout=240)
    assert st["state"] in ("cancelled", "timed-out") and "time limit" in st["reason"], st
    assert containers_with_label(job) == []


# ---------------------------------------------------------------------------
# A killed runner, a restarted engine, a crashed node
# ---------------------------------------------------------------------------


def test_runner_killed_with_sigkill(alice):
    job = alice.submit("sleep", "600")
    alice.wait_started(job)
    assert containers_with_label(job), "the container should be up"
    runner = pids_of(f"^{RUNNER} {alice.job_dir(job)}$")
    assert len(runner) == 1, runner
    os.kill(runner[0], signal.SIGKILL)
    t0 = time.monotonic()
    st = alice.wait(job, timeout=180)
    assert time.monotonic() - t0 < 30, "the wait must end promptly"
    assert st["state"] in ("lost", "failed"), st
    assert "runner wrote no outcome" in st["reason"], st
    # The Slurm epilog removed the container by its label.
    deadline = time.monotonic() + 30
    while containers_with_label(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers_with_label(job) == []
    r = alice.run("submit", "--wait", "--", "echo", "next-job-ok")
    assert r.returncode == 0 and "next-job-ok" in r.stdout


def test_docker_engine_restarted_mid_job(alice, healthy_after):
    job = alice.submit("sh", "-c", "echo before; sleep 600; echo after")
    alice.wait_started(job)
    (old,) = pids_of("^dockerd( |$)")
    os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while pids_of("^dockerd( |$)"):
        assert time.monotonic() < deadline, "dockerd did not stop"
        time.sleep(0.2)
    # The new dockerd holds its own copy of the log file's descriptor.
    with open("/var/log/delegate/dockerd.log", "ab") as log:
        new = subprocess.Popen(
            ["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    record_started("dockerd", new.pid)
    deadline = time.monotonic() + 60
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "dockerd did not come back"
        time.sleep(0.2)
    st = alice.wait(job, timeout=120)
    assert st["state"] == "failed", st
    assert "Docker engine" in st["reason"], st
    assert "could not be removed" not in st["reason"], st
    assert (alice.job_dir(job) / "stdout").read_text() == "before\n"
    assert containers_with_label(job) == []
    r = alice.run("submit", "--wait", "--", "echo", "next-job-ok")
    assert r.returncode == 0 and "next-job-ok" in r.stdout, r.stderr


def test_slurmd_killed_mid_job(alice, healthy_after):
    # A node crash as far as Slurm can tell: slurmd, the job's slurmstepd and
    # the runner die at once; the administrator (here the test) marks the node
    # down, as slurmctld would after SlurmdTimeout. Without retries the call
    # ends lost (with retries it runs again: test_attempts.py).
    job = alice.submit("sh", "-c", "echo before; sleep 600", opts=("--retries", "0"))
    alice.wait_started(job)
    sid = slurm_id(alice, job)
    node = alice.status(job)["host"] or sh("hostname").stdout.strip()
    for pattern in ("^slurmd( |$)", rf"^slurmstepd: \[{sid}\.", f"^{RUNNER} {alice.job_dir(job)}$"):
        for pid in pids_of(pattern):
            os.kill(pid, signal.SIGKILL)
    sh("scontrol", "update", f"nodename={node}", "state=down", "reason=delegate test: node crash")
    t0 = time.monotonic()
    st = alice.wait(job, timeout=180)
    assert time.monotonic() - t0 < 30, "the wait must end, not hang"
    assert st["state"] == "lost", st
    assert "NODE_FAIL" in st["reason"], st
    # Not requeued: a call without retries.
    assert sh("squeue", "-h", "-j", sid, check=False).stdout.strip() == ""
    ensure_cluster_healthy()
    # The orphan container (its own epilog never ran) goes at the next job's epilog.
    r = alice.run("submit", "--wait", "--", "echo", "next-job-ok")
    assert r.returncode == 0 and "next-job-ok" in r.stdout, r.stderr
    deadline = time.monotonic() + 30
    while containers_with_label(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers_with_label(job) == []
    assert alice.status(job)["state"] == "lost"  # and it stays so


# ---------------------------------------------------------------------------
# The caller
# ---------------------------------------------------------------------------


def test_caller_killed_and_a_new_process_reattaches(alice):
    before = {p.name for p in alice.root.iterdir()} if alice.root.exists() else set()
    caller = alice.popen(
        DELEGATE,
        "submit",
        "--wait",
        "--",
        "sh",
        "-c",
        "sleep 3; echo reattached-output; exit 5",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=alice.env(),
        cwd="/",
    )
    deadline = time.monotonic() + 60
    while True:
        new = [n for n in {p.name for p in alice.root.iterdir()} - before if not n.endswith(".log")]
        if new and (alice.job_dir(new[0]) / "started").exists():
            break
        assert time.monotonic() < deadline and caller.poll() is None, "the job did not start"
        time.sleep(0.2)
    (job,) = new
    caller.kill()  # SIGKILL of runuser's whole session
    subprocess.run(["pkill", "-KILL", "-f", f"^{DELEGATE} submit --wait -- sh -c sleep 3; echo reattached"])
    caller.wait()
    # A new process, knowing only the id.
    st = alice.wait(job, timeout=180)
    assert st["state"] == "failed" and st["exit_code"] == 5, st
    r = alice.run("logs", job)
    assert r.stdout == "reattached-output\n", r
    r = alice.run("wait", job)
    assert r.returncode == 5


# ---------------------------------------------------------------------------
# A full delegate root
# ---------------------------------------------------------------------------


@pytest.fixture
def tiny_root(alice):
    """A 256 KiB filesystem as alice's delegate root (below /home, as the policy wants)."""
    with testlib.tiny_root(alice.home, alice.uid, alice.gid) as root:
        yield root


def run_with_root(user, root, *args, timeout=120):
    return user.run(*args, timeout=timeout, env_extra={"DELEGATE_ROOT": str(root)})


@pytest.mark.parametrize("when", ["before-start", "during-run"])
def test_delegate_root_full(alice, tiny_root, when):
    fill = "head -c 1M /dev/zero > /job/fill; echo more-output"
    cmd = fill if when == "before-start" else "sleep 1; " + fill
    if when == "before-start":
        # The disk is full before the runner records the start.
        r = run_with_root(alice, tiny_root, "submit", "--hold", "--", "sh", "-c", "echo never")
        assert r.returncode == 0, r.stderr
        job = r.stdout.split()[-1]
        d = tiny_root / job
        alice.as_user("sh", "-c", f"head -c 1M /dev/zero > {tiny_root}/filler", check=False)
        alice.as_user("scontrol", "release", (d / "slurm-id").read_text().strip())
    else:
        r = run_with_root(alice, tiny_root, "submit", "--", "sh", "-c", cmd)
        assert r.returncode == 0, r.stderr
        job = r.stdout.split()[-1]
    r = run_with_root(alice, tiny_root, "wait", "--json", "--timeout", "300s", job, timeout=330)
    r = run_with_root(alice, tiny_root, "status", "--json", job)
    assert r.returncode == 0, r.stderr  # the status is still shown
    (st,) = json.loads(r.stdout)
    # A clear failure that names the cause; never a completed job with lost output.
    assert st["state"] in ("lost", "failed"), st
    assert "No space left on device" in st["reason"], st
    assert containers_with_label(job) == []
    # No half-written record is ever read as valid: the outcome is absent or whole.
    d = tiny_root / job
    assert not (d / "outcome").exists() or run_with_root(alice, tiny_root, "result", job).returncode != 1
    assert not [p for p in os.listdir(d) if p.startswith(".")], os.listdir(d)
