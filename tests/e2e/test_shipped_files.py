"""Files a student ships with a job (`delegate submit --file PATH`, a jobs
file's `files:`): copied into the job directory before submission and seen
as /job/NAME in the sandbox; links out of a shipped directory are left out;
a shipment over the site's job size (max_job_bytes) or naming delegate's
own files is refused in one sentence with nothing left behind; what the
student cannot read cannot be shipped; a forged manifest is refused by the
runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest


@pytest.fixture
def tmp_path(alice):
    """A directory of the student's own, in their home (what they ship
    must be theirs to read)."""
    d = alice.home / f"ship-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _tree(user, tmp_path):
    d = tmp_path / "project"
    (d / "data").mkdir(parents=True)
    (d / "train.py").write_text("import os\nprint('train ran', sorted(os.listdir('/job/data')))\n")
    (d / "data" / "a.csv").write_text("1,2\n")
    os.symlink("a.csv", d / "data" / "same.csv")
    os.symlink("/etc/hostname", d / "data" / "out")
    for root, dirs, files in os.walk(tmp_path):
        for n in dirs + files:
            os.lchown(os.path.join(root, n), user.uid, user.gid)
    os.chown(tmp_path, user.uid, user.gid)
    return d


def test_shipped_files_are_in_job(alice, tmp_path):
    d = _tree(alice, tmp_path)
    r = alice.run(
        "submit",
        "--wait",
        "--file",
        str(d / "train.py"),
        "--file",
        str(d / "data"),
        "--",
        "python3",
        "/job/train.py",
    )
    assert r.returncode == 0, r.stderr
    assert "train ran ['a.csv', 'same.csv']" in r.stdout, r.stdout
    assert "not shipped: the link leads out of" in r.stderr, r.stderr


def test_jobs_file_files(alice, tmp_path):
    d = _tree(alice, tmp_path)
    jobs = d / "jobs.yml"
    jobs.write_text("jobs:\n  - command: [python3, /job/train.py]\n    files: [train.py, data]\n")
    os.chown(jobs, alice.uid, alice.gid)
    r = alice.run("submit", "--wait", "-f", str(jobs))
    assert r.returncode == 0, r.stderr
    assert "train ran ['a.csv', 'same.csv']" in r.stdout, r.stdout


def test_refusals_leave_nothing_behind(alice, tmp_path):
    d = _tree(alice, tmp_path)
    before = sorted(os.listdir(alice.root)) if alice.root.exists() else []
    big = d / "big"
    subprocess.run(["truncate", "-s", "2G", str(big)], check=True)
    os.chown(big, alice.uid, alice.gid)
    r = alice.run("submit", "--file", str(d / "train.py"), "--file", str(big), "--", "true")
    assert r.returncode == 1 and "larger than the site's job size limit" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    spec = d / "spec"
    spec.write_text("x")
    os.chown(spec, alice.uid, alice.gid)
    r = alice.run("submit", "--file", str(spec), "--", "true")
    assert r.returncode == 1 and "one of delegate's own files" in r.stderr, r.stderr
    # Security round 4, item 4: names delegate writes after the call
    # (its records, read back by `delegate result`) are reserved too.
    for name in ("repeats", "fingerprint", "cfiddle", "stdout.0"):
        forged = d / name
        forged.write_text("XEON9999 FORGED-KERNEL-1")
        os.chown(forged, alice.uid, alice.gid)
        r = alice.run("submit", "--file", str(forged), "--", "true")
        assert r.returncode == 1 and "one of delegate's own files" in r.stderr, (name, r.stderr)
    r = alice.run("submit", "--file", "/etc/shadow", "--", "true")
    assert r.returncode == 1 and "cannot ship /etc/shadow" in r.stderr, r.stderr
    r = alice.run("submit", "--count", "3", "--file", str(big), "--", "true")
    assert r.returncode == 1, r.stderr
    after = sorted(os.listdir(alice.root)) if alice.root.exists() else []
    assert after == before, "a refused shipment left job directories"


def test_a_forged_manifest_is_refused_by_the_runner(alice):
    """A student who writes their own job directory cannot make the runner
    accept one of delegate's files as a shipped one."""
    job = alice.submit("true", opts=("--hold",))
    d = alice.root / job
    alice.as_user("sh", "-c", f"printf 'outcome\\n' > {d}/shipped")
    subprocess.run(["scontrol", "release", alice.status(job)["slurm_id"]], check=True)
    st = alice.wait(job)
    assert st["state"] == "failed" and "delegate's own files" in st["reason"], st
