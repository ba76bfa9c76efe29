"""Helpers shared by the pytest suites (tests/e2e, tests/python): the test
students and a tiny filesystem to fill a delegate root. Each conftest puts
this directory on sys.path."""

from __future__ import annotations

import contextlib
import pwd
import subprocess
from pathlib import Path

# Two test students with fixed ids (the same ids a multi-node deployment gives them).
USERS = {"delegate-alice": 2001, "delegate-bob": 2002}


def ensure_user(name: str, uid: int) -> None:
    """Creates `name` with `uid` (and a group and a home) unless it exists."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--uid", str(uid), "--user-group", "--shell", "/bin/sh", name],
            check=True,
            capture_output=True,
            timeout=60,
        )


def ensure_users(users: dict[str, int] = USERS) -> None:
    for name, uid in users.items():
        ensure_user(name, uid)


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
