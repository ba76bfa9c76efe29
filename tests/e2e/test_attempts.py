"""Issue 52 on the single machine: a call whose node is lost mid-call (here
the administrator sets the node down, which is what slurmctld does to a
machine that stops answering) runs again from a fresh start, within its
retries; its history is recorded and shown; once the retries are spent it
ends lost naming every attempt. The same on the emulated worker machines,
with machines killed: tests/cluster/test_machines.py.
"""

from __future__ import annotations

import time

from conftest import containers_with_label, sh

import testlib

# The call: says whether anything of an earlier attempt is in its /job,
# leaves a mark, and runs long enough to be caught mid-call.
CALL = "ls /job/*.mark 2>/dev/null && echo LEAKED; touch /job/$$.mark; echo ran-on-$(hostname); sleep 12"


def node() -> str:
    return sh("sinfo", "-h", "-N", "-o", "%N").stdout.split()[0]


def node_lost(user, job: str, attempt: int) -> None:
    """Waits until attempt `attempt` of `job` runs, then sets its node down
    (Slurm queues the call again) and back into service."""
    started = user.job_dir(job) / "started"
    deadline = time.monotonic() + 180
    while not (started.exists() and len(attempts(user, job)) == attempt - 1):
        assert time.monotonic() < deadline, f"attempt {attempt} of {job} never started: {user.status(job)}"
        time.sleep(0.2)
    n = node()
    sh("scontrol", "update", f"nodename={n}", "state=down", "reason=delegate test: node lost")
    deadline = time.monotonic() + 60
    while "idle" not in sh("sinfo", "-h", "-N", "-o", "%T").stdout:
        assert time.monotonic() < deadline, sh("sinfo", "-N", "-o", "%N %T %E").stdout
        sh("scontrol", "update", f"nodename={n}", "state=resume", check=False)
        time.sleep(1)


def hasten(user, job: str) -> None:
    """Once the call's allocation, queued again, waits only for the begin
    time Slurm gives a requeued job (slurm.conf's cred_expire, 30 s: the
    first test shows it run again after it), makes it eligible at once, as
    root (the wait is Slurm's, not what these tests show)."""
    sid = (user.job_dir(job) / "slurm-id").read_text().split()[0]

    def held() -> bool:
        return sh("squeue", "-h", "-j", sid, "-o", "%T %r").stdout.split() == ["PENDING", "BeginTime"]

    def old_instance_gone() -> bool:
        # The lost attempt's slurmstepd still on the node (it is this
        # machine) makes Slurm see the job twice when the requeued one
        # starts there at once: `Duplicate jobid`, node drained. A real
        # lost machine is gone; here it must be, before the hurry.
        gone = sh("pgrep", "-f", rf"^slurmstepd: \[{sid}\.", check=False).returncode == 1
        return gone and "completing" not in sh("sinfo", "-h", "-N", "-o", "%T").stdout

    testlib.wait_until(f"Slurm job {sid} pending on its begin time", held, 60, 0.5)
    testlib.wait_until(f"the lost attempt of Slurm job {sid} gone from the node", old_instance_gone, 60, 0.2)
    sh("scontrol", "update", f"jobid={sid}", "StartTime=now")


def attempts(user, job: str) -> list[str]:
    f = user.job_dir(job) / "attempts"
    return f.read_text().splitlines() if f.exists() else []


def test_a_call_whose_node_is_lost_runs_again_from_a_fresh_start(alice):
    job = alice.submit("sh", "-c", CALL, opts=("--time", "2m"))
    node_lost(alice, job, 1)
    pending = alice.wait_for_state(job, {"pending"}, timeout=60)
    assert "was lost: Slurm queued it again" in pending["reason"], pending
    st = alice.wait(job, timeout=240)
    assert st["state"] == "completed", st
    assert "ran again on" in st["reason"] and "(attempt 2)" in st["reason"], st
    out = (alice.job_dir(job) / "stdout").read_text()
    assert "LEAKED" not in out and out.count("ran-on-") == 1, out
    (lost,) = attempts(alice, job)
    assert lost.startswith(f"1 {node()} "), lost
    aside = alice.root / f"{job}.attempt-1"
    assert list(aside.glob("*.mark")) and (aside / "started").exists(), sorted(aside.iterdir())
    assert len(list(alice.job_dir(job).glob("*.mark"))) == 1
    assert not (aside / "outcome").exists(), "the lost attempt wrote an outcome"
    assert containers_with_label(job) == []
    listed = alice.run("list")
    assert job in listed.stdout and f"{job}.attempt" not in listed.stdout, listed.stdout


def test_a_call_whose_retries_are_spent_ends_lost_naming_every_attempt(alice):
    job = alice.submit("sh", "-c", CALL, opts=("--time", "2m", "--retries", "1"))
    node_lost(alice, job, 1)
    hasten(alice, job)
    node_lost(alice, job, 2)
    hasten(alice, job)  # (its retries spent, its next start ends it lost)
    st = alice.wait(job, timeout=240)
    assert st["state"] == "lost", st
    assert "its node was lost on every attempt (attempt 1 on" in st["reason"], st
    assert "attempt 2 on" in st["reason"] and "its retries" in st["reason"], st
    assert len(attempts(alice, job)) == 2
    assert not (alice.job_dir(job) / "started").exists(), "a third attempt ran"


def test_retries_past_the_sites_bound_are_refused_in_one_sentence(alice):
    r = alice.run("submit", "--retries", "11", "--", "true")
    assert r.returncode != 0
    assert "retries 11 is more than the site maximum of 2" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
