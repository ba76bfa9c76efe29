"""What the stack tests (tests/cluster/test_*.py) share: where the stack
is, running a command on the host, the stack's running containers and
commands in them.

The stack's settings come from the environment as for build_cluster.sh
(DELEGATE_STACK_NAME, DELEGATE_STACK_DIR, DELEGATE_STACK_HOME), so a test
run can keep its stack apart from another one.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import testlib  # noqa: E402

SCRIPT = str(REPO / "build_cluster.sh")
STACK = os.environ.get("DELEGATE_STACK_NAME", "delegate")
STACK_DIR = Path(os.environ.get("DELEGATE_STACK_DIR", "/srv/delegate-stack"))
HOME = os.environ.get("DELEGATE_STACK_HOME", str(STACK_DIR / "home"))
# The hub's per-student memory in the shared stack (conftest.py's
# DELEGATE_HUB_STUDENT_MEM): enough for a JupyterLab, a kernel and delegate
# calls; small enough for test_hub to fill quickly.
HUB_STUDENT_MEM = 768 << 20

# The roster the shared stack enrols before its deploy (conftest.py), as an
# instructor does on day one: two students and an instructor (test_hub).
HUB_ADA, HUB_BOB, HUB_IVY = "hub-ada", "hub-bob", "hub-ivy"
# The short rush's students and its flooder (test_rush.py): enrolled with
# the hub's roster, before the shared stack's deploy (a roster added to a
# running stack redeploys it).
RUSH_STUDENTS = tuple(f"rush-s{i:02d}" for i in range(1, 31))
RUSH_FLOODER = "rush-flood"
HUB_ROSTER = (
    "username,full name,email,role\n"
    'hub-ada,"Lovelace, Ada",ada@example.org\n'
    "hub-bob,Bob Hub,\n"
    "hub-ivy,Ivy Instructor,ivy@example.org,instructor\n"
    + "".join(f"{u},Rush Student {u[-2:]},\n" for u in RUSH_STUDENTS)
    + f"{RUSH_FLOODER},Rush Flooder,\n"
)

# cluster.toml DELEGATE_STACK_TEST_USERS
STUDENT = "dlg-test1"
OTHER = "dlg-test2"

# What `docker exec` says when the container went away under it (a
# service's task replaced by a new one): the command is tried again in the
# new container.
_GONE = ("No such container", "is not running", "not found")


def run(*args, timeout=1800, quiet=False, check=False, **kw) -> subprocess.CompletedProcess:
    """ARGS on the host, output captured (and printed, for the test's
    report, unless quiet); with check, a failure fails the test."""
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if not quiet:
        print(
            "$",
            " ".join(map(str, args))[:400],
            f"-> {r.returncode}",
            r.stdout[-6000:],
            r.stderr[-4000:],
            sep="\n",
        )
    if check:
        assert r.returncode == 0, f"{args} failed: {r.stderr[-2000:]}"
    return r


def readme_block(after: str) -> str:
    """The first ```python block of the README after the line AFTER."""
    text = (REPO / "README.md").read_text()
    rest = text[text.index(after) :]
    m = re.search(r"```python\n(.*?)```", rest, re.S)
    assert m, f"no python block after {after!r} in the README"
    return m.group(1).strip()


def initial_password(user: str) -> str:
    """USER's initial hub password (the roster's secrets file, root only)."""
    for line in (STACK_DIR / "secrets" / "initial-passwords").read_text().splitlines():
        name, _, pw = line.partition(" ")
        if name == user:
            return pw
    raise AssertionError(f"no initial password of {user}")


def cid(service: str) -> str:
    """The running container of the stack's SERVICE, "" when none runs."""
    ids = run(
        "docker", "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={STACK}_{service}",
        "--filter", "status=running", quiet=True,
    ).stdout.split()  # fmt: skip
    return ids[0] if ids else ""


def as_user(user: str, service: str = "user") -> list[str]:
    """`docker exec` options that run a command as USER the way a login
    would: in their home, with HOME and USER; on the user node also their
    own Slurm configuration (SLURM_CONF: it names their own munged; the hub
    sets it for their server, /etc/profile.d for login shells)."""
    home = f"{HOME}/{user}"
    opts = ["-u", user, "-w", home, "-e", f"HOME={home}", "-e", f"USER={user}"]
    if service == "user":
        opts += ["-e", f"SLURM_CONF=/etc/slurm/users/{user}/slurm.conf"]
    return opts


def on(
    service: str, *cmd, user: str | None = None, env=(), timeout=300, quiet=False, **kw
) -> subprocess.CompletedProcess:
    """CMD in SERVICE's running container: as `user` (see as_user) or as
    root, with the extra environment ENV ("K=V" strings). `input=` is
    passed to the command's stdin."""
    opts = ["-i"] if "input" in kw else []
    if user:
        opts += as_user(user, service)
    for e in env:
        opts += ["-e", e]
    for _ in range(5):
        c = cid(service)
        assert c, f"{service} has no running container"
        r = run("docker", "exec", *opts, c, *cmd, timeout=timeout, quiet=quiet, **kw)
        gone = r.returncode != 0 and r.stderr.startswith("Error") and any(g in r.stderr for g in _GONE)
        if not gone:
            return r
        time.sleep(3)
    return r


@contextlib.contextmanager
def deployed(*args: str, env: dict | None = None) -> Iterator[subprocess.CompletedProcess]:
    """The stack deployed with build_cluster.sh's deploy ARGS (a failed
    deploy fails the test) and taken down afterwards, whatever happened
    (a failed `down` fails the test too)."""
    r = run(SCRIPT, "deploy", *args, timeout=1800, env=env)
    try:
        assert r.returncode == 0, "deploy failed"
        yield r
    finally:
        down = run(SCRIPT, "down", timeout=600, env=env)
        assert down.returncode == 0, "down failed"


def require_root() -> None:
    """Fails the whole session unless it runs as root: the stack suites
    deploy with Docker and swarm, and a run that skipped them all would
    read as green having tested nothing."""
    if os.geteuid() != 0:
        import pytest

        pytest.exit(
            "the stack's suites deploy with Docker and swarm: run them as root (tests/run.sh)", returncode=1
        )


def wait_until(what: str, cond, timeout: float, step: float = 2, detail=None):
    """testlib.wait_until, asking every 2 s by default (each question here
    is a `docker exec` or more)."""
    return testlib.wait_until(what, cond, timeout, step, detail)


# The emulated worker machines (tests/machines/machines.sh) and the worker
# number each one becomes.
MACHINES_TOOL = str(REPO / "tests" / "machines" / "machines.sh")
MACHINES = ("m1", "m2")


def machine_docker(*args, **kw) -> subprocess.CompletedProcess:
    """docker ARGS on the machines' engine (`exec m1 ...`, `stop m2`): the
    machines are containers of their own engine, not of this host's (the
    manager's); machines.sh knows its socket."""
    return run(MACHINES_TOOL, "docker", *args, **kw)


def machine_address(m: str) -> str:
    return run(MACHINES_TOOL, "address", m, quiet=True).stdout.strip()


@contextlib.contextmanager
def worker_machines(env: dict | None = None) -> Iterator[tuple[dict, list[str]]]:
    """The machines up (their home served over the network and mounted
    here too), each joined with `build_cluster.sh machine add` in order
    (worker1 on m1, worker2 on m2). Yields the environment of a deploy with
    placement (ENV and DELEGATE_STACK_PLACEMENT, the workers, the ssh
    command) and each `machine add`'s output; then the machines down and
    the swarm left when no stack is in it."""
    if run("docker", "info", "-f", "{{.Swarm.LocalNodeState}}", quiet=True).stdout.strip() != "inactive":
        raise AssertionError(
            "this host's engine is already in a swarm: the machines join the one deploy makes"
        )
    try:
        assert run(MACHINES_TOOL, "up", timeout=1800).returncode == 0, "tests/machines/machines.sh up failed"
        placed = dict(
            env or os.environ,
            DELEGATE_STACK_PLACEMENT="1",
            DELEGATE_STACK_WORKERS=str(len(MACHINES)),
            # (slots for one machine more than there are: the services
            # stay few)
            DELEGATE_STACK_SLOTS=str(len(MACHINES) + 1),
            # Slurm gives a dead machine up after 30 s instead of 60: each
            # machine fault of the suites waits for it (a site's choice,
            # docs/benchmarks.md "A machine lost mid-call (issue 52)").
            DELEGATE_SLURMD_TIMEOUT="30",
            DELEGATE_MACHINE_SSH=run(MACHINES_TOOL, "ssh", quiet=True).stdout.strip(),
        )
        outs = []
        for m in MACHINES:
            r = run(SCRIPT, "machine", "add", f"root@{machine_address(m)}", env=placed, timeout=600)
            assert r.returncode == 0, r.stderr
            outs.append(r.stdout)
        yield placed, outs
    finally:
        run(MACHINES_TOOL, "down", timeout=600)
        # (`docker stack ls` has no -q: it failed and printed nothing, so the
        # swarm was left even with a stack in it)
        if run("docker", "stack", "ls", "--format", "{{.Name}}", quiet=True).stdout.strip() == "":
            run("docker", "swarm", "leave", "--force", quiet=True)


# slurmctld's StateSaveLocation in the head (stack/delegate-stack.yml.j2).
CTLD_STATE = "/var/lib/delegate/slurm/ctld/job_state"


def head_seconds() -> float:
    """The head's clock, in seconds since the epoch."""
    return float(on("head", "date", "+%s.%N", quiet=True).stdout.strip())


def wait_state_saved(since: float, timeout: float = 30) -> None:
    """Until slurmctld has saved its jobs' state after `since` (the head's
    clock): a head killed after that finds its jobs again (it writes a
    change within 5 s, SAVE_MAX_WAIT)."""

    def saved() -> bool:
        r = on("head", "stat", "-c", "%.9Y", CTLD_STATE, quiet=True)
        return r.returncode == 0 and float(r.stdout.strip()) > since

    wait_until("slurmctld's job state saved", saved, timeout, 0.5)
