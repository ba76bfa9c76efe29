"""JupyterHub on the stack's user node (docs/security.md, "The hub").

Installed in the user image as /etc/jupyterhub/jupyterhub_config.py and run
by docker/cluster-entrypoint.sh (role `user`) as root:

- the proxy (configurable-http-proxy) serves HTTPS on :8888 with the
  certificate the entrypoint installs in /etc/jupyterhub/tls/;
- students log in with their course account (PAM against the node's
  /etc/passwd and /etc/shadow, which the entrypoint fills from the
  `accounts` config and the `hub_passwords` secret); only the accounts of
  that config may log in, members of the admin group are hub admins;
- each student's JupyterLab runs as their own uid, in their home on the
  shared filesystem, from /opt/delegate/venv (the delegate package; the
  `delegate` CLI is /usr/local/bin/delegate), with per-process resource
  limits set before the switch to the student's uid (LimitedSpawner);
- idle servers are stopped by jupyterhub-idle-culler;
- the hub's state (sqlite, the cookie secret) is in /var/lib/jupyterhub, a
  bind mount of $DELEGATE_STACK_DIR/hub on the host, kept by `update`.

Settings come from the environment the stack file gives the service
(DELEGATE_HUB_*); a missing or malformed value falls back to its default.
"""

from __future__ import annotations

import os
import resource
import secrets
import sys
from pathlib import Path

from jupyterhub.auth import PAMAuthenticator
from jupyterhub.spawner import LocalProcessSpawner

c = get_config()  # noqa: F821  (injected by JupyterHub when it loads this file)

CFG = Path("/etc/delegate-stack")
STATE = Path("/var/lib/jupyterhub")
TLS = Path("/etc/jupyterhub/tls")
MAX_ACCOUNTS_BYTES = 4 << 20


def env_int(name: str, default: int, low: int, high: int) -> int:
    """An integer setting from the environment, within [low, high]."""
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw)
    except ValueError:
        return default
    return value if low <= value <= high else default


def env_float(name: str, default: float, low: float, high: float) -> float:
    """A number setting from the environment, within [low, high]."""
    try:
        value = float(os.environ.get(name, "").strip())
    except ValueError:
        return default
    return value if low <= value <= high else default


def env_bytes(name: str, default: str) -> int:
    """A size setting such as 2G, 512M (bytes); the default when malformed."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    for raw in (os.environ.get(name, "").strip().upper(), default):
        if raw[-1:] in units and raw[:-1].isdigit():
            return int(raw[:-1]) * units[raw[-1]]
        if raw.isdigit():
            return int(raw)
    raise ValueError(f"bad default size {default!r}")


def course_accounts() -> tuple[set[str], set[str], set[str]]:
    """Names of the accounts config ("name uid [role [full name]]" lines)
    of the course, those among them whose role is instructor, and the
    instructor's test accounts (role ``test``: `build_cluster.sh test` logs
    in with one; not listed as members of the course)."""
    names: set[str] = set()
    instructors: set[str] = set()
    tests: set[str] = set()
    path = CFG / "accounts"
    if path.stat().st_size > MAX_ACCOUNTS_BYTES:
        raise SystemExit(f"{path} is larger than {MAX_ACCOUNTS_BYTES} bytes")
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0].startswith("#"):
            continue
        if len(fields) > 2 and fields[2] == "test":
            tests.add(fields[0])
            continue
        names.add(fields[0])
        if len(fields) > 2 and fields[2] == "instructor":
            instructors.add(fields[0])
    return names, instructors, tests


class CourseAuthenticator(PAMAuthenticator):
    """PAM logins of the course's accounts (``allowed_users``: listed on the
    admin page from the start) and of the instructor's test accounts
    (allowed, but not listed before they log in; `build_cluster.sh test`
    removes its test login from the hub afterwards)."""

    test_accounts: frozenset[str] = frozenset()

    def check_allowed(self, username, authentication=None):
        return username in self.test_accounts or super().check_allowed(username, authentication)


def check_token() -> str:
    """The API token of the `delegate-check` service (root only, made once):
    `build_cluster.sh test` removes its test login with it."""
    path = STATE / "check-api-token"
    token = path.read_text().strip() if path.exists() else ""
    if len(token) != 64:
        tmp = STATE / f".check-api-token.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.replace(tmp, path)
        token = path.read_text().strip()
    return token


def admin_group() -> str | None:
    """The admin group's name (first field of the `admins` config)."""
    try:
        fields = (CFG / "admins").read_text(encoding="utf-8").split()
    except OSError:
        return None
    return fields[0] if fields else None


MEM_LIMIT = env_bytes("DELEGATE_HUB_MEM_LIMIT", "2G")
NPROC_LIMIT = env_int("DELEGATE_HUB_NPROC_LIMIT", 256, 16, 1 << 20)
NOFILE_LIMIT = env_int("DELEGATE_HUB_NOFILE_LIMIT", 4096, 256, 1 << 20)
NICE = env_int("DELEGATE_HUB_NICE", 5, 0, 19)
IDLE_TIMEOUT = env_int("DELEGATE_HUB_IDLE_TIMEOUT", 3600, 60, 7 * 86400)


STUDENT_MEM = env_bytes("DELEGATE_HUB_STUDENT_MEM", "2G")
STUDENT_CPUS = env_float("DELEGATE_HUB_STUDENT_CPUS", 1.0, 0.01, 1024.0)
# The host's cgroup subtree for the students (build_cluster.d/hub.sh,
# hub_cgroups): memory and cpu on cgroup v1, the same v2 directory twice.
CGROUP = Path("/run/delegate-cgroup")
CFS_PERIOD_US = 100_000


def student_cgroups(user: str) -> list[Path]:
    """The cgroups of `user`'s server, made when missing, with the
    student's limits; [] when the host gave no cgroup subtree. Run as root
    (in the child, before it becomes the student)."""
    mem, cpu = CGROUP / "memory", CGROUP / "cpu"
    quota = max(1000, int(STUDENT_CPUS * CFS_PERIOD_US))
    if (mem / "cgroup.controllers").exists():  # cgroup v2: one group
        d = mem / user
        d.mkdir(mode=0o755, exist_ok=True)
        (d / "memory.max").write_text(str(STUDENT_MEM))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        (d / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
        return [d]
    if not (mem / "cgroup.procs").exists() or not (cpu / "cgroup.procs").exists():
        return []
    m, c = mem / user, cpu / user
    m.mkdir(mode=0o755, exist_ok=True)
    c.mkdir(mode=0o755, exist_ok=True)
    (m / "memory.limit_in_bytes").write_text(str(STUDENT_MEM))
    if (m / "memory.memsw.limit_in_bytes").exists():
        # Memory and swap together: no way around the limit through swap.
        (m / "memory.memsw.limit_in_bytes").write_text(str(STUDENT_MEM))
    (c / "cpu.shares").write_text("1024")  # every student the same share
    (c / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
    (c / "cpu.cfs_quota_us").write_text(str(quota))
    return [m, c]


class LimitedSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose servers start with limits, set as root
    before the switch to the student's uid: the student's own cgroup
    (student_cgroups: the memory of their server and everything it starts
    together, and a CPU cap with an equal share under contention), and
    rlimits per process (address space, open files, no core dumps) and per
    uid (processes). The student cannot leave the group: its cgroup.procs
    files belong to root. The whole user node is bounded by the subtree's
    and the service's limits."""

    def make_preexec_fn(self, name):
        switch_user = super().make_preexec_fn(name)

        def preexec() -> None:
            try:
                groups = student_cgroups(name)
            except OSError as e:
                # A student without their limits must not start.
                raise RuntimeError(f"cannot set up the cgroup of {name}: {e}") from e
            for g in groups:
                (g / "cgroup.procs").write_text(str(os.getpid()))
            resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
            resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE_LIMIT, NOFILE_LIMIT))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.nice(NICE)
            switch_user()

        return preexec


accounts, instructors, test_accounts = course_accounts()
group = admin_group()

c.JupyterHub.bind_url = "https://:8888/"
c.JupyterHub.ssl_cert = str(TLS / "hub.crt")
c.JupyterHub.ssl_key = str(TLS / "hub.key")
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = 8081
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = "/run/jupyterhub.pid"
c.ConfigurableHTTPProxy.command = ["/usr/local/bin/configurable-http-proxy"]
c.ConfigurableHTTPProxy.pid_file = "/run/jupyterhub-proxy.pid"
# The servers live in this container: they stop with the hub.
c.JupyterHub.cleanup_servers = True

CourseAuthenticator.test_accounts = frozenset(test_accounts)
c.JupyterHub.authenticator_class = CourseAuthenticator
c.PAMAuthenticator.allowed_users = accounts
c.PAMAuthenticator.admin_users = instructors
if group:
    c.PAMAuthenticator.admin_groups = {group}
# Only the hub's own login: no PAM session (no pam_systemd, no utmp here).
c.PAMAuthenticator.open_sessions = False
# Admins manage users and servers; they do not get into students' servers.
c.JupyterHub.admin_access = False

c.JupyterHub.spawner_class = LimitedSpawner
c.Spawner.default_url = "/lab"
c.Spawner.cmd = ["/opt/delegate/venv/bin/jupyterhub-singleuser"]


def slurm_conf(spawner) -> str:
    """The student's own Slurm configuration: it names their own munged
    (docker/cluster-entrypoint.sh, munge_per_account)."""
    return f"/etc/slurm/users/{spawner.user.name}/slurm.conf"


c.Spawner.environment = {"SHELL": "/bin/bash", "LANG": "C.UTF-8", "SLURM_CONF": slurm_conf}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90

c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={IDLE_TIMEOUT}",
            "--cull-every=60",
        ],
    },
    {"name": "delegate-check", "api_token": check_token()},
    # The instructor's page of the rush (stack/rush_page.py): for the hub's
    # admins alone (instructors and the admin group; JupyterHub's admin role
    # is the only one that holds access:services), listed in their Services
    # menu as "rush". It runs as root here: Slurm shows every student's jobs only to
    # root and SlurmUser (PrivateData).
    {
        "name": "rush",
        "display": True,
        "info": {"description": "The rush, live (the course's instructors only)"},
        "url": "http://127.0.0.1:10102",
        "command": [sys.executable, "/etc/jupyterhub/rush_page.py"],
        "oauth_no_confirm": True,
    },
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    },
    # Only the test accounts: it removes its test login, no one else.
    {
        "name": "delegate-check",
        "scopes": [f"delete:users!user={u}" for u in sorted(test_accounts)],
        "services": ["delegate-check"],
    },
]
