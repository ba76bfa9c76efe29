"""Elastic workers (issue 17, docs/elastic.md): Slurm's power saving starts
the stack's workers when jobs wait and stops them when idle.

One deploy by `build_cluster.sh deploy` with DELEGATE_ELASTIC=1, min 0,
max 2, 30 s idle: no worker runs after the deploy; a map (the Python
package, bench/cold_start.py) brings workers up and completes, while
`delegate doctor` says the job waits for a worker being powered up; idle
workers are stopped (no worker container left); a call submitted while a
worker powers down still completes; a worker whose start fails for real
(its service's image does not exist) is DOWN with a clear reason, then
kept out (drained) until an operator resumes it, and the call it was meant
for still runs, once; a worker whose start found no machine to take it
rejoins by itself when one is back, and runs the call that waited for it.
Then `down`, nothing left.

Run by tests/run.sh (stage 7) as root, before the suites of the shared
stack (conftest.py). Honours the stack
settings of the environment (DELEGATE_STACK_NAME, DELEGATE_STACK_HOME, ...)
like test_stack.py; the elastic settings are this file's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import stacklib
from stacklib import HOME, REPO, SCRIPT, STACK, STUDENT, as_user, cid, deployed, on, run

# Seconds a worker idles before Slurm stops it (SuspendTime): short, for
# each test below waits for it at least once (elastic.idle's least is 10).
IDLE = 15
# Seconds a started worker has to register: a worker of this stack starts
# in 5-25 s; the two tests of a start that fails wait this long for Slurm
# to give up on it.
RESUME = 60
ELASTIC = {
    "DELEGATE_ELASTIC": "1",
    "DELEGATE_ELASTIC_MIN": "0",
    "DELEGATE_ELASTIC_MAX": "2",
    "DELEGATE_ELASTIC_IDLE": str(IDLE),
    "DELEGATE_ELASTIC_RESUME_TIMEOUT": str(RESUME),
}
WORKERS = ("worker1", "worker2")
# SuspendTime, then SuspendTimeout (30 s), power_save_interval (5 s), margin.
STOP_WITHIN = IDLE + 30 + 5 + 60

# The image worker1's service had before test_failed_start broke it.
broken_from: dict[str, str] = {}


def nodes() -> dict[str, tuple[str, str]]:
    """Node -> (sinfo long state with its power suffix, reason)."""
    r = on("head", "sinfo", "-h", "-N", "-o", "%N|%T|%E", quiet=True)
    out = {}
    for line in r.stdout.splitlines():
        f = line.split("|")
        if len(f) == 3:
            out[f[0]] = (f[1], f[2])
    return out


def running_workers() -> list[str]:
    return [w for w in WORKERS if cid(w)]


def wait_until(what: str, cond, timeout: float, step: float = 2):
    return stacklib.wait_until(what, cond, timeout, step, detail=lambda: f"nodes {nodes()}\n{worker_logs()}")


def worker_logs(lines: int = 40) -> str:
    """The tail of each worker service's output (its entrypoint, slurmd and
    agent logs), for a failure's record: a worker that did not register says
    why only there."""
    out = []
    for w in WORKERS:
        r = run("docker", "service", "logs", "--timestamps", "--tail", str(lines), f"{STACK}_{w}", quiet=True)
        out.append(f"----- docker service logs {STACK}_{w}\n{r.stdout}{r.stderr}")
    return "\n".join(out)


def all_powered_down():
    n = nodes()
    return not running_workers() and all(n.get(w, ("",))[0] == "idle~" for w in WORKERS)


def submit(*cmd: str, count: int = 1) -> list[str]:
    args = ["delegate", "submit", "--time", "5m"]
    if count > 1:
        args += ["--count", str(count)]
    r = on("user", *args, "--", *cmd, user=STUDENT)
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()
    assert len(ids) == count, r.stdout
    return ids


def status(ids: list[str]) -> dict[str, dict]:
    r = on("user", "delegate", "--json", "status", *ids, user=STUDENT, quiet=True)
    if r.returncode != 0:
        return {}
    data = json.loads(r.stdout)
    rows = data if isinstance(data, list) else data.get("jobs", [data])
    return {j["id"]: j for j in rows}


def wait_terminal(ids: list[str], timeout: float) -> dict[str, dict]:
    def done():
        s = status(ids)
        if len(s) == len(ids) and all(j["state"] not in ("pending", "running") for j in s.values()):
            return s
        return None

    return wait_until(f"calls {ids} end", done, timeout, step=3)


def ran_once(job: str, marker: str) -> None:
    r = on("user", "delegate", "logs", job, user=STUDENT, quiet=True)
    assert r.stdout.count(marker) == 1, r.stdout


@pytest.fixture(scope="module")
def stack():
    env = dict(os.environ, **ELASTIC)
    with deployed(env=env):
        try:
            # `down` keeps slurmctld's state (the volume <stack>-slurmctld-state,
            # so job ids go on and never meet the accounting database's old
            # records): jobs an earlier run left queued would power workers up
            # under this test. They are dead calls; cancel them.
            left = on("head", "squeue", "-h", "-o", "%A", quiet=True).stdout.split()
            if left:
                on("head", "scancel", *left)
            yield env
        finally:
            # A failed test must not leave a broken image on a worker service.
            if broken_from:
                run("docker", "service", "update", "-d", "--image", broken_from["image"], f"{STACK}_worker1")
    left = run("docker", "ps", "-aq", "--filter", f"label=com.docker.stack.namespace={STACK}").stdout
    assert not left.strip(), f"containers left: {left}"


def elastic_config(**settings: str) -> subprocess.CompletedProcess:
    """The stack's slurm.conf as build_cluster.sh renders it (delegate-deploy,
    slurm-conf/slurm.conf.j2) for `settings` over cluster.toml's, and which
    worker services always run (build_cluster.d/elastic.sh)."""
    env = dict(os.environ, DELEGATE_STACK_DIR="/nonexistent", STACK_WORKERS_ARG="", **settings)
    env.update(DELEGATE_STACK_WORKER_CPUS="1", DELEGATE_STACK_WORKER_MEM_MB="1000")
    tool = f"{REPO}/target/release/delegate-deploy"
    script = (
        'die() { echo "die: $*" >&2; exit 1; }; warn() { echo "warn: $*" >&2; }\n'
        f'eval "$("{tool}" settings --file "{REPO}/cluster.toml")" || exit 1\n'
        f'source "{REPO}/build_cluster.d/elastic.sh"\n'
        "elastic_load_config\n"
        f'(export "${{!DELEGATE_@}}"; exec "{tool}" slurm-conf --shape stack) || exit 1\n'
        'echo "replicas-on: $(for i in 1 2 3; do elastic_always_on $i && echo -n "$i "; done)"\n'
    )
    return run("bash", "-c", script, env=env, quiet=True)


def test_minimum_workers_are_never_powered_down():
    """DELEGATE_ELASTIC_MIN > 0 (the stack below runs with 0): workers
    1..MIN are ordinary always-on nodes excluded from power saving, the
    rest CLOUD nodes; MIN above MAX is refused by name."""
    r = elastic_config(
        DELEGATE_ELASTIC="1", DELEGATE_ELASTIC_MIN="1", DELEGATE_ELASTIC_MAX="3",
        DELEGATE_ELASTIC_IDLE="60", DELEGATE_ELASTIC_RESUME_TIMEOUT="120",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "NodeName=worker1 CPUs=1 RealMemory=1000 State=UNKNOWN" in lines, r.stdout
    assert "NodeName=worker[2-3] CPUs=1 RealMemory=1000 State=CLOUD" in lines, r.stdout
    assert "SuspendExcNodes=worker1" in lines, r.stdout
    assert "SuspendTime=60" in lines and "ResumeTimeout=120" in lines, r.stdout
    assert "replicas-on: 1 " in lines, r.stdout
    # MIN = MAX: nothing is ever powered down.
    r = elastic_config(
        DELEGATE_ELASTIC="1", DELEGATE_ELASTIC_MIN="2", DELEGATE_ELASTIC_MAX="2",
        DELEGATE_ELASTIC_IDLE="60", DELEGATE_ELASTIC_RESUME_TIMEOUT="120",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "NodeName=worker[1-2] CPUs=1 RealMemory=1000 State=UNKNOWN" in r.stdout.splitlines(), r.stdout
    assert "State=CLOUD" not in r.stdout and "SuspendExcNodes=worker[1-2]" in r.stdout, r.stdout
    bad = elastic_config(
        DELEGATE_ELASTIC="1", DELEGATE_ELASTIC_MIN="3", DELEGATE_ELASTIC_MAX="2",
        DELEGATE_ELASTIC_IDLE="60", DELEGATE_ELASTIC_RESUME_TIMEOUT="120",
    )  # fmt: skip
    # (refused with the settings, before anything is rendered or built)
    want = "DELEGATE_ELASTIC_MIN (3, elastic.min) is above DELEGATE_ELASTIC_MAX (2, elastic.max)"
    assert bad.returncode != 0 and want in bad.stderr, bad.stderr


def test_deploy_starts_no_worker(stack):
    assert cid("power"), "the power service does not run"
    wait_until("workers powered down after the deploy", all_powered_down, STOP_WITHIN)
    r = run(SCRIPT, "status", env=stack)
    assert r.returncode == 0
    for w in WORKERS:
        assert any(line.startswith(w) and "POWERED_DOWN" in line for line in r.stdout.splitlines()), r.stdout
        assert f"{w}: not running (powered down" in r.stdout
    cfg = on("head", "scontrol", "show", "config", quiet=True).stdout
    assert "power-resume" in cfg and "power-suspend" in cfg, cfg


def test_students_cannot_reach_the_power_channel(stack):
    """The spool is SlurmUser's alone on the head and mounted nowhere a
    student is (the user node, the workers)."""
    r = on("head", "stat", "-c", "%a %U", "/run/delegate-power", quiet=True)
    assert r.stdout.split() == ["700", "slurm"], r.stdout
    assert on("user", "test", "-e", "/run/delegate-power", quiet=True).returncode != 0
    assert on("user", "ls", "/run/delegate-power", user=STUDENT, quiet=True).returncode != 0
    mounts = run("docker", "service", "inspect", "-f", "{{json .Spec.TaskTemplate.ContainerSpec.Mounts}}",
                 f"{STACK}_user", f"{STACK}_worker1", quiet=True).stdout  # fmt: skip
    assert "delegate-power" not in mounts and "/power" not in mounts, mounts


def test_map_brings_workers_up_and_doctor_explains(stack):
    """A map of 4 calls with every worker powered down: workers start, the
    map completes; meanwhile `delegate doctor` explains the wait."""
    # The driver, readable by the student in the shared home.
    d = Path(HOME) / ".elastic-test"
    d.mkdir(mode=0o755, exist_ok=True)
    (d / "cold_start.py").write_text((REPO / "bench" / "cold_start.py").read_text())
    (d / "cold_start.py").chmod(0o644)
    p = subprocess.Popen(
        ["docker", "exec", *as_user(STUDENT), cid("user"),
         "/opt/delegate/venv/bin/python", str(d / "cold_start.py"), "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # The map's job waits (CONFIGURING) while Slurm powers a worker up.
        wait_until(
            "the map's job configuring",
            lambda: on("head", "squeue", "-h", "-t", "CF", "-o", "%i", quiet=True).stdout.strip(),
            60,
            0.5,
        )
        doc = on("user", "delegate", "doctor", user=STUDENT, quiet=True).stdout
        print(doc)
        line = next((x for x in doc.splitlines() if "elastic workers" in x), "")
        assert "being powered up" in line, doc
        out, err = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    print(out, err[-3000:])
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert [r[0] for r in res["results"]] == [0, 1, 2, 3]
    assert set(res["hosts"]) <= set(WORKERS) and res["hosts"], res
    print(f"BENCH cold start: first result {res['first_s']} s, all 4 {res['all_s']} s, on {res['hosts']}")
    assert running_workers(), "no worker runs right after the map"


def test_idle_workers_are_stopped(stack):
    wait_until("idle workers stopped", all_powered_down, STOP_WITHIN)
    # No task of a worker service runs: its containers are gone.
    for w in WORKERS:
        r = run("docker", "service", "inspect", "-f", "{{.Spec.Mode.Replicated.Replicas}}", f"{STACK}_{w}")
        assert r.stdout.strip() == "0", r.stdout


def test_call_submitted_while_powering_down_completes(stack):
    first = submit("sh", "-c", "echo warm-$DELEGATE_INDEX")
    assert wait_terminal(first, 300)[first[0]]["state"] == "completed"
    host = status(first)[first[0]].get("host") or "worker1"
    # After IDLE seconds the worker is being stopped ("%"): submit then.
    wait_until(f"{host} powering down", lambda: nodes().get(host, ("",))[0].endswith("%"), IDLE + 40, 0.5)
    ids = submit("sh", "-c", "echo late-$DELEGATE_INDEX")
    assert nodes()[host][0].endswith("%"), "the call was not submitted while the worker powered down"
    end = wait_terminal(ids, 400)
    assert end[ids[0]]["state"] == "completed", end
    ran_once(ids[0], "late-")


def test_failed_start_leaves_reason_and_no_lost_call(stack):
    """worker1's service gets an image that does not exist (a real engine
    failure, not a mock). worker2 is drained first, so that the two calls
    (each its own exclusive job) can only go to worker1 (left to itself,
    Slurm may as well wait for one worker it is starting): the start fails,
    worker1 is DOWN with the engine's reason; worker2 back in service, both
    calls run there, each once."""
    wait_until("workers powered down", all_powered_down, STOP_WITHIN)
    svc = f"{STACK}_worker1"
    broken_from["image"] = run(
        "docker", "service", "inspect", "-f", "{{.Spec.TaskTemplate.ContainerSpec.Image}}", svc
    ).stdout.strip()
    r = run(
        "docker", "service", "update", "-d", "--image", "delegate-cluster:no-such-image-elastic-test", svc
    )
    assert r.returncode == 0
    drain = on("head", "scontrol", "update", "nodename=worker2", "state=drain", "reason=test: worker1 only")
    assert drain.returncode == 0, drain.stderr
    ids = submit("sh", "-c", "echo once-$DELEGATE_INDEX") + submit("sh", "-c", "echo once-$DELEGATE_INDEX")

    def worker1_out(states=("down", "drained")):
        st, reason = nodes().get("worker1", ("", ""))
        return reason if st.startswith(states) else None

    try:
        reason = wait_until("worker1 DOWN after its failed start", worker1_out, 180, step=0.5)
    except AssertionError as e:
        # (where the call went, and what the power programs did, for the record)
        log = on("head", "sh", "-c", "tail -n 40 /var/log/delegate/power*.log 2>&1", quiet=True).stdout
        raise AssertionError(f"{e}; the call: {status(ids)}; power log: {log}") from None
    print("worker1:", reason)
    assert reason.startswith("elastic: cannot start worker worker1"), reason
    assert "no such image" in reason.lower() or "failed" in reason.lower(), reason
    # The doctor names it.
    doc = on("user", "delegate", "doctor", user=STUDENT, quiet=True).stdout
    assert "worker1 could not be started" in doc, doc
    assert on("head", "scontrol", "update", "nodename=worker2", "state=resume").returncode == 0
    end = wait_terminal(ids, 400)
    for i in ids:
        j = end[i]
        assert j["state"] == "completed", j
        assert j.get("host") == "worker2", j
        ran_once(i, "once-")

    # Then Slurm powers the failed worker down (at ResumeTimeout, "down~",
    # or after SuspendTime, where idle_on_node_suspend would make it idle
    # again and the power program drains it, "drained~"): either way it
    # stays out with the reason of its failed start until an operator acts.
    # Slurm's own timeout first writes "ResumeTimeout reached"; the
    # ResumeFailProgram it then runs puts the remembered reason back, within
    # seconds (the CI run of stop 50 read the node in between).
    def kept_out():
        st, why = nodes().get("worker1", ("", ""))
        return (st, why) if st.startswith(("down", "drained")) and st.endswith("~") else None

    def kept_with_reason():
        out = kept_out()
        return out if out and out[1] == reason else None

    wait_until("worker1 powered down", kept_out, RESUME + STOP_WITHIN)
    st, _ = wait_until("worker1's reason of its failed start put back", kept_with_reason, 30, step=1)
    time.sleep(15)  # three power-saving passes later, still out
    assert kept_out() == (st, reason), nodes()
    assert "worker1 could not be started" in on("user", "delegate", "doctor", user=STUDENT, quiet=True).stdout
    # Repaired: the image back, the node resumed; it is usable again.
    assert run("docker", "service", "update", "-d", "--image", broken_from.pop("image"), svc).returncode == 0
    assert on("head", "scontrol", "update", "nodename=worker1", "state=resume").returncode == 0
    wait_until("worker1 back in service", lambda: not worker1_out(), 60)
    assert nodes()["worker1"] == ("idle~", "none"), nodes()


def test_a_worker_whose_machine_was_off_rejoins_when_it_is_back(stack):
    """Issue 52: worker1's start is asked while no machine can take it:
    its service is constrained to a node label no swarm node has, so swarm
    answers "no suitable node", as it does for a machine that is off or cut
    off. worker2 is drained, so the call can only go to worker1. worker1 is
    DOWN with swarm's reason and the call waits (requeued, not lost). Then
    the machine is back (this host's swarm node gets the label): with no
    command, the power service sees a machine that can take worker1, the
    head resumes the node, Slurm starts it for the waiting call, and the
    call runs there, once."""
    wait_until("workers powered down", all_powered_down, STOP_WITHIN)
    svc = f"{STACK}_worker1"
    label = "delegate.test-machine-back"
    constraint = f"node.labels.{label} == yes"
    me = run("docker", "node", "inspect", "self", "-f", "{{.ID}}", quiet=True).stdout.strip()
    assert run("docker", "service", "update", "-d", "--constraint-add", constraint, svc).returncode == 0
    try:
        drain = on(
            "head", "scontrol", "update", "nodename=worker2", "state=drain", "reason=test: worker1 only"
        )
        assert drain.returncode == 0, drain.stderr
        ids = submit("sh", "-c", "echo back-$DELEGATE_INDEX")

        def worker1_out():
            st, reason = nodes().get("worker1", ("", ""))
            return reason if st.startswith(("down", "drained")) else None

        reason = wait_until("worker1 DOWN for want of a machine", worker1_out, 180, step=0.5)
        print("worker1:", reason)
        assert "no suitable node" in reason.lower(), reason
        assert status(ids)[ids[0]]["state"] == "pending", status(ids)
        assert run("docker", "node", "update", "--label-add", f"{label}=yes", me).returncode == 0
        end = wait_terminal(ids, 400)
        assert end[ids[0]]["state"] == "completed", end
        assert end[ids[0]].get("host") == "worker1", end
        ran_once(ids[0], "back-")
        log = on("head", "cat", "/var/log/delegate/power.log", quiet=True).stdout
        assert "worker1: its start waited for a machine; machine " in log and ": resumed" in log, log
    finally:
        run("docker", "service", "update", "-d", "--constraint-rm", constraint, svc)
        run("docker", "node", "update", "--label-rm", label, me)
        on("head", "scontrol", "update", "nodename=worker2", "state=resume")
