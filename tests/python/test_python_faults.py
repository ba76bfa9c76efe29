"""Faults through the Python package (issue 5): a full delegate root and a
Python result, a map whose one call fails, 500 jobs by 10 users at once.
Here rather than in tests/e2e because they need the package installed in
the test venv (tests/run.sh installs the wheel just before tests/python).
See docs/robustness.md. DELEGATE_STRESS_JOBS sets the size of the
many-users test (default 500, about 3 minutes on the 2-core CI machine).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import testlib

PY = sys.executable


class U:
    def __init__(self, name):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir)
        self.root = self.home / ".delegate" / "jobs"


@pytest.fixture
def alice():
    return U("delegate-alice")


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=120)


def script_dir():
    d = Path(tempfile.mkdtemp(prefix="delegate-pyfaults-"))
    os.chmod(d, 0o755)
    return d


def run_script(user, path, *args, env_extra=None, timeout=300):
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user.home),
        "LANG": "C.UTF-8",
        "DELEGATE_POLL_INTERVAL": "1",
        **(env_extra or {}),
    }
    return subprocess.run(
        testlib.as_user_argv(user.name, PY, path, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd="/",
    )


def result_of(r):
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT: ")]
    assert r.returncode == 0 and lines, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return json.loads(lines[-1][len("RESULT: ") :])


@pytest.fixture
def tiny_root(alice):
    """A 256 KiB filesystem as alice's delegate root (below /home, as the policy wants)."""
    with testlib.tiny_root(alice.home, alice.uid, alice.gid) as root:
        yield root


PY_BIG_RESULT = """
import json, sys, delegate
@delegate.remote(time="1m")
def big():
    return b"x" * (2 << 20)   # 2 MiB: more than the delegate root can hold
fut = big.submit()
try:
    v = fut.result(timeout=120)
    print("RESULT:", json.dumps({"ok": True, "len": len(v)}))
except Exception as e:
    print("RESULT:", json.dumps({"ok": False, "type": type(e).__name__, "msg": str(e)}))
"""


def test_full_root_python_result_is_never_half_read(alice, tiny_root):
    d = script_dir()
    (d / "big.py").write_text(PY_BIG_RESULT)
    os.chmod(d / "big.py", 0o644)
    res = result_of(run_script(alice, d / "big.py", env_extra={"DELEGATE_ROOT": str(tiny_root)}))
    assert res["ok"] is False, res  # never a truncated value
    assert res["type"] in ("JobFailed", "RemoteError"), res
    assert "no space left" in res["msg"].lower(), res


MAP_ONE_FAILS = """
import json, time, delegate
def f(x):
    import os, time
    if x == 1:
        os._exit(137)        # this call's job fails without a result
    time.sleep(2)
    return x
t = time.monotonic()
try:
    with delegate.Executor(time="2m") as ex:
        futs = []
        out = list(ex.map(f, range(6), timeout=120))
    res = {"ok": True}
except Exception as e:
    res = {"ok": False, "type": type(e).__name__}
res["secs"] = time.monotonic() - t
print("RESULT:", json.dumps(res))
"""


def test_map_with_a_failing_call_ends_and_cancels_the_rest(alice):
    # Regression: Executor.shutdown waited forever on the futures map had
    # cancelled (Future.cancel never reaches CANCELLED_AND_NOTIFIED).
    d = script_dir()
    (d / "m.py").write_text(MAP_ONE_FAILS)
    os.chmod(d / "m.py", 0o644)
    r = run_script(alice, d / "m.py", timeout=180)
    res = result_of(r)
    assert res["ok"] is False and res["type"] == "JobFailed", res
    assert res["secs"] < 120, res
    assert "unexpected state" not in r.stderr, r.stderr


STRESS_JOBS = int(os.environ.get("DELEGATE_STRESS_JOBS", "500"))
STRESS_USERS = 10

STRESS_SCRIPT = """
import json, os, pwd, sys, delegate
n = int(sys.argv[1])
me = pwd.getpwuid(os.getuid()).pw_name
def f(x, me=me):
    import os
    return [me, os.getuid(), x, x * x]
with delegate.Executor(time="5m") as ex:
    out = list(ex.map(f, range(n), timeout=3600))
print("RESULT:", json.dumps(out))
"""


def test_many_users_submit_concurrently():
    per_user = max(1, STRESS_JOBS // STRESS_USERS)
    users = []
    for i in range(STRESS_USERS):
        name = f"delegate-load{i}"
        testlib.ensure_user(name, prefer=2200 + i)  # reused, or created with a free uid
        users.append(U(name))
    d = script_dir()
    (d / "stress.py").write_text(STRESS_SCRIPT)
    os.chmod(d / "stress.py", 0o644)
    t0 = time.monotonic()
    procs = []
    for u in users:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(u.home),
            "LANG": "C.UTF-8",
            "DELEGATE_POLL_INTERVAL": "1",
        }
        procs.append(
            subprocess.Popen(
                testlib.as_user_argv(u.name, PY, d / "stress.py", per_user),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd="/",
            )
        )
    try:
        for u, p in zip(users, procs):
            out, err = p.communicate(timeout=3600)
            lines = [ln for ln in out.splitlines() if ln.startswith("RESULT: ")]
            assert p.returncode == 0 and lines, (u.name, out[-2000:], err[-2000:])
            res = json.loads(lines[-1][8:])
            # Every result once, in order, computed as this user, for this input.
            assert res == [[u.name, u.uid, x, x * x] for x in range(per_user)], (u.name, res[:5])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print(f"{STRESS_USERS * per_user} jobs by {STRESS_USERS} users in {time.monotonic() - t0:.0f}s")
    # Nothing left behind.
    ours = {p.name for u in users if u.root.exists() for p in u.root.iterdir()}
    left = set(
        sh(
            "docker", "ps", "-a", "--filter", "label=delegate.job", "--format", '{{.Label "delegate.job"}}'
        ).stdout.split()
    )
    assert not (left & ours), left & ours


MAP_THROUGH_A_LOST_NODE = """
import json, sys, delegate
def f(i):
    import time
    time.sleep(4)
    return i * i
with delegate.Executor(time="2m") as ex:
    out = list(ex.map(f, range(4), timeout=600))
ids = [j["id"] for j in delegate.jobs(limit=4)]
print("RESULT:", json.dumps({"out": out, "ids": ids}))
"""


def test_a_maps_values_all_come_back_after_its_node_is_lost(alice):
    """Issue 52 through the package: the node is set down while a map of
    4 calls runs its second call (Slurm takes the map's allocation back,
    as from a lost machine); the allocation, started again, runs that call
    again from a fresh directory and then the rest: every value comes
    back, in order, each call once in the map's count, the lost attempt
    kept beside its call."""
    d = script_dir()
    (d / "m.py").write_text(MAP_THROUGH_A_LOST_NODE)
    os.chmod(d / "m.py", 0o644)
    before = set(alice.root.iterdir()) if alice.root.exists() else set()
    proc = subprocess.Popen(
        testlib.as_user_argv(alice.name, PY, str(d / "m.py")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(alice.home), "LANG": "C.UTF-8"},
        cwd="/",
    )
    deadline = time.monotonic() + 120
    while True:
        started = [p for p in set(alice.root.iterdir()) - before if (p / "started").exists()]
        if len(started) >= 2:
            break
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    node = sh("sinfo", "-h", "-N", "-o", "%N").stdout.split()[0]
    sh("scontrol", "update", f"nodename={node}", "state=down", "reason=delegate test: node lost")
    deadline = time.monotonic() + 60
    while "idle" not in sh("sinfo", "-h", "-N", "-o", "%T").stdout:
        assert time.monotonic() < deadline
        sh("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        time.sleep(1)
    out, err = proc.communicate(timeout=300)
    res = result_of(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert res["out"] == [0, 1, 4, 9], res
    again = [p for p in set(alice.root.iterdir()) - before if ".attempt-" in p.name]
    assert len(again) == 1, sorted(p.name for p in set(alice.root.iterdir()) - before)
    call = alice.root / again[0].name.split(".attempt-")[0]
    assert (call / "attempts").read_text().startswith("1 "), call


RETRIES_PAST_THE_BOUND = """
import json, delegate
@delegate.remote(time="1m", retries=5)
def f():
    return 1
try:
    f()
    res = {"ok": True}
except Exception as e:
    res = {"ok": False, "type": type(e).__name__, "msg": str(e)}
print("RESULT:", json.dumps(res))
"""


def test_retries_past_the_sites_bound_are_refused_in_python(alice):
    d = script_dir()
    (d / "r.py").write_text(RETRIES_PAST_THE_BOUND)
    os.chmod(d / "r.py", 0o644)
    res = result_of(run_script(alice, d / "r.py", timeout=120))
    assert res["ok"] is False and "retries 5 is more than the site maximum of 2" in res["msg"], res
