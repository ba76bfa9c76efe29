"""The multi-node deployment end to end: `build_cluster.sh deploy` (2
workers, as several containers on this machine), `status`, `test` (the
instructor's check), `down` -- and nothing of the stack is left behind.

Run by tests/run.sh (stage 7) as root, beside the single-machine stages
(its side lane): the local cluster runs its own jobs beside the stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from stacklib import HOME, OTHER, SCRIPT, STACK, STUDENT, as_user, cid, on, run

LABEL = f"label=com.docker.stack.namespace={STACK}"


def docker_ids(*args):
    r = run("docker", *args, "-q", "--filter", LABEL)
    return r.stdout.split() if r.returncode == 0 else []


def swarm_active():
    r = run("docker", "info", "--format", "{{.Swarm.LocalNodeState}}")
    return r.stdout.strip() == "active"


@pytest.fixture(scope="module")
def stack(course_stack):
    """The stack of two workers the stage's suites share (conftest.py)."""
    return course_stack.deploy


def test_status_shows_every_worker(stack):
    r = run(SCRIPT, "status")
    assert r.returncode == 0
    for node in ("worker1", "worker2"):
        assert node in r.stdout
        # The root agent of each worker, answering the probe.
        assert f"{node}: sandbox-agent pid " in r.stdout
    assert "answers the probe" in r.stdout and "does NOT answer" not in r.stdout
    assert "sandbox-agent pid none" not in r.stdout
    assert "JupyterLab" in r.stdout


def test_instructor_check(stack):
    r = run(SCRIPT, "test")
    assert r.returncode == 0, "build_cluster.sh test failed"
    assert "FAIL" not in r.stdout
    assert "all checks passed" in r.stdout


def test_deploy_is_idempotent(stack):
    r = run(SCRIPT, "deploy", "--workers", "2")
    assert r.returncode == 0
    # Every image reused, each said so (issue 44: the test passed whenever
    # the word "building" was absent, a silent deploy included).
    for image in ("delegate-sandbox", "delegate-cluster", "delegate-user", "delegate-db"):
        assert f"image {image}:latest: present" in r.stdout, image
    assert ": building" not in r.stdout + r.stderr


def test_local_cluster_untouched(stack):
    # The single-machine cluster on the host network still answers, and its
    # node is up (not down or drained by the stack beside it).
    r = run("sinfo", "-h", "-o", "%N %T")
    assert r.returncode == 0 and r.stdout.split(), r.stderr
    states = [line.split()[1] for line in r.stdout.splitlines()]
    assert all(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for s in states), r.stdout


# --- the lockdown on the stack (docs/security.md): a student on the user node
# reaches a worker only through delegate.
REFUSED = "delegate: only delegate's own jobs may run here"


def on_user_node(*cmd, user=None, timeout=300):
    return on("user", *cmd, user=user, timeout=timeout)


def test_stack_srun_on_a_worker_is_refused(stack):
    r = on_user_node("srun", "-w", "worker1", "-t", "1", "hostname", user=STUDENT)
    assert r.returncode != 0 and REFUSED in r.stderr
    assert "worker1" not in r.stdout


def test_stack_sbatch_wrap_and_salloc_are_refused(stack):
    r = on_user_node("sbatch", "-w", "worker1", "--wrap", "hostname", user=STUDENT)
    assert r.returncode != 0 and REFUSED in r.stderr
    r = on_user_node("salloc", "-w", "worker1", "true", user=STUDENT)
    assert r.returncode != 0 and REFUSED in r.stderr


@contextlib.contextmanager
def running_delegate_job():
    """A student's delegate job (`sleep 60`) once it has started: its Slurm
    id; cancelled afterwards."""
    r = on_user_node("delegate", "submit", "--", "sleep", "60", user=STUDENT)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    d = Path(HOME) / STUDENT / ".delegate" / "jobs" / job
    try:
        deadline = time.monotonic() + 180
        while not (d / "started").exists():
            assert time.monotonic() < deadline, "the delegate job did not start"
            time.sleep(0.5)
        yield (d / "slurm-id").read_text().split()[0]
    finally:
        on_user_node("delegate", "cancel", job, user=STUDENT)


def test_stack_step_into_own_job_is_refused(stack):
    """The SPANK plugin on the workers: srun --jobid=<own running delegate
    job> --overlap fails in slurmstepd, the job goes on."""
    with running_delegate_job() as sid:
        r = on_user_node(
            "srun",
            f"--jobid={sid}",
            "--overlap",
            "sh",
            "-c",
            "id; touch $HOME/stack-step-marker",
            user=STUDENT,
        )
        assert "uid=" not in r.stdout
        assert "launch failed" in r.stderr or "Plugin initialization failed" in r.stderr
        assert not (Path(HOME) / STUDENT / "stack-step-marker").exists()


def test_stack_sbcast_leaves_nothing_on_the_worker(stack):
    """`sbcast --jobid=<own running job> FILE /tmp/x` would have slurmd write
    the file on the worker as the student, outside any step (the SPANK gate
    never sees it) and outside the home's quota. From the user node a
    student cannot reach a worker's slurmd at all, so it is refused; behind
    that, the worker's /tmp and /var/tmp are bounded tmpfs, not the host's
    disk, and the epilog removes what the job's user left there when the
    job ends (here put there by root, as the student's)."""
    left = ("/tmp/sbcast-left-behind", "/var/tmp/sbcast-left-behind")
    with running_delegate_job() as sid:
        node = on_user_node("squeue", "-h", "-j", sid, "-o", "%N", user=STUDENT).stdout.strip()
        assert node.startswith("worker"), node
        for path in left:
            r = on_user_node("sbcast", f"--jobid={sid}", "/etc/hostname", path, user=STUDENT)
            assert r.returncode != 0, r.stdout
            assert on_node(node, "test", "-e", path).returncode != 0, f"sbcast wrote {path} on {node}"
            r = on_node(node, "install", "-o", STUDENT, "-m", "0600", "/etc/hostname", path)
            assert r.returncode == 0, r.stderr
        # Security round 5, item 3: what root's removal must not be led
        # into (find neither follows a link nor touches what is not the
        # student's; names are not parsed).
        plant = (
            f"ln -s /etc/hostname /tmp/link && chown -h {STUDENT} /tmp/link && "
            f"mkdir $'/tmp/new\\nline' && touch $'/tmp/new\\nline/-rf' && chown -R {STUDENT} /tmp/new* && "
            f"mkdir /tmp/theirs && touch /tmp/theirs/roots && chown {STUDENT} /tmp/theirs && "
            f"install -o {VICTIM} -m 0600 /dev/null /tmp/victims"
        )
        r = on_node(node, "bash", "-c", plant)
        assert r.returncode == 0, r.stderr
        for mnt in ("/tmp", "/var/tmp"):
            fs = on_node(node, "findmnt", "-n", "-o", "FSTYPE,SIZE", mnt).stdout.split()
            assert fs == ["tmpfs", "256M"], (
                f"{node}:{mnt} is {fs} (cluster.toml DELEGATE_STACK_WORKER_SCRATCH)"
            )
    deadline = time.monotonic() + 120
    while any(on_node(node, "test", "-e", p).returncode == 0 for p in left):
        assert time.monotonic() < deadline, f"the student's files outlived the job on {node}"
        time.sleep(2)
    log = on_node(node, "cat", "/var/log/delegate/epilog.log").stdout
    assert f"user={STUDENT} removed 1 of uid" in log, log[-2000:]
    after = on_node(
        node, "bash", "-c", "ls -A /tmp /tmp/theirs; test -s /etc/hostname && echo target-kept"
    ).stdout
    try:
        assert "link" not in after and "new" not in after, after
        assert "victims" in after and "roots" in after and "theirs" in after, after
        assert "target-kept" in after, after
    finally:
        on_node(node, "rm", "-rf", "/tmp/theirs", "/tmp/victims")


# --- the root agent on the workers (docs/security.md, "Who starts
# containers"): students reach the engine only through it.
NOT_A_TASK = "is not a Slurm batch task on this node"
VICTIM = "dlg-test2"  # the other test account


def on_node(node, *cmd, user=None, env=(), timeout=300):
    return on(node, *cmd, user=user, env=env, timeout=timeout)


@pytest.mark.parametrize("worker", ["worker1", "worker2"])
def test_stack_worker_runs_the_agent_and_hides_the_socket(stack, worker):
    r = on_node(worker, "pgrep", "-x", "-u", "0", "sandbox-agent")
    assert r.returncode == 0 and r.stdout.split(), "no root sandbox-agent on " + worker
    r = on_node(worker, "stat", "-c", "%a %U:%G", "/usr/local/bin/sandbox-runner")
    assert r.stdout.strip() == "755 root:root"  # not setgid
    r = on_node(worker, "stat", "-c", "%a %U", "/run/delegate-engine")
    assert r.stdout.strip() == "700 root"
    r = on_node(worker, "id", "-G", user=STUDENT)
    gid = on_node(worker, "stat", "-L", "-c", "%g", "/var/run/docker.sock").stdout.strip()
    assert gid and gid not in r.stdout.split()
    # The socket sits in a root-only directory: not even stat-able.
    r = on_node(worker, "stat", "-L", "/var/run/docker.sock", user=STUDENT)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    r = on_node(
        worker,
        "curl", "-fsS", "--max-time", "10", "--unix-socket", "/var/run/docker.sock",
        "http://engine/version",
        user=STUDENT,
    )  # fmt: skip
    assert r.returncode != 0 and '"ApiVersion"' not in r.stdout
    # The probe goes through the agent and is answered to anyone.
    r = on_node(worker, "/usr/local/bin/sandbox-runner", "probe", user=STUDENT, timeout=120)
    assert r.returncode == 0, r.stderr


def host_containers(label: str) -> list[str]:
    return run("docker", "ps", "-aq", "--filter", f"label={label}").stdout.split()


def test_stack_runner_by_hand_with_forged_job_id_is_refused(stack):
    """A student on a worker (simulated with docker exec as their uid: on
    real machines pam_slurm_adopt keeps them off) runs the runner by hand
    with SLURM_JOB_ID of another student's running job on that node: the
    agent refuses, no container is created, the other job goes on."""
    r = on_user_node("delegate", "submit", "--", "sleep", "120", user=VICTIM)
    assert r.returncode == 0, r.stderr
    victim = r.stdout.split()[-1]
    vdir = Path(HOME) / VICTIM / ".delegate" / "jobs" / victim
    own = []  # one held job of the student per attempt (each gets an outcome)
    for _ in range(2):
        r = on_user_node("delegate", "submit", "--hold", "--", "true", user=STUDENT)
        assert r.returncode == 0, r.stderr
        own.append(r.stdout.split()[-1])
    try:
        deadline = time.monotonic() + 180
        while not (vdir / "started").exists():
            assert time.monotonic() < deadline, "the victim's delegate job did not start"
            time.sleep(0.5)
        sid = (vdir / "slurm-id").read_text().split()[0]
        info = on_user_node("scontrol", "-o", "show", "job", sid).stdout
        node = next(f.split("=", 1)[1] for f in info.split() if f.startswith("BatchHost="))
        assert node.startswith("worker"), info
        assert len(host_containers(f"delegate.slurm-job={sid}")) == 1
        for job, forged in zip(own, ([f"SLURM_JOB_ID={sid}", f"SLURM_JOBID={sid}"], [])):
            odir = Path(HOME) / STUDENT / ".delegate" / "jobs" / job
            r = on_node(
                node, "/usr/local/bin/sandbox-runner", str(odir), user=STUDENT, env=forged, timeout=120
            )
            # (exit 0 when it could write the refusal as the own job's
            # outcome, 3 when it could not: never a container)
            assert r.returncode in (0, 3), r.stderr  # no panic (101)
            assert NOT_A_TASK in r.stderr, r.stderr
            assert "delegate: refused:" in r.stderr, r.stderr
            assert host_containers(f"delegate.job={job}") == []
        # The other student's node: still only their own sandbox.
        assert len(host_containers(f"delegate.slurm-job={sid}")) == 1
        assert not (vdir / "outcome").exists()
    finally:
        # (`delegate cancel` cancels a refused call's held Slurm job too:
        # none stays in the stack's queue, which is kept across deploys)
        for job in own:
            on_user_node("delegate", "cancel", job, user=STUDENT)
        on_user_node("delegate", "cancel", victim, user=VICTIM)


def test_stack_epilog_sweeps_this_workers_orphans(stack):
    """The workers' epilog removes, after any job on the node, a delegate
    container labelled with this node whose Slurm job is unknown (a pin the
    agent could not clean: an agent or worker killed), and leaves another
    node's alone."""
    image = os.environ.get("DELEGATE_SANDBOX_IMAGE", "delegate-sandbox:latest")
    ids = {}
    for node in ("worker1", "worker2"):
        r = run(
            "docker", "create",
            "--label", "delegate.slurm-job=none", "--label", f"delegate.node={node}",
            "--label", "delegate.job=stack-orphan-test", image, "true",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        ids[node] = r.stdout.strip()
    try:
        r = on_user_node(
            "sbatch", "--wait", "-Q", "-w", "worker1", "-t", "1", "-o", "/dev/null", "--wrap", "true"
        )
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 60
        while ids["worker1"] in run("docker", "ps", "-aq", "--no-trunc").stdout:
            assert time.monotonic() < deadline, "worker1's epilog left its orphan container"
            time.sleep(1)
        assert ids["worker2"] in run("docker", "ps", "-aq", "--no-trunc").stdout
    finally:
        run("docker", "rm", "-f", *ids.values())


# A student's tight loop of new connections to slurmctld's port (what a
# loop of squeue amounts to, without waiting for answers).
CONNECT_FLOOD = """
import socket
ok = 0
for _ in range(300):
    try:
        socket.create_connection(("head", 6817), timeout=0.2).close()
        ok += 1
    except OSError:
        pass
print(ok)
"""


def query_drops() -> dict[str, int]:
    """uid -> connections the user node's per-student rate limit dropped."""
    r = on("user", "iptables", "-L", "delegate-queries", "-v", "-n", "-x", quiet=True)
    assert r.returncode == 0, r.stderr
    drops = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) > 2 and f[2] == "DROP" and "owner" in f and "UID" in f:
            drops[f[f.index("match") + 1]] = int(f[0])
    return drops


def uid_of(user: str) -> str:
    return on("user", "id", "-u", user, quiet=True).stdout.strip()


def test_a_students_query_flood_is_bounded_on_the_user_node(stack):
    """Slurm 22.05 has no per-user RPC rate limit. On the user node each
    student's new connections to slurmctld and slurmdbd are limited
    (DELEGATE_RPC_RATE/BURST, iptables per uid; docs/security.md): a
    student's connect loop gets attempts dropped, another student's
    squeue meanwhile answers and is never dropped, the student cannot
    remove the limit, and the hub holds no CAP_NET_ADMIN."""
    flooder, other = uid_of(STUDENT), uid_of(OTHER)
    before = query_drops()
    assert flooder in before and other in before, before
    r = on_user_node("python3", "-c", CONNECT_FLOOD, user=STUDENT, timeout=200)
    assert r.returncode == 0, r.stderr
    ok = int(r.stdout.split()[-1])
    for _ in range(3):
        q = on_user_node("squeue", "-h", user=OTHER)
        assert q.returncode == 0, q.stderr
    after = query_drops()
    print(f"flood: {ok} of 300 connected; dropped {after[flooder] - before[flooder]}")
    assert ok < 300 and after[flooder] > before[flooder], (ok, before, after)
    assert after[other] == before[other], (before, after)
    r = on_user_node("iptables", "-F", "delegate-queries", user=STUDENT)
    assert r.returncode != 0
    assert query_drops().keys() == after.keys()
    hub = on("user", "sh", "-c", "grep CapBnd /proc/$(pgrep -o -f bin/jupyterhub)/status")
    assert int(hub.stdout.split()[-1], 16) & (1 << 12) == 0, hub.stdout  # CAP_NET_ADMIN = 12
    time.sleep(4)  # the flooder's bucket refills (burst / rate) for the next tests


@contextlib.contextmanager
def holding(user: str, script: str, *args: str):
    """SCRIPT (Python) run by USER on the user node, its pipes open; what it
    holds it keeps until its stdin closes, when the block ends."""
    p = subprocess.Popen(
        ["docker", "exec", "-i", *as_user(user), cid("user"), "python3", "-c", script, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield p
    finally:
        p.stdin.close()
        p.wait(timeout=60)


# A student who opens connections to slurmctld and holds them without a
# word: slurmctld serves at most 256 connections at once and waits up to
# MessageTimeout for each request, so enough idle ones would stop it
# answering anyone (slurmd on the workers likewise). Prints how many were
# held and refused, and what connecting to a worker's slurmd gave; holds
# them until stdin closes.
HOLD_CONNECTIONS = """
import socket, sys
held, refused = [], 0
for _ in range(40):
    try:
        held.append(socket.create_connection(("head", 6817), timeout=3))
    except OSError:
        refused += 1
try:
    socket.create_connection(("worker1", 6818), timeout=3).close()
    slurmd = "connected"
except OSError as e:
    slurmd = type(e).__name__
print(len(held), refused, slurmd, flush=True)
sys.stdin.read()
"""


def test_a_student_cannot_hold_slurms_connections(stack):
    """Per student, at most DELEGATE_RPC_CONNS (8) connections to Slurm are
    open at once from the user node and none reaches a worker's slurmd
    (docs/security.md): the rest are refused at once, slurmctld's server
    threads stay few, and another student's squeue answers meanwhile."""
    with holding(OTHER, HOLD_CONNECTIONS) as holder:
        held, refused, slurmd = holder.stdout.readline().split()
        threads = on("head", "sdiag").stdout
        q = on_user_node("squeue", "-h", user=STUDENT)
    print(f"held {held}, refused {refused}, slurmd: {slurmd}")
    assert int(held) == 8 and int(refused) == 32, (held, refused)
    assert slurmd == "ConnectionRefusedError", slurmd
    count = int(threads.split("Server thread count:")[1].split()[0])
    assert count <= 8 + 4, threads
    assert q.returncode == 0, q.stderr


# A student who holds silent connections to munged, which every Slurm
# command needs for its credential: munged serves a few at a time and gives
# each 2 s to speak, so with one munged for the node a few dozen held ones
# stopped everyone's squeue (10 s, then "Failed to receive message header").
# Prints how many were held, then what connecting to the shared socket and
# to another student's gave; holds them until stdin closes.
HOLD_MUNGE = """
import os, socket, sys
held = []
for _ in range(60):
    s = socket.socket(socket.AF_UNIX)
    s.connect(f"/run/munge-users/{os.environ['USER']}/munge.socket")
    held.append(s)
tried = []
for path in ("/run/munge/munge.socket.2", f"/run/munge-users/{sys.argv[1]}/munge.socket"):
    try:
        socket.socket(socket.AF_UNIX).connect(path)
        tried.append("connected")
    except OSError as e:
        tried.append(type(e).__name__)
print(len(held), *tried, flush=True)
sys.stdin.read()
"""


def test_a_students_silent_munge_connections_stop_only_their_own_commands(stack):
    """Each student has a munged of their own on the user node
    (docs/security.md): one who holds 60 silent connections to theirs
    cannot reach the shared one or another student's, and another
    student's squeue and munge work meanwhile."""
    with holding(STUDENT, HOLD_MUNGE, OTHER) as holder:
        line = holder.stdout.readline()
        q = [on_user_node("squeue", "-h", user=OTHER) for _ in range(3)]
        m = on_user_node(
            "sh",
            "-c",
            "munge -n -S /run/munge-users/$USER/munge.socket | unmunge -S /run/munge-users/$USER/munge.socket",
            user=OTHER,
        )
    assert line.split() == ["60", "PermissionError", "PermissionError"], (line, holder.stderr.read())
    for r in q:
        assert r.returncode == 0, r.stderr
    assert m.returncode == 0 and f"UID:             {OTHER} " in m.stdout, m.stdout + m.stderr
    # The configuration every Slurm command of the student reads names their own munged.
    conf = on_user_node("sh", "-c", 'grep ^AuthInfo "$SLURM_CONF"', user=STUDENT)
    assert conf.stdout.strip() == f"AuthInfo=socket=/run/munge-users/{STUDENT}/munge.socket", conf.stdout


def test_the_user_nodes_scratch_cannot_fill_the_hosts_disk(stack):
    """The user node's /tmp and /var/tmp were its container's layer, i.e.
    the host's disk, which Docker's and Slurm's state share: a student's
    notebook could fill it for the whole cluster. Now they are tmpfs of
    DELEGATE_USER_NODE_SCRATCH (1G; a student's files count against their
    own memory limit), and the logs of the students' munged, which a student
    can make write a line per bad request, a tmpfs of 32M."""
    for path, size in (("/tmp", "1G"), ("/var/tmp", "1G"), ("/var/log/munge/users", "32M")):
        # (as root: munge's log directory is closed to students, and findmnt
        # needs to enter it for the size)
        fs = on_user_node("findmnt", "-n", "-o", "FSTYPE,SIZE", path).stdout.split()
        assert fs == ["tmpfs", size], f"{path}: {fs}"
    r = on_user_node("fallocate", "-l", "2G", "/tmp/fill", user=STUDENT)
    on_user_node("rm", "-f", "/tmp/fill", user=STUDENT)
    assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr


@pytest.mark.parametrize("node", ["user", "worker1"])
def test_students_read_no_log_on_the_stack(stack, node):
    """Security round 3, item 5: the logs name every student's jobs, uids,
    refusals and kills; on every node a student can neither list the
    directory nor read a log."""
    names = on(node, "sh", "-c", "ls /var/log/delegate").stdout.split()
    assert "slurmd.log" in names and "agent.log" in names, names
    r = on(node, "ls", "/var/log/delegate", user=STUDENT)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stdout + r.stderr
    for name in names:
        r = on(node, "head", "-c1", f"/var/log/delegate/{name}", user=STUDENT)
        assert r.returncode != 0 and "Permission denied" in r.stderr, f"{node}: {name} is readable"


def test_deleted_open_files_count_on_a_stack_worker(stack):
    """Security round 3, item 2, on the stack: the sandboxes are the host
    engine's, outside the worker's pid namespace; the worker's agent reads
    their deleted-but-open files through the host's /proc (policy
    host_proc). Four deleted 300M files held open (under the 1G per-file
    limit, 1.2G together) stop the call."""
    script = (
        'for i in 1 2 3 4; do eval "exec $((i + 2))>/job/gone$i"; rm /job/gone$i;'
        " head -c 300M /dev/zero >&$((i + 2)); done; sleep 60"
    )
    r = on("user", "delegate", "submit", "--time", "2m", "--", "sh", "-c", script, user=STUDENT)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    on("user", "delegate", "wait", job, user=STUDENT, timeout=300)
    r = on("user", "delegate", "--json", "status", job, user=STUDENT)
    st = json.loads(r.stdout)
    st = st[0] if isinstance(st, list) else st
    assert st["state"] == "failed" and "in deleted files still open" in st["reason"], st


def test_stack_root_can_still_srun(stack):
    r = on_user_node("srun", "-w", "worker1", "-t", "1", "hostname")
    assert r.returncode == 0 and "worker1" in r.stdout


def test_down_leaves_nothing_behind(stack):
    r = run(SCRIPT, "down")
    assert r.returncode == 0, "down failed"
    assert docker_ids("ps", "-a") == []
    assert docker_ids("network", "ls") == []
    assert docker_ids("volume", "ls") == []
    if swarm_active():
        assert docker_ids("service", "ls") == []
        assert docker_ids("config", "ls") == []
        assert docker_ids("secret", "ls") == []
    # A second down is harmless.
    assert run(SCRIPT, "down").returncode == 0
