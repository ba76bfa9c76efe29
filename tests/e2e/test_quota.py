"""Per-student disk quotas on the shared home (build_cluster.d/quota.sh),
on a real filesystem that has them: a btrfs filesystem in a loop file,
mounted below /home (where the job gate wants job directories). This
machine's kernel has no CONFIG_QUOTA, so ext4/xfs user quotas cannot be
shown here; btrfs qgroups need no such option.

The roster (`build_cluster.sh accounts add --csv`) makes each new student's
home a subvolume limited to DELEGATE_HOME_QUOTA; re-running it changes
nothing; `accounts list` shows use and limit; a job that writes past the
limit ends with a reason a student can act on (never hangs, never
"succeeds"), and once space is freed the student's next job runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, User, sh

MOUNT = Path("/home/delegate-quota-test")
IMAGE = Path("/var/lib/delegate/test-quota.btrfs")
STUDENT = "delegate-quota1"
LIMIT = "48M"


def _btrfs_problem() -> str | None:
    if shutil.which("mkfs.btrfs") is None or shutil.which("btrfs") is None:
        return "btrfs-progs is not installed (build_cluster.sh --local installs it)"
    with open("/proc/filesystems") as f:
        if "btrfs" not in f.read():
            return "the kernel has no btrfs"
    return None


def build_cluster(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DELEGATE_ROSTER_HOME_BASE=str(MOUNT), DELEGATE_HOME_QUOTA=LIMIT)
    return subprocess.run(
        [str(REPO / "build_cluster.sh"), *args], capture_output=True, text=True, timeout=300, env=env, cwd="/"
    )


@pytest.fixture(scope="module")
def quota_home(tmp_path_factory):
    problem = _btrfs_problem()
    if problem:
        pytest.fail(f"cannot test quotas: {problem}", pytrace=False)
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text(f"username,name\n{STUDENT},Quota Student\n")
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    sh("umount", "-l", str(MOUNT), check=False)
    subprocess.run(["truncate", "-s", "0", str(IMAGE)], check=True)
    subprocess.run(["truncate", "-s", "400M", str(IMAGE)], check=True)
    sh("mkfs.btrfs", "-q", "-f", str(IMAGE))
    MOUNT.mkdir(exist_ok=True)
    sh("mount", "-o", "loop", str(IMAGE), str(MOUNT))
    try:
        yield roster
    finally:
        build_cluster("accounts", "remove", STUDENT)
        sh("umount", "-l", str(MOUNT), check=False)
        MOUNT.rmdir()
        IMAGE.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def student(quota_home):
    r = build_cluster("accounts", "add", "--csv", str(quota_home))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"quota: {STUDENT} limited to {LIMIT}" in r.stdout, r.stdout
    return User(STUDENT)


def qgroup_limit(home: Path) -> str:
    rootid = sh("btrfs", "inspect-internal", "rootid", str(home)).stdout.strip()
    rows = sh("btrfs", "qgroup", "show", "-re", "--raw", str(MOUNT)).stdout.splitlines()
    (row,) = [r.split() for r in rows if r.split()[:1] == [f"0/{rootid}"]]
    return row[3]


def test_roster_gives_each_new_home_its_own_limit(student):
    assert student.home.parent == MOUNT
    assert os.stat(student.home).st_ino == 256, "the home is not a btrfs subvolume"
    assert oct(os.stat(student.home).st_mode & 0o777) == "0o700"
    assert int(qgroup_limit(student.home)) == 48 << 20
    # The student's own writes stop at the limit, whatever they try.
    r = student.as_user("dd", "if=/dev/zero", f"of={student.home}/fill", "bs=1M", "count=80", check=False)
    assert r.returncode != 0 and "Disk quota exceeded" in r.stderr, r.stderr
    os.unlink(student.home / "fill")


def test_roster_rerun_changes_nothing_and_list_shows_the_disk(student, quota_home):
    before = sh("stat", "-c", "%i %U %a", str(student.home)).stdout
    r = build_cluster("accounts", "add", "--csv", str(quota_home))
    assert r.returncode == 0, r.stderr
    assert "created" not in r.stdout, r.stdout
    assert sh("stat", "-c", "%i %U %a", str(student.home)).stdout == before
    assert int(qgroup_limit(student.home)) == 48 << 20
    listing = build_cluster("accounts", "list").stdout
    (line,) = [x for x in listing.splitlines() if x.startswith(STUDENT + " ")]
    assert "48.00MiB" in line, listing


def test_a_job_past_the_quota_ends_with_a_reason_and_the_next_runs(student):
    job = student.submit("sh", "-c", "dd if=/dev/zero of=/job/big bs=1M count=100; echo done")
    st = student.wait(job, timeout=180)
    assert st["state"] in ("failed", "lost"), st
    assert "quota" in st["reason"].lower() and "free space" in st["reason"], st["reason"]
    # The student frees space; the next job runs and records its outcome.
    shutil.rmtree(student.job_dir(job))
    job2 = student.submit("sh", "-c", "echo fits")
    st2 = student.wait(job2, timeout=180)
    assert st2["state"] == "completed", st2
    assert "fits" in student.run("logs", job2).stdout


def test_a_calls_output_stops_at_the_quota(student):
    """Security round 3, item 7: the output is written with the student's
    identity, so it counts against and stops at their quota like any
    write of theirs (100 MB of output, 48 MB of quota)."""
    job = student.submit("sh", "-c", "head -c 100M /dev/zero; echo done")
    st = student.wait(job, timeout=180)
    assert st["state"] != "completed" or "quota" in st["reason"].lower(), st
    used = sh("du", "-sb", str(student.home)).stdout.split()[0]
    assert int(used) <= 48 << 20, used
    shutil.rmtree(student.job_dir(job))


def test_a_roster_that_cannot_be_used_creates_nothing(tmp_path):
    """The whole roster is checked (deploy/src/roster.rs) before any account
    is made: a forged user name, a ':' in a name, a role that is neither
    student nor instructor, a user twice: each is named with its line and
    no account of that roster appears."""
    cases = {
        "root;touch /tmp/pwned,x": "not a valid user name",
        "zed2,Zed:0:0": "':' is not allowed in the name",
        "zed2,Zed,,teacher": "role 'teacher' is neither student nor instructor",
        "zed1,Again": "zed1 is already on line 2",
    }
    for bad, why in cases.items():
        roster = tmp_path / "roster.csv"
        roster.write_text(f"username,full name\nzed1,Zed One\n{bad}\n")
        r = build_cluster("accounts", "add", "--csv", str(roster))
        assert r.returncode != 0, r.stdout
        assert "roster line 3: " in r.stderr and why in r.stderr, r.stderr
        assert subprocess.run(["id", "zed1"], capture_output=True).returncode != 0, (
            "an account of a refused roster"
        )
    assert not Path("/tmp/pwned").exists()
