"""GPUs end to end on the local cluster, with stand-in devices.

build_cluster.sh --local (DELEGATE_LOCAL_GPUS=standin:2, which tests/run.sh sets) makes
two character devices /dev/delegate-gpu0 and 1 and declares them as the
node's GRES gpu in gres.conf. The tests raise the site policy's max_gpus to
1 while they run, then:

- a job asking for 1 of the 2 sees exactly one, the one Slurm chose: the
  node is exclusive, so Slurm allocates both to the job (GRES=gpu:2(IDX:0-1));
  the sandbox gets the first of Slurm's allocation (slurmctld's GRES index
  mapped through gres.conf, read here independently of the agent), with
  CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES = 0;
- a job asking for none sees none (and NVIDIA_VISIBLE_DEVICES=void even if
  its spec asks for all);
- asking for 2 (beyond max_gpus = 1) is refused with the reason, no container;
- a hand-made sbatch of a delegate script with --gres on the command line is
  refused by the slurmctld gate;
- `sandbox-runner probe` reports the GPU path (devices) and the two GPUs;
- the call's fingerprint names the GPU it was given, and no other.
"""

import json
import os
import re
from pathlib import Path

import pytest
from conftest import RUNNER, sh

POLICY = Path("/etc/delegate/policy.toml")
GRES_CONF = Path("/etc/slurm/gres.conf")
PREFIX = "/dev/delegate-gpu"
# Prints what the sandbox sees: the stand-in GPU nodes (name -> rdev) and the GPU variables.
SHOW = (
    "import json, os; "
    "devs = {'/dev/' + n: os.stat('/dev/' + n).st_rdev for n in sorted(os.listdir('/dev')) "
    "if n.startswith('delegate-gpu')}; "
    "print(json.dumps({'devs': devs, 'env': {k: v for k, v in os.environ.items() "
    "if k in ('CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES')}}))"
)


def gres_files() -> list[str]:
    """The node's GPU device files in gres.conf order (Slurm's index order)."""
    text = GRES_CONF.read_text() if GRES_CONF.exists() else ""
    m = re.search(r"^NodeName=\S+ Name=gpu File=(\S+)$", text, re.M)
    if not m:
        return []
    files = m.group(1)
    b = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", files)
    if not b:
        return files.split(",")
    return [f"{b.group(1)}{i}" for i in range(int(b.group(2)), int(b.group(3)) + 1)]


@pytest.fixture(scope="module")
def standins():
    files = gres_files()
    if len(files) < 2 or not all(f.startswith(PREFIX) for f in files):
        pytest.fail(
            f"the local cluster declares no stand-in GPUs in {GRES_CONF} "
            "(build_cluster.sh --local up with DELEGATE_LOCAL_GPUS=standin:2, as tests/run.sh runs it)",
            pytrace=False,
        )
    return files


@pytest.fixture
def max_gpus_1(standins):
    old = POLICY.read_text()
    keep = [ln for ln in old.splitlines() if not re.match(r"\s*(max_gpus|gpu_mode)\s*=", ln)]
    POLICY.write_text("\n".join([*keep, "max_gpus = 1", 'gpu_mode = "auto"']) + "\n")
    try:
        yield standins
    finally:
        POLICY.write_text(old)


def seen(user, job) -> dict:
    out = (user.job_dir(job) / "stdout").read_text()
    return json.loads(out.strip().splitlines()[-1])


def slurm_gpu_indexes(user, job) -> list[int]:
    """slurmctld's record of the job's GPUs (as root): GRES=gpu...(IDX:...)."""
    sid = (user.job_dir(job) / "slurm-id").read_text().split()[0]
    out = sh("scontrol", "show", "job", "-d", sid).stdout
    m = re.search(r"^\s+Nodes=\S+ .*GRES=gpu[^(\s]*\(IDX:([0-9,-]+)\)", out, re.M)
    assert m, out
    idx = []
    for r in m.group(1).split(","):
        a, _, b = r.partition("-")
        idx.extend(range(int(a), int(b or a) + 1))
    return idx


def test_one_of_two_gpus_is_exactly_the_allocated_one(alice, max_gpus_1):
    files = max_gpus_1
    # The student's own environment names the other GPU, and all of them:
    # the agent decides from Slurm, never from the job's variables.
    forged = (
        "--env",
        "CUDA_VISIBLE_DEVICES=1",
        "--env",
        "NVIDIA_VISIBLE_DEVICES=all",
        "--env",
        "SLURM_JOB_GPUS=0,1",
    )
    job = alice.submit("python3", "-c", SHOW + "; import time; time.sleep(3)", opts=("--gpus", "1", *forged))
    alice.wait_started(job, timeout=120)
    # Ask slurmctld while the job runs (a finished job's GRES detail is gone).
    idx = slurm_gpu_indexes(alice, job)
    st = alice.wait(job)
    assert st["state"] == "completed", st
    s = seen(alice, job)
    assert len(idx) >= 1, idx
    chosen = files[idx[0]]
    assert list(s["devs"]) == [chosen], (s, idx, files)
    assert s["devs"][chosen] == os.stat(chosen).st_rdev, s
    assert s["env"] == {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "0"}, s
    log = Path("/var/log/delegate/agent.log").read_text(errors="replace")
    assert f'GPUs ["{chosen}"] (devices)' in log
    # The fingerprint names the GPU given, by its device and the driver's
    # index (its minor number); no NVIDIA driver here to say more.
    minor = os.minor(os.stat(chosen).st_rdev)
    shown = alice.run("result", job).stdout
    assert f"gpu 0:     unknown ({chosen}, index {minor}) · unknown" in shown, shown
    assert "gpu 1:" not in shown, shown


def test_calls_sharing_an_allocation_each_get_the_gpu(alice, max_gpus_1):
    # --count 2: one sbatch (the shared-allocation script with the --gres
    # line), each call in its own sandbox with the same one GPU.
    r = alice.run("submit", "--gpus", "1", "--count", "2", "--time", "1m", "--", "python3", "-c", SHOW)
    assert r.returncode == 0, r.stderr
    jobs = r.stdout.split()
    assert len(jobs) == 2, r.stdout
    for job in jobs:
        st = alice.wait(job)
        assert st["state"] == "completed", st
        s = seen(alice, job)
        assert list(s["devs"]) == [max_gpus_1[0]], s
        assert s["env"]["CUDA_VISIBLE_DEVICES"] == "0", s


def test_no_gpus_asked_sees_none(alice, max_gpus_1):
    job = alice.submit("python3", "-c", SHOW, opts=("--env", "NVIDIA_VISIBLE_DEVICES=all"))
    st = alice.wait(job)
    assert st["state"] == "completed", st
    s = seen(alice, job)
    assert s["devs"] == {}, s
    assert s["env"] == {"NVIDIA_VISIBLE_DEVICES": "void"}, s
    assert "gpu 0:" not in alice.run("result", job).stdout


def test_gpus_beyond_the_policy_are_refused(alice, max_gpus_1):
    # The client refuses before anything is written or submitted (the
    # runner checks the same policy for a job directory made by hand).
    before = sorted(alice.root.iterdir())
    r = alice.run("submit", "--gpus", "2", "--", "python3", "-c", SHOW)
    assert r.returncode != 0
    assert r.stderr.strip() == (
        "delegate: error: the site does not allow this job: gpus 2 is more than the site maximum of 1"
    ), r.stderr
    assert sorted(alice.root.iterdir()) == before


def test_gres_outside_the_script_is_refused_by_the_gate(alice, standins):
    # A job directory name of the right form below alice's root: the script
    # is one of delegate's own; only the command line adds --gres.
    d = alice.root / "20261123T103000-abcdef01"
    script = f"#!/bin/sh\nexec '{RUNNER}' '{d}'\n"
    r = alice.as_user(
        "sh", "-c", 'printf %s "$1" | sbatch --gres=gpu:1 --exclusive -o /dev/null', "sh", script, check=False
    )
    assert r.returncode != 0, r.stdout
    assert "--gres is asked for only with delegate's --gpus" in r.stderr, r.stderr


def test_probe_reports_the_gpu_path(alice, standins):
    r = alice.as_user(RUNNER, "probe", "--json")
    g = json.loads(r.stdout)["gpu_mode"]
    assert g["mode"] == "devices", g
    assert "2 GPU(s)" in g["detail"] and standins[0] in g["detail"], g
    d = alice.run("doctor")
    assert "gpus" in d.stdout and "devices" in d.stdout, d.stdout
