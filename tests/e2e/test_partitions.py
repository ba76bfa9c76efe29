"""delegate on a cluster shared with plain Slurm jobs (issue 33), against
this machine's real slurmctld: the site policy names delegate's partition
(`partitions = ["delegate"]`), a second partition `general` is created
here (scontrol, on this machine's one node), and the gate is rendered from
that policy as the deployment renders it. A student's plain Slurm jobs in
`general` pass the gate untouched; in delegate's partition they are
refused as ever; delegate's own jobs stay in delegate's partition; no job
moves between the two; `delegate doctor` names the node the two share.
(On this one machine `general` shares delegate's node, so the SPANK plugin
still refuses steps there: the node is delegate's.)"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, User, sh

GATE = Path("/etc/slurm/job_submit.lua")
POLICY = Path("/etc/delegate/policy.toml")
SHARED_POLICY = Path("/run/delegate-test-shared-policy.toml")
DEPLOY = REPO / "target" / "release" / "delegate-deploy"


def slurm_as(user: User, *cmd, env_extra=None) -> subprocess.CompletedProcess:
    return user.as_user(*cmd, check=False, timeout=120, env_extra=env_extra, in_home=True)


def install_gate(policy: Path) -> None:
    """The gate as `build_cluster.sh --local` renders it, from `policy`
    (slurmctld reloads job_submit.lua when it changes)."""
    admin_group = os.environ.get("DELEGATE_ADMIN_GROUP", "delegate-admin")
    text = sh(
        str(DEPLOY), "gate", "--runner", "/usr/local/bin/sandbox-runner", "--policy", str(policy),
        "--admin-group", admin_group, "--slurm-uid", str(pwd.getpwnam("slurm").pw_uid),
    ).stdout  # fmt: skip
    tmp = GATE.with_suffix(".test-tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(GATE)


@pytest.fixture(scope="module")
def shared():
    assert DEPLOY.exists(), f"{DEPLOY} is missing (build_cluster.sh --local builds it)"
    text = POLICY.read_text()
    text = re.sub(r"(?m)^partitions\s*=.*$", "", text) + '\npartitions = ["delegate"]\n'
    SHARED_POLICY.write_text(text)
    SHARED_POLICY.chmod(0o644)
    install_gate(SHARED_POLICY)
    sh(
        "scontrol",
        "create",
        "PartitionName=general",
        f"Nodes={os.uname().nodename.split('.')[0]}",
        "State=UP",
    )
    try:
        yield
    finally:
        sh("scontrol", "delete", "PartitionName=general", check=False)
        sh("scontrol", "update", "PartitionName=delegate", "Default=YES", check=False)
        install_gate(POLICY)
        SHARED_POLICY.unlink(missing_ok=True)


def job_id(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def test_a_students_plain_jobs_in_general_pass_and_in_delegates_partition_not(shared, alice):
    r = slurm_as(alice, "sbatch", "--parsable", "-p", "general", "--hold", "--wrap", "echo research")
    held = job_id(r)
    try:
        show = sh("scontrol", "show", "job", held).stdout
        # Untouched: no delegate comment, the requeue the student asked for kept.
        assert "Comment=delegate" not in show and "Partition=general" in show, show
        # ... and it cannot move into delegate's partition.
        r = slurm_as(alice, "scontrol", "update", f"JobId={held}", "Partition=delegate")
        assert r.returncode != 0, "a plain job moved into delegate's partition"
    finally:
        sh("scancel", held, check=False)
    r = slurm_as(alice, "sbatch", "-p", "delegate", "--wrap", "echo x")
    assert r.returncode != 0 and "only delegate's own jobs may run here" in r.stderr, r.stderr
    r = slurm_as(alice, "sbatch", "-p", "delegate,general", "--wrap", "echo x")
    assert r.returncode != 0 and "together with others" in r.stderr, r.stderr


def test_delegates_jobs_stay_in_delegates_partition(shared, alice):
    r = alice.run("submit", "--", "true", env_extra={"DELEGATE_PARTITION": "general"})
    assert r.returncode != 0 and "run only in its partitions (delegate)" in r.stderr, r.stderr
    r = alice.run("submit", "--hold", "--", "true", env_extra={"DELEGATE_POLICY": str(SHARED_POLICY)})
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    try:
        sid = alice.job_dir(job).joinpath("slurm-id").read_text().split()[0]
        assert "Partition=delegate" in sh("scontrol", "show", "job", sid).stdout
        r = slurm_as(alice, "scontrol", "update", f"JobId={sid}", "Partition=general")
        assert r.returncode != 0, "a delegate job moved out of delegate's partition"
    finally:
        alice.run("cancel", job)


def test_the_default_partition_is_slurms(shared, alice):
    """A plain `sbatch` without -p goes to Slurm's default partition: with
    delegate's the default it is refused; with `general` the default it
    passes and runs there (the gate reads the default from the partitions
    Slurm offers and sets it as the job's partition)."""
    r = slurm_as(alice, "sbatch", "--wrap", "echo x")
    assert r.returncode != 0 and "only delegate's own jobs may run here" in r.stderr, r.stderr
    sh("scontrol", "update", "PartitionName=general", "Default=YES")
    try:
        job = job_id(slurm_as(alice, "sbatch", "--parsable", "--hold", "--wrap", "echo research"))
        try:
            assert "Partition=general" in sh("scontrol", "show", "job", job).stdout
        finally:
            sh("scancel", job, check=False)
    finally:
        sh("scontrol", "update", "PartitionName=delegate", "Default=YES")


def test_doctor_names_a_node_shared_with_another_partition(shared, alice):
    r = alice.run("--json", "doctor", env_extra={"DELEGATE_POLICY": str(SHARED_POLICY)})
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    c = checks["partitions"]
    assert not c["ok"] and "is in delegate's partition delegate and in general" in c["detail"], c
