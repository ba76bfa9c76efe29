"""Jobs files (`delegate submit -f jobs.yml`): a list of jobs checked whole
before anything is submitted, submitted together, followed with `status -f`
and `wait -f`. Real Slurm, real sandboxes, as an ordinary student."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from conftest import User

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import testlib

TRAIN = """\
import json, os


def main(lr, epochs=1):
    loss = 1.0
    for _ in range(epochs):
        loss *= 1 - lr
    with open("/job/metrics.json", "w") as f:
        json.dump({"lr": lr, "epochs": epochs, "loss": loss, "index": os.environ.get("DELEGATE_INDEX")}, f)
    return {"loss": round(loss, 6)}
"""

JOBS = """\
defaults:
  time: 5m
  mem: 512M
jobs:
  - name: lr-small
    python: train:main
    args: [0.1]
    kwargs: {epochs: 3}
  - name: sweep
    python: train:main
    args: [0.5]
    count: 2
  - name: shell
    command: echo "hello $GREETING" > /job/hello; cat /job/hello
    env: {GREETING: hi}
    cpus: 1
"""


@pytest.fixture
def workdir(alice: User):
    d = alice.home / f"jobsfile-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    shutil.chown(d, alice.uid, alice.gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def write(d: Path, user: User, name: str, text: str) -> Path:
    p = d / name
    p.write_text(text)
    os.chown(p, user.uid, user.gid)
    return p


def job_dirs(user: User) -> set[str]:
    return {p.name for p in user.root.iterdir() if p.is_dir() and not p.name.startswith(".")}


def test_a_jobs_file_runs_every_job_and_is_followed_by_name(alice, workdir):
    write(workdir, alice, "train.py", TRAIN)
    jobs = write(workdir, alice, "jobs.yml", JOBS)
    r = alice.run("--json", "submit", "-f", str(jobs))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["job_name"], len(x["calls"])) for x in rows] == [("lr-small", 1), ("sweep", 2), ("shell", 1)]
    w = alice.run("wait", "-f", str(jobs), "--timeout", "300s", timeout=360)
    assert w.returncode == 0, w.stderr
    st = json.loads(alice.run("--json", "status", "-f", str(jobs)).stdout)
    assert [(s["job_name"], s["state"]) for s in st] == [
        ("lr-small", "completed"),
        ("sweep", "completed"),
        ("sweep", "completed"),
        ("shell", "completed"),
    ]
    text = alice.run("status", "-f", str(jobs)).stdout
    assert text.splitlines()[0].split()[:2] == ["JOB", "ID"] and "lr-small" in text, text
    ids = [c["id"] for x in rows for c in x["calls"]]
    # The Python jobs: the function's value on stdout, its results in the job dir.
    out = alice.run("logs", ids[0]).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"loss": 0.729}, out
    metrics = [json.loads((alice.job_dir(i) / "metrics.json").read_text()) for i in ids[:3]]
    assert [(m["lr"], m["epochs"], m["index"]) for m in metrics] == [
        (0.1, 3, None),
        (0.5, 1, "0"),
        (0.5, 1, "1"),
    ]
    # The command job: a string is run by sh -c, with the file's env.
    assert alice.run("logs", ids[3]).stdout.strip() == "hello hi"


def test_every_problem_is_named_with_its_line_and_nothing_is_submitted(alice, workdir):
    bad = write(
        workdir,
        alice,
        "bad.yml",
        "jobs:\n"
        "  - name: a\n"
        "    command: [true]\n"
        "    cpus: 0\n"
        "  - python: nothere:main\n"
        "    colour: red\n"
        "  - name: a\n"
        "    command: [true]\n"
        "    mem: lots\n",
    )
    before = job_dirs(alice)
    r = alice.run("submit", "-f", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert "5 problems; nothing was submitted" in lines[0], r.stderr
    for n, words in ((4, "cpus"), (5, "nothere.py"), (6, "colour"), (7, "second job named `a`"), (9, "mem")):
        assert any(f"bad.yml:{n}:" in line and words in line for line in lines), (n, words, r.stderr)
    assert job_dirs(alice) == before
    # Syntax errors too, with their line.
    broken = write(workdir, alice, "broken.yml", "jobs:\n  - command: [true\n  - name: x\n")
    r = alice.run("submit", "-f", str(broken))
    assert r.returncode == 1 and "broken.yml:" in r.stderr, r.stderr
    assert job_dirs(alice) == before


def test_the_site_policy_is_checked_for_the_whole_file_first(alice, workdir):
    f = write(
        workdir,
        alice,
        "policy.yml",
        "jobs:\n  - command: [true]\n  - name: evil\n    command: [true]\n    image: not-allowed:latest\n",
    )
    before = job_dirs(alice)
    r = alice.run("submit", "-f", str(f))
    assert r.returncode == 1, r.stdout
    assert "policy.yml:3: job `evil`" in r.stderr and "not-allowed:latest" in r.stderr, r.stderr
    assert job_dirs(alice) == before


def test_all_or_nothing_when_slurm_refuses_a_later_submission(workdir):
    """Two jobs with different resources are two submissions; a QOS that
    allows one job makes Slurm refuse the second: the first is cancelled,
    the student gets the one-sentence limit message."""
    testlib.require_accounting()
    with testlib.tight_qos("delegate-carol"):
        carol = User("delegate-carol")
        d = carol.home / workdir.name
        d.mkdir(exist_ok=True)
        shutil.chown(d, carol.uid, carol.gid)
        try:
            f = write(
                d, carol, "two.yml", "jobs:\n  - command: [sleep, '60']\n  - command: [true]\n    cpus: 2\n"
            )
            r = carol.run("submit", "-f", str(f))
            assert r.returncode == 1, r.stdout
            assert "MaxSubmitJobsPerUser" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
            left = carol.run("--json", "status").stdout
            active = (
                [s for s in json.loads(left) if s["state"] in ("pending", "running")] if left.strip() else []
            )
            assert active == [], active
            assert carol.run("status", "-f", str(f)).returncode == 1
        finally:
            shutil.rmtree(d, ignore_errors=True)
