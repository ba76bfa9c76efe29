"""The student's home over a network filesystem that caches (issue 41,
first step). Kernel NFS is not available here: the home is mounted on the
caller's side through sshfs (FUSE) in a private mount namespace, with
NFS-like caches on (attributes 3 s as acregmin, entries and negative
lookups 30 s as acdirmin), while the worker side sees the server's files.
The caller runs the client as the student there.

Found here: a file looked up before the runner wrote it stays "not found"
on the caller's side for the negative-lookup cache's time, though the
directory lists it; `delegate logs --follow` printed nothing of the job's
output. The client now tries a listed name again until it opens (at most
STALE_LOOKUP_PATIENCE, 90 s): the output comes, late by at most the
cache's time (docs/robustness.md)."""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

CACHES = "attr_timeout=3,entry_timeout=30,negative_timeout=30,cache_timeout=60,dir_cache=yes,kernel_cache"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sftp_server():
    """sshd on 127.0.0.1 serving sftp to the test students by key (the
    home's server); its key pair in a root-only directory."""
    missing = [b for b in ("/usr/sbin/sshd", "/usr/bin/sshfs") if not Path(b).exists()]
    assert not missing, f"{missing} missing (tests/run.sh installs openssh-server and sshfs)"
    d = Path(tempfile.mkdtemp(prefix="delegate-home-server-"))
    # Traversable (sshd reads the authorized keys as the student), not listable;
    # the private keys are root's own (0600).
    d.chmod(0o711)
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    auth = d / "authorized_keys"
    shutil.copy(d / "client.pub", auth)
    auth.chmod(0o644)
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nAuthorizedKeysFile {auth}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM yes\nStrictModes no\n"
        f"PidFile {d}/sshd.pid\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    subprocess.run(["/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")], check=True)
    try:
        yield d, port
    finally:
        pid = (d / "sshd.pid").read_text().strip() if (d / "sshd.pid").exists() else ""
        if pid:
            subprocess.run(["kill", pid], check=False)
        shutil.rmtree(d, ignore_errors=True)


def through_cached_home(server, user, script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`script` (sh) as `user` in their home, which is mounted over sshfs
    with NFS-like caches in a mount namespace of its own."""
    d, port = server
    home = str(user.home)
    mount = (
        f"sshfs -p {port} -o IdentityFile={d}/client,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
        f"LogLevel=ERROR,BatchMode=yes -o allow_other,idmap=none,{CACHES} {user.name}@127.0.0.1:{home} {home}"
    )
    as_user = shlex.join(user.argv("sh", "-c"))
    inner = f"set -e; {mount}; grep -q ' {home} fuse.sshfs ' /proc/self/mounts; exec {as_user} \"$0\""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, f"cd {home} && {script}"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_output_is_followed_through_a_caching_home(alice, sftp_server):
    """The follower looks `stdout` up before the runner writes it: the
    negative lookup is cached. The job's output still comes, whole."""
    t0 = time.monotonic()
    r = through_cached_home(
        sftp_server,
        alice,
        'id=$(delegate submit -- sh -c "sleep 3; echo out-line; echo err-line >&2") && '
        'delegate logs --follow "$id" && delegate status "$id"',
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "out-line" in r.stdout and "err-line" in r.stderr, r.stdout + r.stderr
    assert "completed" in r.stdout, r.stdout
    assert time.monotonic() - t0 < 120


def test_calls_are_neither_lost_nor_misread_through_a_caching_home(alice, sftp_server):
    """A map of five and a call asked about while it runs: every call
    completes with its own output, none is read as lost."""
    r = through_cached_home(
        sftp_server,
        alice,
        "delegate submit --time 1m --count 5 --wait -- sh -c 'echo call-$DELEGATE_INDEX' && "
        # (the second call's status is asked once it is running: polled,
        # for at most 120 s)
        "id=$(delegate submit -- sleep 8) && n=0 && "
        'until delegate status "$id" | grep -qw running; do '
        '  n=$((n + 1)); [ $n -lt 240 ] || { echo "$id never running" >&2; exit 1; }; sleep 0.5; '
        "done && "
        'delegate status "$id" && delegate wait "$id" && '
        'delegate status "$id" && delegate logs "$id"',
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for i in range(5):
        assert f"call-{i}" in r.stdout, r.stdout
    assert "lost" not in r.stdout, r.stdout
    assert [ln.split()[2] for ln in r.stdout.splitlines() if ln.startswith("2")] == [
        "running",
        "completed",
    ], r.stdout
