"""Multi-node rank jobs on the stack (issue 16): `delegate submit --nodes 2`
on a 2-worker stack (`build_cluster.sh deploy --workers 2`, several
containers of this machine sharing its Docker engine).

- a pure-Python allreduce (a sum over TCP, rank 0 listening on
  MASTER_ADDR:MASTER_PORT) gives the right value on both ranks, and each
  rank's output is kept apart (`delegate logs --rank K`);
- a rank reaches nothing outside its job's network: not the host, not the
  workers, not a container on another network of the engine (each checked
  to be reachable from an ordinary container first, so the test can fail);
- a rank that exits 3 ends the job (the other rank is ended by srun),
  with its reason and exit code, and leaves no container or network; so
  does a rank whose sandbox is SIGKILLed from outside (docker kill);
- a step with any other command in the rank job's allocation is still
  refused by the SPANK plugin, and the rank form started by hand gets no
  second sandbox.

Run as root, like test_stack.py; deploys and removes its own stack (use
DELEGATE_STACK_NAME etc. to keep it apart from another one).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stacklib import HOME, STACK, STUDENT, on, run, wait_until

IMAGE = os.environ.get("DELEGATE_SANDBOX_IMAGE", "delegate-sandbox:latest")
RUNNER = "/usr/local/bin/sandbox-runner"


@pytest.fixture(scope="module")
def stack(course_stack):
    """The stack of two workers the stage's suites share (conftest.py)."""
    return course_stack.deploy


def on_node(node, *cmd, user=STUDENT, timeout=300):
    return on(node, *cmd, user=user, timeout=timeout)


def submit(*argv, nodes=2):
    r = on_node("user", "delegate", "submit", "--nodes", str(nodes), "--time", "3m", "--", *argv)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[-1]


def wait_result(job, timeout=300):
    r = on_node("user", "delegate", "wait", job, timeout=timeout)
    r = on_node("user", "delegate", "--json", "result", job)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def job_dir(job):
    return Path(HOME) / STUDENT / ".delegate" / "jobs" / job


def slurm_id(job):
    return (job_dir(job) / "slurm-id").read_text().split()[0]


def rank_log(job, k):
    r = on_node("user", "delegate", "logs", "--rank", str(k), job)
    assert r.returncode == 0, r.stderr
    return r.stdout


def leftovers(sid):
    c = run("docker", "ps", "-aq", "--filter", f"label=delegate.slurm-job={sid}").stdout.split()
    n = run("docker", "network", "ls", "-q", "--filter", f"label=delegate.slurm-job={sid}").stdout.split()
    return c + n


def wait_until_clean(sid, timeout=60):
    deadline = time.monotonic() + timeout
    while leftovers(sid):
        assert time.monotonic() < deadline, f"left behind for Slurm job {sid}: {leftovers(sid)}"
        time.sleep(1)


ALLREDUCE = r"""
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
assert os.environ["LOCAL_RANK"] == "0"
value = (rank + 1) * 10
if rank == 0:
    srv = socket.create_server(("0.0.0.0", port))
    peers = [srv.accept()[0] for _ in range(world - 1)]
    total = value + sum(int(p.makefile().readline()) for p in peers)
    for p in peers:
        p.sendall(f"{total}\n".encode())
else:
    deadline = time.time() + 90
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            assert time.time() < deadline, "rank 0 never listened"
            time.sleep(0.5)
    s.sendall(f"{value}\n".encode())
    total = int(s.makefile().readline())
print(f"rank={rank} world={world} sum={total}", flush=True)
"""


def test_allreduce_over_the_job_network(stack):
    job = submit("python3", "-c", ALLREDUCE)
    res = wait_result(job)
    assert res["state"] == "completed", res
    assert res["exit_code"] == 0, res
    for k in (0, 1):
        assert f"rank={k} world=2 sum=30" in rank_log(job, k)
    # Without --rank: every rank's output, each under its header, in order.
    r = on_node("user", "delegate", "logs", job)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert (
        out.index("--- rank 0 of 2 ---") < out.index("rank=0 world=2") < out.index("--- rank 1 of 2 ---")
    ), out
    assert out.index("--- rank 1 of 2 ---") < out.index("rank=1 world=2"), out
    # --follow cannot interleave the ranks: it says what to use instead.
    r = on_node("user", "delegate", "logs", "--follow", job)
    assert r.returncode == 2 and "--rank K" in r.stderr, (r.returncode, r.stderr)
    sid = slurm_id(job)
    wait_until_clean(sid)
    # Both workers ran a rank (one sandbox per node, the rank from the node list).
    r = on_node("user", "sacct", "-n", "-X", "-P", "-j", sid, "-o", "NNodes", user=None)
    assert r.stdout.strip().splitlines()[:1] == ["2"], r.stdout


PROBE = r"""
import os, socket, sys
targets = [t.split(":") for t in os.environ["PROBE_TARGETS"].split(",") if t]
for host, port in targets:
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(f"REACHED {host}:{port}", flush=True)
    except OSError as e:
        print(f"blocked {host}:{port} ({e})", flush=True)
try:
    socket.getaddrinfo("example.com", 80)
    print("REACHED dns", flush=True)
except OSError as e:
    print(f"blocked dns ({e})", flush=True)
"""


def host_ipv4s():
    out = run("ip", "-4", "-o", "addr").stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if " lo " not in line]


def test_a_rank_reaches_nothing_outside_its_network(stack):
    # A listener on the host (all addresses), and one in a container on
    # another network of the same engine (as another job's sandbox would be).
    srv = socket.create_server(("0.0.0.0", 0))
    port = srv.getsockname()[1]
    other = run(
        "docker", "run", "-d", "--rm", "--label", "delegate.test=ranks-other", IMAGE,
        "python3", "-c", "import socket,time; s=socket.create_server(('0.0.0.0', 8123)); time.sleep(600)",
    ).stdout.strip()  # fmt: skip
    try:
        listening = "import socket; socket.create_connection(('127.0.0.1', 8123), 1)"
        wait_until(
            "the other container listening on 8123",
            lambda: run("docker", "exec", other, "python3", "-c", listening, quiet=True).returncode == 0,
            60,
            0.5,
        )
        other_ip = run(
            "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", other
        )
        targets = [f"{ip}:{port}" for ip in host_ipv4s()]
        targets += [f"{ip}:8123" for ip in other_ip.stdout.split()]
        for w in ("worker1", "worker2"):
            cid = run(
                "docker", "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={STACK}_{w}"
            ).stdout.split()[0]
            ips = run(
                "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", cid
            )
            targets += [f"{ip}:6818" for ip in ips.stdout.split()]  # slurmd
        env = ",".join(targets)
        # Control: from an ordinary container every host/other target answers.
        ctl = run("docker", "run", "--rm", "-e", f"PROBE_TARGETS={env}", IMAGE, "python3", "-c", PROBE)
        assert "REACHED" in ctl.stdout, "the control container reaches nothing: the test could not fail"
        job = submit("env", f"PROBE_TARGETS={env}", "python3", "-c", PROBE)
        res = wait_result(job)
        assert res["state"] == "completed", res
        for k in (0, 1):
            out = rank_log(job, k)
            assert out.count("blocked") == len(targets) + 1, out
            assert "REACHED" not in out, out
        wait_until_clean(slurm_id(job))
    finally:
        srv.close()
        run("docker", "rm", "-f", other)


FAILING = r"""
import os, sys, time
if os.environ["RANK"] == "1":
    print("rank 1 gives up", flush=True)
    sys.exit(3)
time.sleep(150)
"""


def test_a_failing_rank_ends_the_job_and_leaves_nothing(stack):
    t0 = time.monotonic()
    job = submit("python3", "-c", FAILING)
    res = wait_result(job)
    assert time.monotonic() - t0 < 120, "the other rank was not ended"
    assert res["state"] == "failed", res
    assert res["exit_code"] == 3, res
    assert "rank 1 failed: exited with code 3" in res["reason"], res
    assert "rank 1 gives up" in rank_log(job, 1)
    wait_until_clean(slurm_id(job))


def rank_containers(sid):
    """{rank: container id} of a Slurm job's running sandboxes (from the
    RANK each was started with)."""
    out = {}
    for cid in run("docker", "ps", "-q", "--filter", f"label=delegate.slurm-job={sid}").stdout.split():
        env = run("docker", "inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}", cid).stdout
        for line in env.splitlines():
            if line.startswith("RANK="):
                out[int(line.split("=", 1)[1])] = cid
    return out


def test_a_rank_killed_from_outside_ends_the_job_and_leaves_nothing(stack):
    """A rank's sandbox SIGKILLed from outside (the kernel's OOM killer, an
    operator's docker kill): the other rank is ended, the job's outcome
    names the killed rank, and no container or network is left."""
    job = submit("sh", "-c", 'echo "rank $RANK up"; sleep 150')
    deadline = time.monotonic() + 120
    while True:
        sid = slurm_id(job) if (job_dir(job) / "slurm-id").exists() else None
        ranks = rank_containers(sid) if sid else {}
        if len(ranks) == 2:
            break
        if time.monotonic() >= deadline:
            r = on_node("user", "delegate", "--json", "status", job)
            raise AssertionError(f"the two ranks never ran: {r.stdout} {ranks}")
        time.sleep(1)
    t0 = time.monotonic()
    assert run("docker", "kill", ranks[1]).returncode == 0
    res = wait_result(job)
    assert time.monotonic() - t0 < 90, "the other rank was not ended"
    assert res["state"] == "failed", res
    assert res["reason"].startswith("rank 1 failed"), res
    # Each rank's own ending is kept in the summary.
    assert "rank 0: " in res["reason"] and "rank 1: " in res["reason"], res
    assert "rank 1 up" in rank_log(job, 1)
    wait_until_clean(sid)


def test_other_steps_in_a_rank_job_are_refused(stack):
    job = submit("sleep", "120")
    d = job_dir(job)
    try:
        deadline = time.monotonic() + 180
        while not (d / "started").exists() or not (d / "started.1").exists():
            assert time.monotonic() < deadline, "the rank job did not start"
            time.sleep(0.5)
        sid = slurm_id(job)
        before = run("docker", "ps", "-q", "--filter", f"label=delegate.slurm-job={sid}").stdout.split()
        assert len(before) == 2
        # The admitted form with a task prolog or epilog of the student's
        # (a program slurmstepd would run as them, outside any sandbox):
        # the rank step's slurmstepd executes nothing but the runner.
        script = Path(HOME) / STUDENT / "rank-prolog.sh"
        marker = Path(HOME) / STUDENT / "rank-prolog-marker"
        on_node("user", "sh", "-c", f"printf '#!/bin/sh\\ntouch {marker}\\n' >{script}; chmod 755 {script}")
        assert script.read_text().startswith("#!/bin/sh\n")

        def steps():
            out = on("head", "squeue", "-h", "-s", "-j", sid, "-o", "%i", user=None).stdout.split()
            return {s for s in out if re.fullmatch(rf"{sid}\.\d+", s)}

        ranks_steps = steps()
        refused = [
            ["sh", "-c", "id; touch $HOME/rank-step-marker"],
            [RUNNER, "rank", str(d), "extra"],
            ["/bin/sh", RUNNER, "rank", str(d)],
        ]
        prologs = [
            [f"{opt}={prog}", "--export=ALL,BASH_ENV=" + str(script), RUNNER, "rank", str(d)]
            for opt in ("--task-prolog", "--task-epilog")
            for prog in (str(script), "/bin/sh")
        ]
        # (all at once: each refused srun takes about 10 s to return)
        with ThreadPoolExecutor(len(refused) + len(prologs)) as pool:
            answers = list(
                pool.map(lambda argv: on_node("user", "srun", f"--jobid={sid}", "--overlap", "-N1", *argv),
                         refused + prologs)
            )  # fmt: skip
        for r in answers[: len(refused)]:
            # (srun 22.05 exits 0 after "launch failed": the message decides)
            assert "uid=" not in r.stdout
            assert "launch failed" in r.stderr or "Plugin initialization failed" in r.stderr, r.stderr
        assert not (Path(HOME) / STUDENT / "rank-step-marker").exists()
        # (each srun returned; its step, refused, is gone from Slurm too)
        wait_until(
            "the refused steps gone from Slurm's queue",
            lambda: steps() <= ranks_steps,
            30,
            0.5,
            detail=lambda: f"{steps()}, the ranks' {ranks_steps}",
        )
        assert not marker.exists(), "a task prolog/epilog ran in the rank step"
        # The exact rank form by hand: admitted by the plugin, but the
        # agent serves one sandbox per job and node: nothing more.
        # (its own rank's files exist already, or the agent refuses: either
        # way it ends non-zero without a sandbox)
        r = on_node("user", "srun", f"--jobid={sid}", "--overlap", "-N1", RUNNER, "rank", str(d))
        assert r.returncode != 0
        assert "Plugin initialization failed" not in r.stderr, r.stderr
        after = run("docker", "ps", "-q", "--filter", f"label=delegate.slurm-job={sid}").stdout.split()
        assert sorted(after) == sorted(before)
    finally:
        on_node("user", "delegate", "cancel", job)
    wait_until_clean(sid)


def test_srun_options_from_the_students_environment_run_nothing(stack):
    """Security round 3, item 1: `SLURM_PROLOG=~/p.sh delegate submit
    --nodes 2` had p.sh run as the student on the batch worker, outside any
    sandbox (srun reads SLURM_PROLOG as --prolog). The plugin drops the
    submitter's srun options from the batch step and the runner starts
    srun from an empty environment with the prolog and epilog pinned."""
    marker = Path(HOME) / STUDENT / "srun-option-marker"
    script = Path(HOME) / STUDENT / "srun-option.sh"
    on_node("user", "sh", "-c", f"printf '#!/bin/sh\\nhostname >>{marker}\\n' >{script}; chmod 755 {script}")
    assert script.read_text().startswith("#!/bin/sh\n")
    forged = [
        f"{v}={script}" for v in ("SLURM_PROLOG", "SLURM_EPILOG", "SLURM_TASK_PROLOG", "SLURM_TASK_EPILOG")
    ]
    r = on(
        "user", "delegate", "submit", "--nodes", "2", "--time", "3m", "--", "true", user=STUDENT, env=forged
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    res = wait_result(job)
    assert res["state"] == "completed", res
    assert not marker.exists(), f"a srun option from the environment ran on {marker.read_text()}"


def test_more_nodes_than_the_stack_has_are_refused(stack):
    # (max_nodes = the number of workers: Slurm refuses the allocation
    # before the policy is asked; the policy's own check is unit-tested)
    r = on_node("user", "delegate", "submit", "--nodes", "3", "--wait", "--", "true")
    assert r.returncode != 0
    assert "node" in (r.stdout + r.stderr).lower(), r.stderr


PY_RANKS = r"""
import os, delegate

def where(x):
    import os
    if os.environ["RANK"] == "1" and x == "boom":
        raise ValueError("rank 1 says no")
    return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), x)

f = delegate.remote(nodes=2, time="3m")(where)
print("VALUES", f("hi"))
try:
    f("boom")
except ValueError as e:
    print("RAISED", e)
"""


def test_python_remote_nodes_returns_the_ranks_values(stack):
    r = on_node("user", "python3", "-c", PY_RANKS, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "VALUES [(0, 2, 'hi'), (1, 2, 'hi')]" in r.stdout, r.stdout
    assert "RAISED rank 1 says no" in r.stdout, r.stdout


def test_every_rank_sees_the_shipped_files(stack):
    """`delegate submit --nodes 2 --file train.py -- python3 /job/train.py`
    (docs/ml.md): the shipped script is in every rank's /job."""
    home = Path(HOME) / STUDENT
    script = home / "rank_train.py"
    script.write_text(
        "import os\nprint('trained rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
    )
    st = home.stat()
    os.chown(script, st.st_uid, st.st_gid)
    r = on_node(
        "user", "delegate", "submit", "--nodes", "2", "--time", "3m",
        "--file", str(script), "--", "python3", "/job/rank_train.py",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    res = wait_result(job)
    assert res["state"] == "completed", res
    for k in (0, 1):
        assert f"trained rank {k} of 2" in rank_log(job, k)


# --- One hardware class per experiment (issue 32): both workers run on this
# machine, so they are one class until an operator labels one of them
# (/etc/delegate/node-class); the agents publish the classes to Slurm.


def classes_on_head() -> dict[str, str]:
    """Each worker's class as Slurm shows it (sinfo on the head)."""
    r = on("head", "sinfo", "-N", "-h", "-O", "NodeList:|,Features:|", quiet=True)
    out = {}
    for line in r.stdout.splitlines():
        name, _, features = line.partition("|")
        ours = [f for f in features.rstrip("|").split(",") if f.startswith("dlgclass_")]
        if ours:
            out[name] = ours[0].removeprefix("dlgclass_")
    return out


def until_classes(want, timeout=120) -> dict[str, str]:
    def wanted():
        c = classes_on_head()
        return c if want(c) else None

    return wait_until("the workers' classes", wanted, timeout, 1, classes_on_head)


def slurm_features(job: str) -> str:
    sid = (Path(HOME) / STUDENT / ".delegate" / "jobs" / job / "slurm-id").read_text().split()[0]
    show = on("head", "scontrol", "show", "job", sid.split("_")[0], quiet=True).stdout
    return next(w for w in show.split() if w.startswith("Features=")).removeprefix("Features=")


@pytest.fixture(scope="module")
def two_classes(stack):
    """worker2 labelled `slow` (a second class), unlabelled afterwards
    (for the module's last tests). The agent publishes a changed class
    within 30 s by itself (E test_node_class); here it is told at once, as
    a deployment tells it (SIGHUP)."""
    until_classes(lambda c: len(c) == 2 and len(set(c.values())) == 1)
    # The deployment recorded each worker's class (no label yet) as its own.
    comments = on("head", "sinfo", "-N", "-h", "-O", "Comment:|", quiet=True).stdout.splitlines()
    assert len(comments) == 2 and all(" deployed=" in c and " label=none " in c for c in comments), comments
    r = on("worker2", "sh", "-c", "mkdir -p /etc/delegate && echo slow > /etc/delegate/node-class")
    assert r.returncode == 0, r.stderr
    try:
        on("worker2", "pkill", "-HUP", "-x", "sandbox-agent")
        yield until_classes(lambda c: len(set(c.values())) == 2)
    finally:
        on("worker2", "rm", "-f", "/etc/delegate/node-class")
        on("worker2", "pkill", "-HUP", "-x", "sandbox-agent")
        until_classes(lambda c: len(set(c.values())) == 1)


def test_a_maps_calls_keep_to_one_class(two_classes):
    chosen = min(two_classes.values())  # 1 node each: the smaller id
    node = next(n for n, c in two_classes.items() if c == chosen)
    r = on_node("user", "delegate", "submit", "--count", "4", "--time", "1m", "--", "true")
    assert r.returncode == 0, r.stderr
    jobs = r.stdout.split()
    assert slurm_features(jobs[0]) == f"dlgclass_{chosen}"
    for job in jobs:
        res = wait_result(job)
        assert res["state"] == "completed", res
        assert res["fingerprint"]["node"] == node, (res["fingerprint"]["node"], two_classes)
    # Mixing asked for: Slurm is asked for no class.
    r = on_node("user", "delegate", "submit", "--count", "2", "--hold", "--mix-classes", "--", "true")
    assert r.returncode == 0, r.stderr
    mixed = r.stdout.split()
    try:
        assert slurm_features(mixed[0]) == "(null)"
    finally:
        on_node("user", "delegate", "cancel", *mixed)
    # A 2-node job: no class has two nodes, so it spans them (else it
    # would never start).
    job = submit("true")
    assert slurm_features(job) == "(null)"
    assert wait_result(job)["state"] == "completed"


def test_the_instructors_view_names_both_classes_and_the_drift(two_classes):
    r = on("worker1", "delegate", "admin", "nodes")
    assert r.returncode == 0, r.stderr
    for n, c in two_classes.items():
        assert any(line.startswith(n + " ") and c in line for line in r.stdout.splitlines()), r.stdout
    assert "2 node(s), 2 class(es)" in r.stdout, r.stdout
    # worker2 was relabelled after the deployment: its class drifted.
    assert "drift: worker2's class changed since the last deployment" in r.stdout, r.stdout
    assert "drift: worker1" not in r.stdout
