"""JupyterHub on the stack's user node, as students and instructors meet it.

`build_cluster.sh --stack accounts add --csv` gives two students of a roster
their accounts; `deploy` brings the stack up; then, in a real browser
(Debian's chromium, headless, driven by Playwright), each student logs in on
the hub's HTTPS login page, gets their own JupyterLab, opens a new notebook
and runs a cell with a `@delegate.remote` call and one with a failing call;
the test reads the value, the remote traceback and the status line from the
page, checks that the call ran as that student's uid, and that the second
student can neither open the first one's server nor read their files.
Screenshots of every step go to the directory the test prints
($DELEGATE_ARTIFACTS, default /var/lib/delegate/artifacts, then hub/).
Also: the same roster again changes nothing (no restart, same uids and
passwords), each server runs as its student's uid with the hub's limits,
and `accounts remove --archive` packs a home.

Run by tests/run.sh (stage 7) as root, on the stack the stage's suites
share (conftest.py).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from browser import URL, HubSession, browser_for

import stacklib
from stacklib import SCRIPT, STACK, STACK_DIR, cid, initial_password, run

HOME = Path(stacklib.HOME)
ARTIFACTS = Path(os.environ.get("DELEGATE_ARTIFACTS", "/var/lib/delegate/artifacts")) / "hub"
ADA, BOB, IVY = stacklib.HUB_ADA, stacklib.HUB_BOB, stacklib.HUB_IVY


STUDENT_MEM = stacklib.HUB_STUDENT_MEM


def user_cid() -> str:
    c = cid("user")
    assert c, "the user node has no running container"
    return c


def on_user_node(*cmd, timeout=120, user=None):
    """CMD on the user node: as `user`, or as root (whose CAP_SYS_PTRACE
    sees every process through hidepid, as an operator's shell does)."""
    return stacklib.on("user", *cmd, user=user, timeout=timeout)


def roster_uid(user: str) -> int:
    for line in (STACK_DIR / "roster").read_text().splitlines():
        f = line.split()
        if f and f[0] == user:
            return int(f[1])
    raise AssertionError(f"{user} is not in the roster")


@pytest.fixture(scope="module")
def stack(course_stack):
    """The shared stack (conftest.py), its roster enrolled before the
    deploy: the roster file's path."""
    return course_stack.roster


def test_roster_is_idempotent(stack):
    listing = run(SCRIPT, "--stack", "accounts", "list", check=True).stdout
    for u in (ADA, BOB):
        assert re.search(rf"^{u}\s+{roster_uid(u)}\s+student\s+roster\s", listing, re.M), listing
    assert re.search(rf"^{IVY}\s+{roster_uid(IVY)}\s+instructor\s+roster\s", listing, re.M), listing
    assert "Lovelace" in listing
    # The instructor is in the admin group on every node.
    assert "delegate-admin" in on_user_node("id", "-nG", IVY).stdout
    before = {
        "cid": user_cid(),
        "roster": (STACK_DIR / "roster").read_bytes(),
        "passwords": (STACK_DIR / "secrets" / "initial-passwords").read_bytes(),
    }
    r = run(SCRIPT, "--stack", "accounts", "add", "--csv", str(stack), check=True)
    assert "nothing changed" in r.stderr + r.stdout
    assert user_cid() == before["cid"], "the user node was restarted"
    assert (STACK_DIR / "roster").read_bytes() == before["roster"]
    assert (STACK_DIR / "secrets" / "initial-passwords").read_bytes() == before["passwords"]
    mode = os.stat(STACK_DIR / "secrets" / "initial-passwords")
    assert mode.st_uid == 0 and mode.st_mode & 0o077 == 0
    for u in (ADA, BOB):
        st = os.stat(HOME / u)
        assert (st.st_uid, st.st_mode & 0o777) == (roster_uid(u), 0o700)
        # The same uid on the user node and on a worker.
        assert on_user_node("id", "-u", u).stdout.strip() == str(roster_uid(u))
        cid = run(
            "docker", "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={STACK}_worker1"
        ).stdout.split()[0]
        assert run("docker", "exec", cid, "id", "-u", u).stdout.strip() == str(roster_uid(u))


CELL_CALL = """import os, shutil, delegate
print("cli", shutil.which("delegate"))
@delegate.remote(cpus=1, time="2m")
def where(x):
    import os
    return f"remote-uid={os.getuid()} twice={2 * x}"
print("caller-uid", os.getuid())
where(21)"""

CELL_FAIL = """@delegate.remote(cpus=1, time="2m")
def boom():
    raise ValueError("no free lunch " + str(6 * 7))
boom()"""


@pytest.fixture(scope="module")
def browser(stack):
    with browser_for(ARTIFACTS) as b:
        yield b


def test_students_in_the_browser(stack, browser, capsys):
    with capsys.disabled():
        print(f"\nscreenshots of the browser test: {ARTIFACTS}")
    ada, bob = (HubSession(browser, u, initial_password(u), ARTIFACTS) for u in (ADA, BOB))
    for s in (ada, bob):
        s.login()
        s.new_notebook()
        uid = roster_uid(s.user)
        text = s.run_cell(CELL_CALL, "twice=42", "delegate-call")
        assert f"caller-uid {uid}" in text, text
        assert "cli /usr/local/bin/delegate" in text, text  # the CLI, for the terminal too
        assert f"remote-uid={uid} twice=42" in text, text
        assert "delegate: " in text and " done" in text, f"no status line: {text!r}"
        text = s.run_cell(CELL_FAIL, "no free lunch 42", "failing-call")
        assert "ValueError" in text, text
        # The remote traceback, with the notebook's own failing line.
        assert 'raise ValueError("no free lunch "' in text, text
    # Ada leaves a file in her home; Bob cannot read it, nor list her home.
    ada.run_cell(
        'open(os.path.expanduser("~/ada-secret.txt"), "w").write("s3cret"); print("written")',
        "written",
        "write-secret",
    )
    text = bob.run_cell(
        "try:\n"
        f'    print(open("{HOME}/{ADA}/ada-secret.txt").read())\n'
        "except OSError as e:\n"
        '    print("refused", type(e).__name__)\n'
        "try:\n"
        f'    print(os.listdir("{HOME}/{ADA}"))\n'
        "except OSError as e:\n"
        '    print("refused", type(e).__name__)',
        "refused",
        "read-other-home",
    )
    assert text.count("refused PermissionError") == 2 and "s3cret" not in text, text
    # Bob opens Ada's server: the hub does not let him in.
    resp = bob.page.goto(f"{URL}/user/{ADA}/lab")
    bob.page.wait_for_load_state("load")
    bob.shot("other-server")
    body = bob.page.inner_text("body")
    assert bob.page.locator(".jp-LabShell").count() == 0, "Bob got a JupyterLab at Ada's URL"
    assert resp is not None and (resp.status == 403 or "403" in body), (resp and resp.status, body[:500])
    # Nor the hub's admin page; the roster's instructor gets it.
    resp = bob.page.goto(f"{URL}/hub/admin")
    bob.shot("admin-page-refused")
    assert resp is not None and resp.status == 403, resp and resp.status
    ivy = HubSession(browser, IVY, initial_password(IVY), ARTIFACTS)
    ivy.login(lab=False)
    resp = ivy.page.goto(f"{URL}/hub/admin")
    ivy.page.wait_for_selector(f"text={ADA}")
    ivy.shot("admin-page")
    assert resp is not None and resp.status == 200, resp and resp.status
    for s in (ada, bob, ivy):
        s.ctx.close()


def test_servers_run_as_their_students_with_limits(stack, browser):
    # (after the browser test: both servers run)
    servers = server_pids()
    assert set(servers) >= {roster_uid(ADA), roster_uid(BOB)}, servers
    assert 0 not in servers, "a single-user server runs as root"
    # The idle culler runs as the hub's service.
    ps = on_user_node("ps", "-eo", "pid=,uid=,args=").stdout
    assert re.search(r"jupyterhub_idle_culler --timeout=\d+", ps), ps
    limits = on_user_node("cat", f"/proc/{servers[roster_uid(ADA)]}/limits").stdout
    assert re.search(r"Max address space\s+2147483648\s+2147483648", limits), limits
    assert re.search(r"Max processes\s+256\s+256", limits), limits


def server_pids() -> dict[int, str]:
    """uid -> pid of each running single-user server."""
    servers = {}
    for line in on_user_node("ps", "-eo", "pid=,uid=,args=").stdout.splitlines():
        pid, uid, args = line.split(None, 2)
        if "jupyterhub-singleuser" in args and "python" in args.split()[0]:
            servers[int(uid)] = pid
    return servers


def test_each_student_has_a_cgroup_with_the_limits(stack, browser):
    """(after the browser test) Each server, and all it starts, is in its
    student's own cgroup: their processes together cannot take more than
    their memory; past it the kernel kills one of theirs and the other
    student's server runs on. The student cannot leave the group."""
    servers = server_pids()
    ada_pid, bob_pid = servers[roster_uid(ADA)], servers[roster_uid(BOB)]
    cg = on_user_node("cat", f"/proc/{ada_pid}/cgroup").stdout
    assert re.search(rf"^\d+:memory:/delegate-hub-{STACK}/{ADA}$", cg, re.M), cg
    assert re.search(rf"^\d+:cpu(,cpuacct)?:/delegate-hub-{STACK}/{ADA}$", cg, re.M), cg
    mem = "/run/delegate-cgroup/memory"
    limit = on_user_node("cat", f"{mem}/{ADA}/memory.limit_in_bytes").stdout.strip()
    assert int(limit) == STUDENT_MEM, limit
    quota = on_user_node("cat", f"/run/delegate-cgroup/cpu/{ADA}/cpu.cfs_quota_us").stdout.strip()
    assert int(quota) == 100_000, quota  # DELEGATE_HUB_STUDENT_CPUS=1
    # Two processes of Ada's, each well under the limit, together over it.
    hog = (
        f"echo $$ > {mem}/{ADA}/cgroup.procs && echo $$ > /run/delegate-cgroup/cpu/{ADA}/cgroup.procs && "
        f"exec runuser -u {ADA} -- python3 -c "
        "'import subprocess, sys, time\n"
        "n = int(sys.argv[1])\n"
        'cmd = [sys.executable, "-c", f"b = b\\"x\\" * {n}; import time; time.sleep(20)"]\n'
        "ps = [subprocess.Popen(cmd) for _ in range(2)]\n"
        "print([p.wait() for p in ps])' "
        f"{STUDENT_MEM * 6 // 10}"
    )
    r = on_user_node("sh", "-c", hog, timeout=120)
    assert "-9" in r.stdout, f"no process of the hog was killed: {r.stdout} {r.stderr}"
    # The kernel's OOM killer of Ada's group did it (cgroup v1: oom_control;
    # v2: memory.events).
    oom = on_user_node(
        "sh", "-c", f"cat {mem}/{ADA}/memory.oom_control || cat {mem}/{ADA}/memory.events"
    ).stdout
    kills = re.search(r"^oom_kill (\d+)$", oom, re.M)
    assert kills and int(kills.group(1)) >= 1, oom
    # Bob's server did not notice; Ada's own server is still there too.
    assert on_user_node("kill", "-0", bob_pid).returncode == 0
    assert on_user_node("kill", "-0", ada_pid).returncode == 0
    # Ada cannot move a process of hers out of her group.
    r = on_user_node("sh", "-c", f"echo $$ > {mem}/cgroup.procs", user=ADA)
    assert r.returncode != 0 and "ermission denied" in r.stderr, r.stderr


def test_students_see_only_their_own_processes(stack, browser):
    """/proc hidepid=invisible on the user node: Bob sees his processes
    only, not Ada's server nor root's hub; root (with CAP_SYS_PTRACE) sees
    all. The hub and its children hold no CAP_SYS_ADMIN to undo it."""
    owners = "for p in /proc/[0-9]*; do stat -c %U $p; done 2>/dev/null | sort -u"
    mine = on_user_node("sh", "-c", owners, user=BOB)
    assert mine.stdout.split() == [BOB], mine.stdout
    everyone = on_user_node("sh", "-c", owners).stdout.split()
    assert {ADA, BOB, "root"} <= set(everyone), everyone
    hub = on_user_node("sh", "-c", "grep CapBnd /proc/$(pgrep -o -f bin/jupyterhub)/status")
    assert int(hub.stdout.split()[-1], 16) & (1 << 21) == 0, hub.stdout  # CAP_SYS_ADMIN = 21


def test_a_student_cannot_use_anothers_server_port(stack, browser):
    """Bob, in a shell on the user node, connects straight to Ada's
    JupyterLab on 127.0.0.1 (bypassing the proxy): without Ada's token or
    cookie her server sends him to the hub's login, never her files."""
    ada_pid = server_pids()[roster_uid(ADA)]
    env = on_user_node("cat", f"/proc/{ada_pid}/environ").stdout.split("\0")
    url = next(e.split("=", 1)[1] for e in env if e.startswith("JUPYTERHUB_SERVICE_URL="))
    m = re.match(r"http://(127\.0\.0\.1|localhost|[0-9.]+):(\d+)(/.*)", url)
    assert m, url
    port, prefix = m.group(2), m.group(3).rstrip("/")
    probe = (
        "import http.client, sys\n"
        "for path in sys.argv[2:]:\n"
        "    c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=20)\n"
        "    c.request('GET', path)\n"
        "    r = c.getresponse()\n"
        "    print(path, r.status, r.getheader('Location'), r.read(2000))\n"
    )
    paths = [
        f"{prefix}/api/contents",
        f"{prefix}/api/kernels",
        f"{prefix}/files/ada-secret.txt",
        f"{prefix}/lab",
    ]
    r = on_user_node("python3", "-c", probe, port, *paths, user=BOB)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(paths), r.stdout
    for line in lines:
        status = int(line.split()[1])
        assert status in (302, 401, 403), line
        assert "s3cret" not in line and "ada-secret" not in line.split(" ", 3)[-1], line


def pam_ok(user: str, password: str) -> bool:
    """The user node's PAM (the hub's login service) accepts the password."""
    check = "import pamela, sys\ntry:\n    pamela.authenticate(sys.argv[1], sys.argv[2])\nexcept pamela.PAMError:\n    sys.exit(3)\n"
    r = on_user_node("/opt/delegate/venv/bin/python", "-c", check, user, password)
    assert r.returncode in (0, 3), r.stderr
    return r.returncode == 0


# passwd in a terminal, as a student types into it: each answer after its
# prompt (typed ahead, it would be flushed when passwd turns echo off).
PASSWD_IN_A_TERMINAL = """
import os, pty, signal, sys
signal.alarm(60)
old, new = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execvp("passwd", ["passwd"])
seen = b""
for k, answer in enumerate((old, new, new), start=1):
    while seen.lower().count(b"password:") < k:
        seen += os.read(fd, 1024)
    os.write(fd, answer.encode() + b"\\n")
try:
    while True:
        d = os.read(fd, 1024)
        if not d:
            break
        seen += d
except OSError:
    pass
print(seen.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_changed_password_survives_a_restart(stack):
    """Bob changes his password with passwd (as in a JupyterLab terminal);
    the user node's container is killed and swarm starts a new one, which
    sets the roster's initial passwords again: Bob's new one still logs in,
    the initial one does not (docker/keep-passwords.sh)."""
    old, new = initial_password(BOB), "Tq8-vLw3-Rz5-Np"
    r = on_user_node("/opt/delegate/venv/bin/python", "-c", PASSWD_IN_A_TERMINAL, old, new, user=BOB)
    assert r.returncode == 0, r.stdout + r.stderr
    assert pam_ok(BOB, new) and not pam_ok(BOB, old)
    kept = STACK_DIR / "hub" / "kept-passwords"
    deadline = time.monotonic() + 30
    while f"{BOB}:" not in (kept.read_text() if kept.exists() else ""):
        assert time.monotonic() < deadline, "the changed password was not kept"
        time.sleep(1)
    assert oct(kept.stat().st_mode & 0o777) == "0o600" and kept.stat().st_uid == 0
    before = user_cid()
    run("docker", "kill", before, check=True)
    deadline = time.monotonic() + 180
    while True:
        now = cid("user")
        if now and now != before and "kept password" in run("docker", "logs", now).stderr:
            break
        assert time.monotonic() < deadline, "the user node did not come back"
        time.sleep(2)
    assert pam_ok(BOB, new), "the changed password was lost with the restart"
    assert not pam_ok(BOB, old)
    assert pam_ok(ADA, initial_password(ADA))  # unchanged accounts keep theirs


def test_remove_archives_the_home(stack, tmp_path):
    # Not deployed any more? Then only the state changes: quick. The stack
    # still runs here, so the roster's accounts are removed after `down`
    # (conftest.py); this one checks --archive on a third student added
    # alone, with the stack removed, then deployed again for the suites
    # that share it.
    roster = tmp_path / "one.csv"
    roster.write_text("hub-cyd,Cyd\n")
    before = set((STACK_DIR / "archive").glob("hub-cyd-*")) if (STACK_DIR / "archive").exists() else set()
    # (taken down, so that the removal below needs no redeploy)
    assert run(SCRIPT, "down").returncode == 0, "down failed"
    # The hub's state outlives the stack (update and down keep it).
    assert (STACK_DIR / "hub" / "jupyterhub.sqlite").stat().st_size > 0
    try:
        run(SCRIPT, "--stack", "accounts", "add", "--csv", str(roster), check=True)
        (HOME / "hub-cyd").mkdir(mode=0o700, exist_ok=True)
        (HOME / "hub-cyd" / "work.txt").write_text("cyd's work")
        run(SCRIPT, "--stack", "accounts", "remove", "hub-cyd", "--archive", check=True)
        assert not (HOME / "hub-cyd").exists()
        after = set((STACK_DIR / "archive").glob("hub-cyd-*.tar.gz")) - before
        assert len(after) == 1
        listing = run("tar", "-tzf", str(next(iter(after))), check=True).stdout
        assert "hub-cyd/work.txt" in listing
        assert "hub-cyd" not in run(SCRIPT, "--stack", "accounts", "list").stdout
        assert "hub-cyd " not in (STACK_DIR / "secrets" / "initial-passwords").read_text()
    finally:
        for f in (STACK_DIR / "archive").glob("hub-cyd-*"):
            f.unlink()
        assert run(SCRIPT, "deploy", "--workers", "2").returncode == 0, "the shared stack's deploy again"
