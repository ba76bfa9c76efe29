"""End to end through the real Slurm and the real Docker engine: the
`delegate` CLI submits, sandbox-runner runs one container per job."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import IMAGE, containers_created_since, containers_with_label, sh

import testlib

# perf_event_open(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK) via ctypes: prints the
# count and exits 0, or prints the errno and exits 1.
PERF_PROBE = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = {'x86_64': 298, 'aarch64': 241}[os.uname().machine]
flags = (1 << 5) | (1 << 6)  # exclude_kernel | exclude_hv
attr = struct.pack('IIQQQQQQIIQQ', 1, 64, 1, 0, 0, 0, flags, 0, 0, 0, 0, 0)[:64]
buf = ctypes.create_string_buffer(attr, 64)
fd = libc.syscall(NR, buf, 0, -1, -1, 0)
if fd < 0:
    e = ctypes.get_errno(); print('perf_event_open failed:', os.strerror(e)); sys.exit(1)
x = sum(i * i for i in range(200000))
n = struct.unpack('Q', os.read(fd, 8))[0]
print('task-clock ns', n); sys.exit(0 if n > 0 else 2)
"""


def test_command_round_trip(alice):
    r = alice.run("submit", "--wait", "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "to-stdout"
    assert "to-stderr" in r.stderr


def test_nonzero_exit_code_is_preserved(alice):
    r = alice.run("submit", "--wait", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7, r.stderr
    job = alice.submit("sh", "-c", "exit 3")
    st = alice.wait(job)
    assert st["state"] == "failed" and st["exit_code"] == 3, st
    res = alice.run("result", "--json", job)
    assert res.returncode == 0 and json.loads(res.stdout)["exit_code"] == 3


def test_ten_megabytes_of_stdout_byte_for_byte(alice):
    # The job writes 10 MiB of random bytes to stdout and a copy to its job dir.
    r = alice.run(
        "submit",
        "--wait",
        "--",
        "sh",
        "-c",
        "head -c 10485760 /dev/urandom | tee /job/expected",
        text=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == 10 * 1024 * 1024
    # The newest job dir holding the copy is this job's.
    job = max(
        (p for p in alice.root.iterdir() if (p / "expected").exists()),
        key=lambda p: (p / "expected").stat().st_mtime,
    )
    expected = (job / "expected").read_bytes()
    assert hashlib.sha256(r.stdout).digest() == hashlib.sha256(expected).digest()
    assert (job / "stdout").read_bytes() == expected


def test_sandbox_runs_as_the_submitting_uid(alice):
    r = alice.run("submit", "--wait", "--", "id", "-u")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(alice.uid) != "0"


def test_no_network(alice):
    code = (
        "import socket\n"
        "for host in ('172.17.0.1', '1.1.1.1', '127.0.0.1'):\n"
        "    try:\n"
        "        socket.create_connection((host, 80), timeout=3); print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('refused', host, e)\n"
        "import os; print(sorted(os.listdir('/sys/class/net')))\n"
    )
    r = alice.run("submit", "--wait", "--", "python3", "-c", code)
    assert r.returncode == 0, r.stderr
    assert "CONNECTED" not in r.stdout, r.stdout
    assert r.stdout.strip().splitlines()[-1] == "['lo']"


def test_only_the_job_dir_is_writable(alice):
    code = r"""
import os
mounts = {ln.split()[1]: ln.split()[2] for ln in open('/proc/mounts')}
writable = []
for top in sorted(os.listdir('/')) + ['etc/x', 'usr/local', 'var/tmp']:
    d = '/' + top
    if not os.path.isdir(d) or top in ('proc', 'sys'):
        continue
    try:
        with open(os.path.join(d, '.probe'), 'w') as f:
            f.write('x')
        os.unlink(os.path.join(d, '.probe'))
        writable.append(d)
    except OSError:
        pass
try:
    open('/x', 'w'); print('ROOT WRITABLE')
except OSError as e:
    print('root refused:', e.strerror)
for d in writable:
    print('writable', d, mounts.get(d))
"""
    r = alice.run("submit", "--wait", "--", "python3", "-c", code)
    assert r.returncode == 0, r.stderr
    assert "ROOT WRITABLE" not in r.stdout
    assert "root refused: Read-only file system" in r.stdout
    writable = dict(ln.split()[1:3] for ln in r.stdout.splitlines() if ln.startswith("writable"))
    assert "/job" in writable
    # Anything else writable is a private in-memory filesystem of the container, not the host.
    assert all(fs == "tmpfs" for d, fs in writable.items() if d != "/job"), writable


def test_perf_event_open_in_sandbox_but_not_in_plain_docker(alice):
    r = alice.run("submit", "--wait", "--", "python3", "-c", PERF_PROBE)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "task-clock ns" in r.stdout
    plain = subprocess.run(
        ["docker", "run", "--rm", IMAGE, "python3", "-c", PERF_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 1, (plain.stdout, plain.stderr)
    assert "perf_event_open failed" in plain.stdout


def test_cancel_running_job(alice):
    job = alice.submit("sleep", "600")
    st = alice.wait_for_state(job, {"running"}, timeout=60)
    assert st["state"] == "running", st
    alice.wait_started(job)  # (the container is up)
    t0 = time.monotonic()
    r = alice.run("cancel", job)
    assert r.returncode == 0, r.stderr
    st = alice.wait_for_state(job, {"cancelled", "failed", "lost", "completed", "timed-out"}, timeout=30)
    elapsed = time.monotonic() - t0
    assert st["state"] == "cancelled", st
    assert elapsed < 5, f"cancel took {elapsed:.1f}s"
    assert st["reason"]
    assert containers_with_label(job) == []


def test_time_limit(alice):
    job = alice.submit("sleep", "600", opts=("--time", "5s"))
    st = alice.wait(job, timeout=120)
    assert st["state"] == "timed-out", st
    assert "time limit" in st["reason"]
    assert containers_with_label(job) == []


# ---------------------------------------------------------------------------
# Refusals: each gives its reason in `delegate status`, and no container is created.
# A held submission lets the test tamper with the job dir before the runner sees it.
# ---------------------------------------------------------------------------


def _release_and_check(user, job, t0, expect):
    slurm_id = (
        (user.job_dir(job) / "slurm-id").read_text().strip()
        if (user.job_dir(job) / "slurm-id").exists()
        else (user.job_dir(job).with_name(job + ".real") / "slurm-id").read_text().strip()
    )
    user.as_user("scontrol", "release", slurm_id)
    st = user.wait(job, timeout=120)
    assert st["state"] == "failed", st
    assert st.get("refused") is True, st
    assert expect in st["reason"], st
    assert containers_created_since(job, t0) == []
    return st


def test_refuses_unknown_spec_version(alice):
    job, d, t0 = alice.held()
    spec = bytearray((d / "spec").read_bytes())
    spec[6:8] = (99).to_bytes(2, "little")
    (d / "spec").write_bytes(bytes(spec))
    _release_and_check(alice, job, t0, "version 99")


def test_refuses_oversized_spec(alice):
    job, d, t0 = alice.held()
    with open(d / "spec", "ab") as f:
        f.write(b"\0" * (70 * 1024))
    _release_and_check(alice, job, t0, "more than the limit")


def test_refuses_job_dir_that_is_a_symlink(alice):
    job, d, t0 = alice.held()
    real = d.with_name(job + ".real")
    alice.as_user("mv", str(d), str(real))
    alice.as_user("ln", "-s", str(real), str(d))
    _release_and_check(alice, job, t0, "symbolic link")


def test_refuses_job_dir_owned_by_another_uid(alice, bob):
    job, d, t0 = alice.held()
    sh("chown", f"{bob.uid}:{bob.gid}", str(d))
    try:
        _release_and_check(alice, job, t0, f"owned by uid {bob.uid}")
    finally:
        sh("chown", "-R", f"{alice.uid}:{alice.gid}", str(d))


def test_refuses_image_not_in_allowlist(alice):
    t0 = time.time() - 1
    job = alice.submit("true", opts=("--image", "evil/miner:latest"))
    st = alice.wait(job)
    assert st["state"] == "failed" and st["refused"] is True, st
    assert "not allowed" in st["reason"], st
    assert containers_created_since(job, t0) == []


@pytest.mark.parametrize(
    "opts,expect",
    [
        (("--mem", "999G"), "memory"),
        (("--time", "90m"), "time limit"),  # above the policy (and the partition's MaxTime)
    ],
)
def test_refuses_limits_beyond_policy(alice, opts, expect):
    # Refused by the client before anything is written or submitted (the
    # runner checks the same policy again on every job directory).
    before = sorted(alice.root.iterdir())
    r = alice.run("submit", *opts, "--", "true")
    assert r.returncode != 0
    msg = r.stderr.strip()
    assert msg.startswith("delegate: error: the site does not allow this job: " + expect), msg
    assert "site maximum" in msg and len(msg.splitlines()) == 1, msg
    assert sorted(alice.root.iterdir()) == before


def test_doctor_passes(alice):
    r = alice.run("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.lower()
    for word in ("slurm", "munge", "docker", "image", "perf", "root", "policy"):
        assert word in out, (word, r.stdout)


def test_errors_are_one_clear_sentence(alice):
    r = alice.run("status", "not-a-job-id")
    assert r.returncode == 1
    assert r.stderr.startswith("delegate: error:"), r.stderr
    assert "{" not in r.stderr and "Error(" not in r.stderr


def test_a_job_not_in_a_root_below_an_unlistable_directory_is_no_job(alice):
    """The stack's shared home is 0711 (entered by all, listed by none). A
    job id that is not in the student's root there is "no job", as
    anywhere, not a pending job whose directory "cannot be read": on the
    worker machines' hub another student's job id showed so, and the walk
    that names the component at fault opened the home itself for reading
    (found by the acceptance's TensorBoard check)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp(prefix="delegate-0711-", dir="/tmp"))
    home = top / "shared-home"
    root = home / alice.name / "jobs"
    root.mkdir(parents=True)
    shutil.chown(home / alice.name, alice.uid, alice.gid)
    shutil.chown(root, alice.uid, alice.gid)
    os.chmod(home / alice.name, 0o700)
    os.chmod(top, 0o711)
    os.chmod(home, 0o711)
    missing = "20261127T165047-77327162"
    try:
        r = alice.run("status", missing, env_extra={"DELEGATE_ROOT": str(root)})
    finally:
        shutil.rmtree(top)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.strip() == f"delegate: error: no job {missing} in {root}", r.stderr


def test_a_waiting_call_says_when_it_likely_starts(alice, bob):
    """Issue 56: while Alice's call waits behind Bob's on the one node, its
    status says when Slurm expects it to start (the backfill scheduler's
    estimate, from the time limit of the call ahead: within about 2 min
    here), in minutes; before the scheduler placed it, that there is no
    estimate yet. Nothing of Bob's shows (his name, uid, job id: the
    security round's question of the estimate)."""
    first = bob.submit("sleep", "60", opts=("--time", "2m"))
    bob.wait_started(first)
    bob_sid = bob.status(first)["slurm_id"]
    second = alice.submit("true", opts=("--time", "2m"))
    try:
        seen = []

        def estimate():
            reason = alice.status(second)["reason"]
            seen.append(reason)
            return "likely to start within" in reason

        testlib.wait_until("Slurm's estimate of the call's start", estimate, 90, 1, detail=lambda: seen[-3:])
        # (or, newer than the place helper's last read, that its place comes)
        assert all(
            "likely to start" in r or "no estimate of its start yet" in r or "its place in line comes" in r
            for r in seen
        ), seen
        within = seen[-1].split("likely to start within ")[1]
        mins = 1 if within.startswith("a minute") else int(within.split(" min")[0])
        assert 1 <= mins <= 3, seen[-1]
        shown = alice.run("status", second).stdout + "\n" + seen[-1]
        for his in (bob.name, str(bob.uid), bob_sid, first):
            assert not re.search(rf"\b{re.escape(his)}\b", shown), f"{his!r} of Bob's shows to Alice: {shown}"
    finally:
        alice.run("cancel", second)
        bob.run("cancel", first)


# The place helper's socket (delegate_protocol::place::DEFAULT_PLACE_SOCKET).
PLACE_SOCKET = "/run/delegate-place/place.sock"
# As a student: connect to the helper, print its answer in hex (the student
# reads it raw, as a hostile one would).
ASK_PLACE = f"""
import socket
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect({PLACE_SOCKET!r})
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.hex())
"""


def varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        n |= (b[i] & 0x7F) << shift
        shift += 7
        i += 1
        if b[i - 1] < 0x80:
            return n, i


def place_answer(raw: bytes) -> tuple[list[tuple[str, int, int | None]], str | None]:
    """A place answer's frame (4-byte length, the `DLGT` header of kind P,
    version 2, postcard): its places (job, jobs ahead, likely start in
    seconds or None) and why it has none."""
    length = int.from_bytes(raw[:4], "little")
    body = raw[4 : 4 + length]
    assert body[:4] == b"DLGT" and body[4:5] == b"P" and body[6:8] == b"\x02\x00", body[:8]
    i = 8
    _, i = varint(body, i)  # as_of_ms
    n, i = varint(body, i)
    places = []
    for _ in range(n):
        ln, i = varint(body, i)
        job = body[i : i + ln].decode()
        ahead, i = varint(body, i + ln)
        likely = None
        if body[i] == 1:
            likely, i = varint(body, i + 1)
        else:
            i += 1
        places.append((job, ahead, likely))
    unavailable = None
    if body[i] == 1:
        ln, j = varint(body, i + 1)
        unavailable = body[j : j + ln].decode()
    return places, unavailable


def in_line_before(sid: str) -> int | None:
    """Root's count of the waiting jobs Slurm starts before `sid` (by
    priority, then submit time: the helper's order), held ones left out."""
    out = sh("squeue", "--all", "--array", "-h", "-t", "PENDING", "-o", "%i|%Q|%V|%r").stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    rows.sort(key=lambda r: (-int(r[1]), r[2], r[0]))
    ids = [r[0] for r in rows]
    if sid not in ids:
        return None
    return sum(
        1 for r in rows[: ids.index(sid)] if not r[3].startswith(("JobHeld", "BeginTime", "Dependency"))
    )


def waiting_of(user: str) -> set[str]:
    """Root's view of `user`'s waiting jobs (ids as squeue --array prints)."""
    out = sh("squeue", "--array", "-h", "-t", "PENDING", "-u", user, "-o", "%i").stdout
    return set(out.split())


def test_a_waiting_call_says_how_many_jobs_are_ahead(alice, bob):
    """Issue 56: behind Bob's running call and two of his waiting ones,
    Alice's waiting call says how many jobs Slurm will start before it,
    as root counts them. The helper tells each student only of their own
    jobs: Alice reading its socket raw gets her job and a count, nothing of
    Bob's; two hundred connections of hers held open do not keep Bob's
    answer from him."""
    assert Path(PLACE_SOCKET).is_socket(), (
        "the place helper does not run (build_cluster.sh --local up starts it)"
    )
    running = bob.submit("sleep", "60", opts=("--time", "2m"))
    bob.wait_started(running)
    his = [bob.submit("true", opts=("--time", "2m")) for _ in range(2)]
    mine = alice.submit("true", opts=("--time", "2m"))
    try:
        sid = alice.status(mine)["slurm_id"]
        seen = []

        def as_root_counts():
            reason = alice.status(mine)["reason"]
            seen.append(reason)
            m = re.search(r", (\d+) jobs? ahead;|, (next in line);", reason)
            if not m:
                return False
            shown = 0 if m.group(2) else int(m.group(1))
            return shown == in_line_before(sid)

        testlib.wait_until(
            "Alice's call saying as many jobs ahead as root counts",
            as_root_counts,
            60,
            1,
            detail=lambda: seen[-3:],
        )
        raw = bytes.fromhex(alice.as_user("python3", "-c", ASK_PLACE).stdout.strip())
        places, unavailable = place_answer(raw)
        # (her own waiting jobs only: this one, and any an earlier test left)
        assert unavailable is None and sid in {p[0] for p in places}, places
        assert {p[0] for p in places} <= waiting_of(alice.name), places
        bob_sids = {bob.status(j)["slurm_id"] for j in [running, *his]}
        assert not bob_sids & {p[0] for p in places}, places
        # A flood of held connections: Bob still gets his places.
        flood = alice.popen(
            "python3", "-c",
            f"import socket\nss=[]\nfor _ in range(200):\n s=socket.socket(socket.AF_UNIX)\n"
            f" s.connect({PLACE_SOCKET!r})\n ss.append(s)\nprint('held', flush=True)\nimport sys\nsys.stdin.read()",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert flood.stdout is not None and flood.stdout.readline().strip() == "held"
            raw = bytes.fromhex(bob.as_user("python3", "-c", ASK_PLACE, timeout=20).stdout.strip())
            theirs, _ = place_answer(raw)
            theirs_ids = {p[0] for p in theirs}
            assert bob_sids - {bob.status(running)["slurm_id"]} <= theirs_ids <= waiting_of(bob.name), theirs
        finally:
            flood.kill()
    finally:
        alice.run("cancel", mine)
        bob.run("cancel", running, *his)


def test_the_helper_answers_at_once_while_slurms_queue_is_slow_to_read(alice, world_readable_tmp):
    """Issue 56: in a rush `squeue` over every user's jobs takes seconds,
    longer than a student's client waits for the helper (one second). A
    helper whose squeue takes 3 s (Slurm's own, behind a sleep), asked
    again and again: after its first read, every answer comes within the
    client's second, from the last read, while the next read runs."""
    slow = world_readable_tmp / "bin"
    slow.mkdir()
    real = sh("sh", "-c", "command -v squeue").stdout.strip()
    reads = world_readable_tmp / "reads"
    # (the fault: each read takes 3 s; each begun read leaves a line)
    (slow / "squeue").write_text(f'#!/bin/sh\necho >>{reads}\nsleep 3\nexec {real} "$@"\n')
    (slow / "squeue").chmod(0o755)
    sock = world_readable_tmp / "place.sock"
    env = {**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"}
    helper = subprocess.Popen(
        ["delegate-place", "--socket", str(sock), "--every", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    job, _, _ = alice.held()
    try:
        sid = alice.status(job)["slurm_id"]
        testlib.wait_until("the slow helper's socket", sock.is_socket, 30, 0.2)

        def ask() -> subprocess.CompletedProcess:
            return alice.as_user("delegate-place", "--socket", sock, "--ask", check=False)

        first = ask()
        assert first.returncode == 1 and "still being read" in first.stderr, first
        testlib.wait_until(
            "a first answer naming Alice's held job", lambda: sid in ask().stdout.split(), 30, 0.5
        )
        # Asked again and again until three more reads of 3 s have begun:
        # none of them makes an answer wait.
        begun = len(reads.read_text().splitlines())

        def answered_through_three_reads() -> bool:
            r = ask()
            assert r.returncode == 0 and sid in r.stdout.split(), r
            return len(reads.read_text().splitlines()) >= begun + 3

        testlib.wait_until("three more reads of the queue begun", answered_through_three_reads, 60, 0.5)
    finally:
        helper.kill()
        _, err = helper.communicate(timeout=30)
        alice.run("cancel", job)
    assert "longer than the interval; students are answered from the read before" in err, err


def test_a_waiting_call_says_when_it_likely_starts_from_the_calls_seen_ending(alice, bob):
    """Issue 56: once the place helper has seen calls end (here three of
    Bob's of about 7 s, asked about as root while they ran: the helper
    reads Slurm's queue at most every 5 s, when asked), a waiting call's
    line says the helper's likely start, made of the running call's time
    so far and those durations, not Slurm's latest start from the time
    limits (which for a 10-minute limit says 10 minutes)."""

    def ended_and_seen(call: str) -> bool:
        sh("delegate-place", "--ask")
        return bob.status(call)["state"] == "completed"

    for _ in range(3):
        short = bob.submit("sleep", "7", opts=("--time", "10m"))
        testlib.wait_until("Bob's short call completed", lambda c=short: ended_and_seen(c), 90, 1)
    running = bob.submit("sleep", "30", opts=("--time", "10m"))
    bob.wait_started(running)
    mine = alice.submit("true", opts=("--time", "10m"))
    try:
        seen = []

        def helpers_words():
            reason = alice.status(mine)["reason"]
            seen.append(reason)
            return "from the running calls and how long calls lasted lately" in reason

        testlib.wait_until(
            "Alice's line saying the helper's likely start", helpers_words, 60, 1, detail=lambda: seen[-3:]
        )
        assert re.search(
            r"; likely to start (within a minute|in about \d+ min) \(from the running calls", seen[-1]
        ), seen[-1]
        # Root is told of every waiting job, with its likely start.
        lines = sh("delegate-place", "--ask").stdout.split("\n")
        sid = alice.status(mine)["slurm_id"]
        assert any(ln.split()[:1] == [sid] and ln.split()[2].isdigit() for ln in lines if ln.strip()), lines
        # Alice reading the socket raw: her own job, with its estimate.
        raw = bytes.fromhex(alice.as_user("python3", "-c", ASK_PLACE).stdout.strip())
        places, _ = place_answer(raw)
        assert any(p[0] == sid and p[2] is not None for p in places), places
    finally:
        alice.run("cancel", mine)
        bob.run("cancel", running)
