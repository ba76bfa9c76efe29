"""The stack on several machines (issue 41): worker machines emulated as
containers with their own Docker engines (tests/machines/machines.sh: m1
Debian 12 with docker.io 20.10, m2 Debian 13 with docker.io 26), this host
the manager. The instructor's commands in the order of docs/instructors.md,
"On real machines": `machine add` for each machine over ssh, `deploy` with
placement, `test`, then a map whose calls run in sandboxes of both
machines' own engines; `machine list`; a machine removed while a call
runs there and added again to the running course; a worker machine
restarted (its staging mount comes back from its boot script) takes calls
again; the manager restarted mid-call; `down`.

The images reach the machines' engines from the course's registry
(build_cluster.d/registry.sh), nothing else. The home is served over the
network by a third machine (GlusterFS) and mounted on the machines and on
this host (the user node's) by a FUSE client whose attribute, entry and
negative-lookup caches are on (3 s, 30 s, 30 s): the job-directory
protocol runs with each side seeing the other's writes late.

Run by tests/run.sh (stage 7) as root: alone, after the rest of stage 7
and the single-machine stages (7b: it restarts this host's engine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stacklib import (
    HOME,
    MACHINES_TOOL,
    SCRIPT,
    STACK,
    STUDENT,
    deployed,
    machine_address,
    machine_docker,
    on,
    run,
    wait_state_saved,
    wait_until,
    worker_machines,
)

# Each machine and its engine's version.
MACHINES = {"m1": "20.10", "m2": "26."}
IMAGES = ("delegate-cluster:latest", "delegate-sandbox:latest")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import testlib  # noqa: E402


def on_machine(m: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
    return machine_docker("exec", m, *cmd, **kw)


def sandboxes(m: str) -> list[str]:
    """The sandbox containers running on machine m's own engine."""
    r = on_machine(m, "docker", "ps", "-q", "--filter", "label=delegate.slurm-job", quiet=True)
    return r.stdout.split()


@pytest.fixture(scope="module")
def joined_machines():
    """The machines up, each joined by `machine add` (stacklib)."""
    with worker_machines() as (env, outs):
        for m in MACHINES:
            for image in IMAGES:
                # Fresh engines: nothing of delegate's images on them.
                have = on_machine(m, "docker", "image", "inspect", image, quiet=True)
                assert have.returncode != 0, f"{m} has {image} before the deploy"
        fs = run("findmnt", "-n", "-o", "FSTYPE", "--mountpoint", HOME, quiet=True).stdout.strip()
        assert fs == "fuse.glusterfs", f"the home {HOME} here is {fs or 'not a mount'}"
        yield env, outs


@pytest.fixture(scope="module")
def machines(joined_machines):
    return joined_machines[0]


@pytest.fixture(scope="module")
def joined(joined_machines):
    """`machine add`'s output for each machine: worker1 on m1, worker2 on m2."""
    outs = joined_machines[1]
    for i, out in enumerate(outs, 1):
        assert f"worker{i}: in the swarm as node" in out, out
        assert "at boot too (rc.local)" in out, out
        assert "trusts the registry 172.31.90.1:5000" in out, out
    return outs


@pytest.fixture(scope="module")
def stack(machines, joined):
    with deployed(env=machines):
        yield machines


def test_machine_add_prepares_and_labels_each_machine(joined, machines):
    for i, (m, version) in enumerate(MACHINES.items(), 1):
        assert f"Docker {version}" in joined[i - 1], joined[i - 1]
        # The staging directory: a shared mount point, the worker's own
        # directory root-only, and the boot script that makes them again.
        prop = on_machine(
            m, "findmnt", "-n", "-o", "PROPAGATION", "--mountpoint", "/run/delegate-stack", quiet=True
        )
        assert prop.stdout.strip().startswith("shared"), prop.stdout
        mode = on_machine(
            m, "stat", "-c", "%a %U", f"/run/delegate-stack/worker{i}", quiet=True
        ).stdout.split()
        assert mode == ["700", "root"], mode
        assert "staging-mount.sh" in on_machine(m, "cat", "/etc/rc.local", quiet=True).stdout
    listed = run(SCRIPT, "machine", "list", env=machines).stdout
    assert "worker1  m1" in listed and "worker2  m2" in listed, listed
    # Adding the same machine again changes nothing; a taken number is refused.
    again = run(SCRIPT, "machine", "add", "--worker", "1", f"root@{machine_address('m1')}", env=machines)
    assert again.returncode == 0, again.stderr
    # m2 as worker1 too: refused before m2 is touched (its boot script
    # still prepares worker2's staging directory).
    taken = run(SCRIPT, "machine", "add", "--worker", "1", f"root@{machine_address('m2')}", env=machines)
    assert taken.returncode != 0 and "is worker2 already" in taken.stderr, taken.stderr
    assert (
        "/run/delegate-stack/worker2"
        in on_machine("m2", "cat", "/usr/local/lib/delegate/staging-mount.sh").stdout
    )
    m3 = run(SCRIPT, "machine", "add", "--worker", "2", f"root@{machine_address('m1')}", env=machines)
    assert m3.returncode != 0 and "is worker1 already" in m3.stderr, m3.stderr
    # A deploy without placement would scatter the manager's services over
    # the machines: refused while machines are labelled.
    loose = run(SCRIPT, "deploy", env=dict(machines, DELEGATE_STACK_PLACEMENT="0"), timeout=900)
    assert loose.returncode != 0 and "deploy with placement" in loose.stderr, loose.stderr


def test_each_worker_runs_on_its_machine(stack):
    for i, m in enumerate(MACHINES, 1):
        r = run(
            "docker",
            "service",
            "ps",
            "-f",
            "desired-state=running",
            "--format",
            "{{.Node}}",
            f"{STACK}_worker{i}",
        )
        assert r.stdout.split() == [m], r.stdout
    r = run(SCRIPT, "test", env=stack, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:]
    for check in (
        "the same sandbox image on every worker",
        f"{STUDENT} writes the home from every worker",
    ):
        assert f"ok\x1b[0m   {check}" in r.stdout, r.stdout[-3000:]
    # The images came from the registry: each machine's sandbox image is
    # the manager's, by id.
    want = run("docker", "image", "inspect", "-f", "{{.Id}}", IMAGES[1], quiet=True).stdout.strip()
    for m in MACHINES:
        have = on_machine(m, "docker", "image", "inspect", "-f", "{{.Id}}", IMAGES[1], quiet=True)
        assert have.stdout.strip() == want, (m, have.stdout, have.stderr)


def test_the_registry_wants_its_password(stack):
    """A student on the user node reaches the registry's port, but neither
    lists, pulls nor pushes without the course's password, nor reads it
    (or the munge key) in a worker's container on a machine."""
    url = "https://172.31.90.1:5000/v2"
    for what, args in (
        ("list", [f"{url}/_catalog"]),
        ("pull", [f"{url}/delegate/sandbox/manifests/latest"]),
        ("push", ["-X", "POST", f"{url}/delegate/sandbox/blobs/uploads/"]),
    ):
        r = on(
            "user",
            "curl",
            "-ksS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            *args,
            user=STUDENT,
            quiet=True,
        )
        assert r.stdout.strip() == "401", (what, r.stdout, r.stderr)
    # Nor does the student read the password where the workers keep it:
    # a root-only secret in each worker's container.
    uid = on("user", "id", "-u", STUDENT, quiet=True).stdout.strip()
    for m, worker in zip(MACHINES, ("worker1", "worker2")):
        c = on_machine(
            m, "docker", "ps", "-q", "--filter", f"name={STACK}_{worker}", quiet=True
        ).stdout.split()
        assert c, (m, worker)
        for secret in ("registry-auth.json", "munge.key"):
            r = on_machine(m, "docker", "exec", "-u", uid, c[0], "cat", f"/run/secrets/{secret}", quiet=True)
            assert r.returncode != 0 and "Permission denied" in r.stderr, (m, secret, r.stdout, r.stderr)


def last_start_of(user: str) -> float:
    """When the last of `user`'s running jobs started (Slurm's record, the
    head's clock)."""
    r = on(
        "head", "env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-u", user, "-t", "R", "-o", "%S", quiet=True
    )
    starts = [float(x) for x in r.stdout.split() if x.isdigit()]
    assert starts, r.stdout + r.stderr
    return max(starts)


def one_call_on_each_machine(seconds: int) -> list[str]:
    """Two calls of `seconds` each (their own exclusive jobs), submitted by
    the student; returns their ids once each machine's own engine holds
    one sandbox."""
    r = on(
        "user", "delegate", "submit", "--time", "5m", "--count", "2", "--",
        "sh", "-c", f"sleep {seconds}; hostname", user=STUDENT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()

    def detail():
        queue = on("head", "squeue", "-t", "all", quiet=True).stdout
        st = on("user", "delegate", "status", *ids, user=STUDENT, quiet=True).stdout
        return f"\nsqueue:\n{queue}\ncalls:\n{st}"

    wait_until(
        "a sandbox on each machine's engine",
        lambda: all(len(sandboxes(m)) == 1 for m in MACHINES),
        120,
        1,
        detail=detail,
    )
    return ids


def calls_on_both_machines() -> None:
    """Two calls, each its own exclusive job: while they run, each
    machine's own engine holds one sandbox; they end completed, one on
    each worker; their sandboxes are removed on both engines."""
    ids = one_call_on_each_machine(12)
    on("user", "delegate", "wait", *ids, user=STUDENT, timeout=300)
    rows = statuses(ids)
    assert sorted(j.get("host") for j in rows) == ["worker1", "worker2"], rows
    assert all(j["state"] == "completed" for j in rows), rows
    wait_until("sandboxes removed", lambda: not any(sandboxes(m) for m in MACHINES), 60, 1)


def test_calls_run_in_sandboxes_of_both_machines_engines(stack):
    calls_on_both_machines()


def test_a_calls_latency_through_the_caching_home(stack):
    """`submit --wait -- true` through the caching home, five times: every
    call completes; the median is printed (docs/instructors.md records it)."""
    took = []
    for _ in range(5):
        t0 = time.monotonic()
        r = on("user", "delegate", "submit", "--wait", "--", "true", user=STUDENT, quiet=True, timeout=300)
        took.append(time.monotonic() - t0)
        assert r.returncode == 0, r.stderr
    took.sort()
    print(f"submit --wait -- true through the caching home: median {took[2]:.1f} s, max {took[-1]:.1f} s")
    doctor = on("user", "delegate", "doctor", user=STUDENT, quiet=True).stdout
    line = next((ln for ln in doctor.splitlines() if "home uids" in ln), "")
    assert "not squashed, the same on the workers" in line, doctor


def running_tasks() -> set[str]:
    """The ids of the stack's tasks swarm wants running (a restarted
    service's task has a new id)."""
    r = run("docker", "stack", "ps", "-q", "--filter", "desired-state=running", STACK, quiet=True)
    return set(r.stdout.split())


def test_a_machine_removed_then_added_to_the_running_course(stack):
    """`machine remove worker2` while a call runs there: the call finishes
    first, then worker2 leaves Slurm and its machine's container stops.
    `machine add` of the same machine, one command on the running course:
    worker2 takes calls again and no other service restarts."""
    ids = one_call_on_each_machine(30)
    before = running_tasks()
    removing = subprocess.Popen(
        [SCRIPT, "machine", "remove", "worker2"], env=stack, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_until(
        "worker2 draining in Slurm",
        lambda: "drain" in on("head", "sinfo", "-h", "-n", "worker2", "-o", "%T", quiet=True).stdout,
        60,
        1,
    )
    out, _ = removing.communicate(timeout=600)
    assert removing.returncode == 0, out
    rows = statuses(ids)
    assert all(j["state"] == "completed" for j in rows), rows
    assert "worker2" not in on("head", "sinfo", "-h", "-N", "-o", "%N", quiet=True).stdout
    assert not on_machine(
        "m2", "docker", "ps", "-q", "--filter", f"name={STACK}_worker2", quiet=True
    ).stdout.strip()
    listed = run(SCRIPT, "machine", "list", env=stack, quiet=True).stdout.splitlines()[1:]
    assert [ln.split()[1] for ln in listed] == ["m1"], listed
    kept = running_tasks()
    assert kept < before and len(before - kept) == 1, (before, kept)

    added = run(SCRIPT, "machine", "add", f"root@{machine_address('m2')}", env=stack, timeout=600)
    assert added.returncode == 0, added.stderr
    assert "worker2 takes calls" in added.stdout and "nothing else restarted" in added.stdout, added.stdout
    now = running_tasks()
    assert kept < now and len(now - kept) == 1, (kept, now)
    calls_on_both_machines()


def statuses(ids: list[str]) -> list[dict]:
    st = json.loads(on("user", "delegate", "--json", "status", *ids, user=STUDENT, quiet=True).stdout)
    return st if isinstance(st, list) else st.get("jobs", [st])


def head_clock() -> str:
    return on("head", "date", "+%Y-%m-%dT%H:%M:%S", quiet=True).stdout.strip()


def down_events(node: str, since: str) -> list[str]:
    """The node's down events since `since` in Slurm's accounting:
    "STATE|REASON" lines."""
    r = on(
        "head",
        "sacctmgr",
        "-n",
        "-P",
        "list",
        "event",
        f"nodes={node}",
        f"start={since}",
        "format=State,Reason",
        quiet=True,
    )
    return [ln for ln in r.stdout.splitlines() if ln.upper().startswith("DOWN")]


def worker_idle(node: str) -> bool:
    state = on("head", "sinfo", "-h", "-n", node, "-o", "%T", quiet=True).stdout.strip()
    return state == "idle"


def through_a_fault(machine: str, fault, recover=None) -> None:
    """Two calls of 45 s, one on each machine; `fault` hits `machine`
    mid-call (then `recover`, when given, undoes it, given the calls' ids).
    Both calls complete
    (issue 52): the one on `machine` runs again, as a new attempt, once
    Slurm gives its node up, and returns its value (the hostname of the
    worker that ran it to the end), one result, its history in its
    reason; Slurm recorded the worker down with a reason; the worker is
    idle again and both machines take calls again."""
    worker = f"worker{list(MACHINES).index(machine) + 1}"
    since = head_clock()
    ids = one_call_on_each_machine(45)
    fault()
    if recover:
        recover(ids)
    on("user", "delegate", "wait", *ids, user=STUDENT, timeout=600, quiet=True)
    rows = statuses(ids)
    print(json.dumps(rows, indent=1))
    assert all(j["state"] == "completed" and j["reason"] for j in rows), rows
    again = [j for j in rows if "ran again" in j["reason"]]
    assert len(again) == 1 and f"{worker} was lost" in again[0]["reason"], rows
    for j in rows:
        out = on("user", "delegate", "logs", j["id"], user=STUDENT, quiet=True).stdout.split()
        assert out == [j["host"]], (j, out)
    recovered(worker, since)


# A map's call: the first two raise (exit 3, after 10 s: each allocation
# claims one of them first), the others return their worker's name after
# 20 s.
MAP_CALL = 'if [ "$DELEGATE_INDEX" -lt 2 ]; then sleep 10; exit 3; fi; sleep 20; hostname'


def test_a_machine_whose_engine_is_killed_mid_map(stack):
    """Issues 42 and 52: m1's dockerd killed mid-call: its containers
    (worker1, the sandbox) die with it; the machine's init starts the
    engine again, swarm the worker. A map of 8 calls, one allocation per machine, each
    claiming the next call over the caching home. The first two calls raise
    (one on each machine); m1's engine is killed while both allocations run
    a call of 20 s: Slurm requeues m1's allocation, which starts again (on
    m2, or on m1 once it is back) and runs the call it had claimed again, as
    a new attempt from a fresh directory; the call that raised on m1 is not
    run again; the calls nobody had claimed run on either allocation. The
    six others return their 6 values, each call is claimed by an allocation
    of the map, and the map's progress counts each call once. Slurm
    recorded worker1 down with a reason; it is idle again and both machines
    take calls again. (This was two tests, each killing m1's engine: the
    map's and one call on each machine; one fault shows both.)"""
    since = head_clock()
    r = on(
        "user", "delegate", "submit", "--time", "5m", "--count", "8", "--",
        "sh", "-c", MAP_CALL, user=STUDENT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()

    def raised_then_running():
        rows = statuses(ids[:2])
        done = all(j["state"] == "failed" for j in rows)
        return done and all(len(sandboxes(m)) == 1 for m in MACHINES)

    wait_until(
        "both raising calls failed and a sandbox on each machine's engine",
        raised_then_running,
        180,
        1,
        detail=lambda: on("user", "delegate", "status", *ids, user=STUDENT, quiet=True).stdout,
    )
    on_machine("m1", "pkill", "-KILL", "-x", "dockerd")
    on("user", "delegate", "wait", *ids, user=STUDENT, timeout=900, quiet=True)
    rows = statuses(ids)
    print(json.dumps(rows, indent=1))
    raised, returned = rows[:2], rows[2:]
    assert [j["state"] for j in raised] == ["failed"] * 2, raised
    assert sorted(j.get("host") for j in raised) == ["worker1", "worker2"], raised
    assert not any("ran again" in j["reason"] for j in raised), raised
    assert [j["state"] for j in returned] == ["completed"] * 6, returned
    again = [j for j in returned if "ran again" in j["reason"]]
    assert len(again) == 1 and "worker1 was lost" in again[0]["reason"], rows
    for j in returned:
        out = on("user", "delegate", "logs", j["id"], user=STUDENT, quiet=True).stdout.split()
        assert out == [j["host"]], (j, out)
    base = rows[0]["slurm_id"]
    claims = [
        on("user", "cat", f"{HOME}/{STUDENT}/.delegate/jobs/{i}/claim", user=STUDENT, quiet=True).stdout
        for i in ids
    ]
    assert all(c.startswith(f"{base}_") for c in claims), claims
    assert {c.split()[0] for c in claims} == {f"{base}_0", f"{base}_1"}, claims
    recovered("worker1", since)


def recovered(worker: str, since: str) -> None:
    """Slurm recorded `worker` down (since the head's clock `since`) with a
    reason in its accounting; the worker is idle again; both machines take
    calls."""
    events = {}

    def recorded():
        events["down"] = down_events(worker, since)
        return any(e.split("|", 1)[1].strip() for e in events["down"])

    wait_until(
        f"{worker}'s down event with a reason in Slurm's accounting",
        recorded,
        120,
        3,
        detail=lambda: str(events),
    )
    wait_until(
        f"{worker} idle again",
        lambda: worker_idle(worker),
        300,
        3,
        detail=lambda: on("head", "sinfo", "-N", "-o", "%N %T %E", quiet=True).stdout,
    )
    calls_on_both_machines()


def running_on(job: str) -> str:
    """Waits until the call runs a sandbox; returns its worker."""
    found = {}

    def running():
        (j,) = statuses([job])
        found.update(j)
        return j["state"] == "running" and j.get("host")

    wait_until(f"{job} running", running, 300, 1, detail=lambda: str(found))
    return found["host"]


def kill_engines_under(*workers: str) -> None:
    """Kills the engine of each worker's machine once its sandbox runs."""
    for w in workers:
        m = list(MACHINES)[int(w.removeprefix("worker")) - 1]

        def detail(m=m):
            ps = on_machine(m, "docker", "ps", "-a", quiet=True).stdout
            queue = on("head", "squeue", "-t", "all", "-o", "%i %T %N %r", quiet=True).stdout
            return f"\n{m}'s containers:\n{ps}\nsqueue:\n{queue}"

        wait_until(f"a sandbox on {m}'s engine", lambda m=m: len(sandboxes(m)) == 1, 120, 1, detail=detail)
        on_machine(m, "pkill", "-KILL", "-x", "dockerd")


def test_calls_whose_machines_die_end_lost_once_their_retries_are_spent(stack):
    """Issue 52: a call submitted with --retries 0 whose machine dies ends
    lost with its reason, as before retries; a call with --retries 1 runs
    again when its machine dies, and when the machine of its second attempt
    dies too it ends lost naming both attempts. Both machines' engines are
    killed at once (one call on each), then the engine under the second
    attempt. (Calls of 10 minutes: each is killed long before; through the
    caching home a call is seen running some 30 s after it starts.)"""

    def submit(retries: int) -> str:
        r = on(
            "user", "delegate", "submit", "--time", "15m", "--retries", str(retries), "--",
            "sh", "-c", "sleep 600; hostname", user=STUDENT,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    try:
        spent_both_ways(submit)
    finally:
        # (a failure must not leave a 10-minute call to hold a worker
        # under the next test)
        on("head", "scancel", "-u", STUDENT, quiet=True)


def spent_both_ways(submit) -> None:
    once = submit(0)
    first = running_on(once)
    twice = submit(1)
    second = running_on(twice)
    assert {first, second} == {"worker1", "worker2"}, (first, second)
    kill_engines_under(first, second)
    wait_until(f"{once} lost", lambda: statuses([once])[0]["state"] == "lost", 300, 3)
    (lost,) = statuses([once])
    assert "NODE_FAIL" in lost["reason"] and "ran again" not in lost["reason"], lost
    assert lost.get("host") == first, lost
    wait_until(
        f"{twice}'s second attempt running",
        lambda: (
            "(attempt 2)" in statuses([twice])[0]["reason"] and statuses([twice])[0]["state"] == "running"
        ),
        400,
        2,
        detail=lambda: str(statuses([twice])),
    )
    kill_engines_under(statuses([twice])[0]["host"])
    on("user", "delegate", "wait", twice, user=STUDENT, timeout=600, quiet=True)
    (spent,) = statuses([twice])
    print(json.dumps([lost, spent], indent=1))
    assert spent["state"] == "lost", spent
    assert "attempt 1 on" in spent["reason"] and "attempt 2 on" in spent["reason"], spent
    assert "its retries" in spent["reason"], spent
    for w in ("worker1", "worker2"):
        wait_until(f"{w} idle again", lambda w=w: worker_idle(w), 300, 3)
    calls_on_both_machines()


def test_a_machine_cut_off_the_network_mid_call(stack):
    """m1 drops every packet on the machines' network until Slurm has marked
    worker1 down as not responding (past SlurmdTimeout) and the call it ran
    runs again on m2; then m1 is reconnected while that attempt runs: one
    result, the new attempt's."""
    rules = ["INPUT -i eth0 -j DROP", "OUTPUT -o eth0 -j DROP"]

    def cut():
        for rule in rules:
            assert on_machine("m1", "iptables", "-I", *rule.split()).returncode == 0, rule

    def reconnect(ids):
        def again_elsewhere():
            return any(j["state"] == "running" and "(attempt 2)" in j["reason"] for j in statuses(ids))

        try:
            wait_until(
                "the cut-off machine's call running again on the other machine",
                again_elsewhere,
                300,
                2,
                detail=lambda: str(statuses(ids)),
            )
        finally:
            for rule in rules:
                on_machine("m1", "iptables", "-D", *rule.split())

    through_a_fault("m1", cut, reconnect)


def test_a_machine_stopped_and_started_mid_call(stack):
    """m2 stopped (its containers and dockerd with it) and started again:
    its staging mount comes back from its boot script, swarm restarts its
    worker."""

    def start(_ids):
        assert machine_docker("start", "m2", timeout=120).returncode == 0
        wait_until(
            "m2's engine answers", lambda: on_machine("m2", "docker", "info", quiet=True).returncode == 0, 120
        )
        prop = on_machine(
            "m2", "findmnt", "-n", "-o", "PROPAGATION", "--mountpoint", "/run/delegate-stack", quiet=True
        )
        assert prop.stdout.strip().startswith("shared"), prop.stdout

    through_a_fault("m2", lambda: machine_docker("stop", "-t", "5", "m2", timeout=120), start)


def restart_the_managers_engine() -> None:
    """The manager restarted as far as this host can be: its engine stopped
    (SIGTERM: it stops everything it runs, the stack's services there and
    the registry, and keeps the swarm's state on disk), the home unmounted;
    then the home mounted as at boot and the engine started again with its
    first command line, logging where build_cluster.sh --local's did. The
    machines, containers of their own engine, run on."""
    pid = int(Path("/var/run/docker.pid").read_text())
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    os.kill(pid, signal.SIGTERM)
    wait_until("the manager's engine stopped", lambda: not Path(f"/proc/{pid}").exists(), 120, 1)
    run("umount", HOME, check=True)
    run(MACHINES_TOOL, "home", check=True)
    Path("/var/log/delegate").mkdir(parents=True, exist_ok=True)
    with open("/var/log/delegate/dockerd.log", "ab") as log:
        new = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    testlib.record_started("dockerd", new.pid)
    wait_until(
        "the manager's engine answers", lambda: run("docker", "info", quiet=True).returncode == 0, 120, 1
    )


def test_the_manager_restarted_mid_call(stack):
    """The manager restarted (restart_the_managers_engine) a few s into a call
    on each machine: swarm on the manager comes back and starts the head,
    the database and the user node again; slurmctld reads its saved state,
    the workers' slurmds find it again, and the running calls complete. No
    worker goes down; both take calls again."""
    ids = one_call_on_each_machine(45)
    # slurmctld saves a job's start within 5 s; a head that dies before
    # that finds the job running twice and kills it (docs/instructors.md,
    # "Limits of the stack"): restarted once the state it saved is newer
    # than both starts (a save after the moment the sandboxes were seen,
    # as this waited for before, may never come: nothing changes then).
    wait_state_saved(last_start_of(STUDENT))
    restart_the_managers_engine()

    def answers():
        try:
            return on("user", "delegate", "status", *ids, user=STUDENT, quiet=True).returncode == 0
        except AssertionError:  # (no user container yet)
            return False

    wait_until("the user node and the head answer again", answers, 300, 3)
    on("user", "delegate", "wait", *ids, user=STUDENT, timeout=600, quiet=True)
    rows = statuses(ids)
    print(json.dumps(rows, indent=1))
    assert all(j["state"] == "completed" for j in rows), rows
    assert {j.get("host") for j in rows} == {"worker1", "worker2"}, rows
    nodes = run("docker", "node", "ls", "--format", "{{.Hostname}} {{.Status}}", quiet=True).stdout
    assert all(ln.split()[1] == "Ready" for ln in nodes.splitlines()), nodes
    # (a map's allocations are as many as the nodes Slurm has usable when
    # it is submitted)
    for w in ("worker1", "worker2"):
        wait_until(f"{w} idle", lambda w=w: worker_idle(w), 300, 3)
    calls_on_both_machines()
