"""Helpers shared by the pytest suites (tests/e2e, tests/python): the test
students and a tiny filesystem to fill a delegate root. Each conftest puts
this directory on sys.path."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

# The test students. Their accounts belong to the tests: an account of one of
# these names is reused as it is (whatever its ids), and one that does not
# exist is created with a free id. The harness never creates, changes or
# removes any other account, so it can run on a machine with real users.
USERS = ("delegate-alice", "delegate-bob")
# Only names with this prefix are ever created (a guard against a typo that
# would name a real user).
PREFIX = "delegate-"
# Where the search for a free id starts: the ids a multi-node deployment gives
# the test students (stack/, docker/cluster-entrypoint.sh) when nothing on this
# machine holds them, so a fresh machine gets the usual 2001, 2002, ...
FIRST_ID = 2001
# Never below the range of ordinary accounts, never into the nobody/65534 area.
ID_RANGE = (1000, 60000)
# The comment (GECOS) of the accounts the tests create.
COMMENT = "delegate test student"
# The Slurm account every test student is associated with (build_cluster.sh's
# DELEGATE_COURSE_ACCOUNT): with AccountingStorageEnforce=associations Slurm
# refuses the jobs of a user without an association.
COURSE_ACCOUNT = os.environ.get("DELEGATE_COURSE_ACCOUNT", "course")


class Plan(NamedTuple):
    """What ensure_user does for one name: reuse the account with this uid,
    or create it with this uid (and a group of its own with the same gid)."""

    action: str  # "reuse" or "create"
    uid: int


def wait_until(what: str, cond, timeout: float, step: float = 0.2, detail=None):
    """cond()'s first true value, asked every `step` seconds; after
    `timeout` seconds a failure naming what was awaited, with detail()
    (what the caller knows of the state then) appended. Tests wait on what
    they can observe with this, never with a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s" + (f"; {detail()}" if detail else ""))
        time.sleep(step)


def cpu0() -> dict[str, str]:
    """/proc/cpuinfo's first processor as {field: value}: what this node
    says of its CPU (the stack's workers run on it too)."""
    block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}


def free_id(taken: Iterable[int], prefer: int = FIRST_ID, id_range: tuple[int, int] = ID_RANGE) -> int:
    """The first id from `prefer` up (then from the bottom of `id_range`)
    that is in `id_range` and not in `taken` (pass the uids AND gids in use:
    the new account gets a group with the same id)."""
    lo, hi = id_range
    taken = set(taken)
    start = min(max(prefer, lo), hi)
    for candidate in [*range(start, hi), *range(lo, start)]:
        if candidate not in taken:
            return candidate
    raise RuntimeError(f"no free uid/gid in [{lo}, {hi}) for a test account")


def plan_user(name: str, passwd: Iterable, groups: Iterable, prefer: int = FIRST_ID) -> Plan:
    """Decides, from the account database (`passwd` as pwd.getpwall(),
    `groups` as grp.getgrall()), whether the test account `name` is reused or
    created, and with which uid. Pure: ensure_user applies it."""
    if not name.startswith(PREFIX):
        raise ValueError(f"{name!r} is not a test account name (they start with {PREFIX!r})")
    passwd, groups = list(passwd), list(groups)
    for pw in passwd:
        if pw.pw_name == name:
            if pw.pw_uid < ID_RANGE[0]:
                raise RuntimeError(
                    f"an account {name!r} exists with the system uid {pw.pw_uid}: "
                    "not a test student; the tests will not use or change it"
                )
            return Plan("reuse", pw.pw_uid)
    taken = {pw.pw_uid for pw in passwd} | {gr.gr_gid for gr in groups}
    return Plan("create", free_id(taken, prefer))


def accounting_enforced() -> bool:
    """Slurm keeps accounting in slurmdbd here (so it enforces associations)."""
    if not shutil.which("scontrol"):
        return False
    r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    return any(
        line.split("=", 1)[0].strip() == "AccountingStorageType" and "slurmdbd" in line
        for line in r.stdout.splitlines()
    )


def require_accounting() -> None:
    """Fail (not skip) when the local cluster keeps no accounting: slurmdbd
    and MariaDB start on every machine this project supports, so their
    absence is a broken setup, not a reason to pass over a test."""
    if not accounting_enforced():
        raise AssertionError(
            "Slurm keeps no accounting here (AccountingStorageType is not slurmdbd): "
            "the local cluster is not set up as ./build_cluster.sh --local makes it"
        )


def ensure_association(name: str, account: str = COURSE_ACCOUNT, qos: str | None = None) -> None:
    """The test account `name` has a Slurm association in `account` (the
    course's, as the roster gives students; build_cluster.sh made the account
    and its default QOS), with `qos` as its only QOS when given. Does nothing
    when Slurm keeps no accounting. Idempotent."""
    if not accounting_enforced():
        return
    show = [
        "sacctmgr",
        "-n",
        "-P",
        "show",
        "assoc",
        f"where user={name}",
        f"account={account}",
        "format=user",
    ]
    r = subprocess.run(show, capture_output=True, text=True, timeout=60)
    if not r.stdout.strip():
        add = ["sacctmgr", "-i", "add", "user", name, f"account={account}", f"defaultaccount={account}"]
        r = subprocess.run(add, capture_output=True, text=True, timeout=60)
        if r.returncode != 0 and "Nothing new added" not in r.stdout + r.stderr:
            raise RuntimeError(f"{' '.join(add)} failed: {(r.stdout + r.stderr).strip()}")
    if qos is not None:
        mod = ["sacctmgr", "-i", "modify", "user", "where", f"user={name}", f"account={account}", "set"]
        mod += [f"qos={qos}", f"defaultqos={qos}"]
        r = subprocess.run(mod, capture_output=True, text=True, timeout=60)
        if r.returncode != 0 and "Nothing modified" not in r.stdout + r.stderr:
            raise RuntimeError(f"{' '.join(mod)} failed: {(r.stdout + r.stderr).strip()}")


def ensure_user(name: str, prefer: int = FIRST_ID) -> pwd.struct_passwd:
    """The test account `name`: reused when it exists, else created (with a
    home, a group of its own, a free uid from `prefer` up), and its Slurm
    association in the course account (ensure_association). Returns its entry."""
    entry = _ensure_unix_user(name, prefer)
    ensure_association(name)
    return entry


def _ensure_unix_user(name: str, prefer: int) -> pwd.struct_passwd:
    """The Unix side of ensure_user."""
    for _ in range(20):
        plan = plan_user(name, pwd.getpwall(), grp.getgrall(), prefer)
        if plan.action == "reuse":
            return pwd.getpwnam(name)
        cmd = ["useradd", "--create-home", "--uid", str(plan.uid), "--shell", "/bin/sh"]
        cmd += ["--comment", COMMENT]
        try:
            # A group of this name left behind (userdel keeps a group that has
            # other members): the new account joins it rather than fail.
            grp.getgrnam(name)
            cmd += ["--gid", name]
        except KeyError:
            cmd += ["--user-group"]
        r = subprocess.run([*cmd, name], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return pwd.getpwnam(name)
        # 4: the uid was taken meanwhile (or by an account that getpwall does
        # not list); 9: the name was taken meanwhile. Decide again.
        if r.returncode not in (4, 9):
            raise RuntimeError(f"{' '.join(cmd)} {name} failed (exit {r.returncode}): {r.stderr.strip()}")
        prefer = plan.uid + 1
    raise RuntimeError(f"could not create the test account {name!r}: no free uid found")


def ensure_users(users: Iterable[str] = USERS) -> None:
    """The test students, each reused or created (see ensure_user)."""
    prefer = FIRST_ID
    for name in users:
        prefer = ensure_user(name, prefer).pw_uid + 1


# A QOS of the tests only: one job per student at a time, given to one test
# account only, so a limit is met without touching the course's QOS.
TIGHT_QOS = "delegate-test-tight"


def _sacctmgr(*args: str, check: bool = True) -> None:
    r = subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise RuntimeError(f"sacctmgr {' '.join(args)} failed: {(r.stdout + r.stderr).strip()}")


@contextlib.contextmanager
def tight_qos(name: str, max_submit: int = 1):
    """The test account `name` (created when missing) with TIGHT_QOS (at
    most `max_submit` jobs queued or running) as its only QOS for the
    duration; afterwards its jobs are cancelled, it gets the
    course's QOS back and TIGHT_QOS leaves the course account's list and the
    database, so later suites see the cluster as the deployment made it."""
    _sacctmgr("add", "qos", TIGHT_QOS, check=False)
    _sacctmgr("modify", "qos", TIGHT_QOS, "set", f"MaxSubmitJobsPerUser={max_submit}")
    _sacctmgr("modify", "account", COURSE_ACCOUNT, "set", f"qos+={TIGHT_QOS}", check=False)
    ensure_user(name)
    ensure_association(name, qos=TIGHT_QOS)
    try:
        yield pwd.getpwnam(name)
    finally:
        cancel_jobs(name)
        where = ["modify", "user", "where", f"user={name}", f"account={COURSE_ACCOUNT}", "set"]
        _sacctmgr(*where, "qos=", "defaultqos=-1", check=False)
        _sacctmgr("modify", "account", COURSE_ACCOUNT, "set", f"qos-={TIGHT_QOS}", check=False)
        _sacctmgr("delete", "qos", TIGHT_QOS, check=False)


def containers_of_user(name: str) -> list[str]:
    """Containers (running or not) of user `name`'s calls."""
    return _containers(f"delegate.uid={pwd.getpwnam(name).pw_uid}", check=True)


def containers_with_label(job: str) -> list[str]:
    """Containers (running or not) of delegate job `job`."""
    return _containers(f"delegate.job={job}")


def _containers(label: str, check: bool = False) -> list[str]:
    r = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )
    return r.stdout.split()


def cancel_jobs(*names: str) -> None:
    """Cancels every Slurm job of the given test accounts (held ones too), so
    a suite leaves no pending job behind for the next one to wait on."""
    for name in names:
        if name.startswith(PREFIX):
            subprocess.run(["scancel", "-u", name], capture_output=True, timeout=60, check=False)


def cluster_problem(checks: Iterable[tuple[list[str], str]], files: Iterable[str]) -> str | None:
    """Why the local cluster cannot run jobs, or None: each command of
    `checks` (argv, daemon) must succeed without a node DOWN, each path of
    `files` must exist. Run as root (the suites create users, inspect Docker)."""
    if os.geteuid() != 0:
        return "the tests create users and inspect Docker: run them as root (tests/run.sh)"
    for cmd, what in checks:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{what} does not answer: {e}"
        if r.returncode != 0 or (what == "slurmctld" and "DOWN" in r.stdout):
            return f"{what} does not answer ({' '.join(cmd)}: {r.stdout.strip()} {r.stderr.strip()})"
    for f in files:
        if not Path(f).exists():
            return f"{f} is missing: run ./build_cluster.sh --local"
    return None


OUT_OF_SERVICE = ("down", "drain", "fail", "inval", "not_responding")


def nodes_out_of_service() -> list[str]:
    """`NODE STATE REASON` of each Slurm node that will not take jobs (down,
    drained or draining, failing), by sinfo."""
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], capture_output=True, text=True, timeout=30)
    return [line for line in r.stdout.splitlines() if any(s in line.split()[1] for s in OUT_OF_SERVICE)]


def node_guard(grace: float = 30) -> Iterable[None]:
    """The body of the suites' per-test fixture on the single machine: a
    test that leaves the node out of service (e.g. Slurm drained it on a
    `Duplicate jobid`) fails naming the node's state and reason, and the
    node is resumed so that the tests after it still test something; a node
    that cannot be brought back ends the session at once instead of letting
    every later test wait out its own deadline."""
    import pytest

    yield
    # (a node that is down may be coming back, e.g. its slurmd restarted;
    # a drained one stays so until someone resumes it)
    try:
        wait_until(
            "the node back in service or drained",
            lambda: not (out := nodes_out_of_service()) or "drain" in " ".join(out),
            grace,
            0.5,
        )
    except AssertionError:
        pass
    bad = nodes_out_of_service()
    if not bad:
        return
    for line in bad:
        subprocess.run(
            ["scontrol", "update", f"nodename={line.split()[0]}", "state=resume"],
            capture_output=True,
            timeout=30,
        )
    try:
        wait_until(
            "the node back in service after `scontrol update state=resume`",
            lambda: not nodes_out_of_service(),
            60,
            0.5,
        )
    except AssertionError as e:
        pytest.exit(f"NODE OUT OF SERVICE after this test, the rest cannot run: {bad}; {e}", returncode=1)
    pytest.fail(
        f"this test left a node out of service: {'; '.join(bad)} (resumed for the next tests)", pytrace=False
    )


DAEMON_CHECKS = (
    (["scontrol", "ping"], "slurmctld"),
    (["docker", "info"], "dockerd"),
    (["sinfo", "-h"], "slurm"),
)


def local_cluster(repo: Path, problem, more=lambda: None) -> Iterable[None]:
    """The body of the suites' session fixture: brings the local cluster up
    once when `problem()` names a fault (build_cluster.sh is idempotent),
    fails the session when it or `more()` (what a rebuild does not fix)
    names one, makes the test students, and at the end cancels whatever
    jobs of theirs the suite left (held ones)."""
    import pytest

    why = problem()
    if why and os.geteuid() == 0:
        env = {**os.environ, "DELEGATE_LOCAL_GPUS": os.environ.get("DELEGATE_LOCAL_GPUS", "standin:2")}
        subprocess.run([str(repo / "build_cluster.sh"), "--local"], timeout=1800, env=env)
        why = problem()
    why = why or more()
    if why:
        pytest.fail(f"LOCAL CLUSTER UNAVAILABLE: {why}", pytrace=False)
    ensure_users(USERS)
    yield
    cancel_jobs(*USERS)


@contextlib.contextmanager
def tiny_root(home: Path, uid: int, gid: int, size: str = "256k"):
    """A tiny tmpfs owned by the user below their home (below /home, as the
    policy wants); yields the delegate root to use inside it."""
    mnt = home / "tiny-root"
    mnt.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700,uid={uid},gid={gid}", "tmpfs", str(mnt)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        yield mnt / "jobs"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)
        mnt.rmdir()


def agent_pid() -> int:
    """The pid of this machine's running `sandbox-agent` (of this pid
    namespace: the agents of the stack's workers and of the site's nodes
    run in containers this host sees too)."""
    own = os.readlink("/proc/self/ns/pid")
    for p in Path("/proc").iterdir():
        try:
            if (
                p.name.isdigit()
                and (p / "comm").read_text().strip() == "sandbox-agent"
                and os.readlink(p / "ns" / "pid") == own
            ):
                return int(p.name)
        except OSError:
            continue
    raise AssertionError("no sandbox-agent process")


def record_started(name: str, pid: int) -> None:
    """As build_cluster.sh's record_started: one "name pid" line per daemon
    we started, so `--local stop` finds a daemon a test restarted."""
    f = Path(os.environ.get("DELEGATE_STATE_DIR", "/var/lib/delegate")) / "started"
    if not f.exists():
        return
    lines = [ln for ln in f.read_text().splitlines() if ln and not ln.startswith(name + " ")]
    lines.append(f"{name} {pid}")
    tmp = f.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(f)


RUNUSER = "/usr/sbin/runuser"


def as_user_argv(user: str, *cmd) -> list[str]:
    """CMD run as USER (runuser -u): the one way every suite runs a command
    as a student (each suite's user helper builds on it)."""
    return [RUNUSER, "-u", user, "--", *map(str, cmd)]
