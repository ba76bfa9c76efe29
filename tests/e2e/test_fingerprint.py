"""The machine a call ran on (issue 32): the worker's agent reads it from
the node's /proc and /sys before and after the call and the runner writes
it into the job directory (`fingerprint`); `delegate result` shows it and
`--json` carries it. Compared here with what this node's own /proc and /sys
say (not a stand-in), and tried as a student who forges it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import User

import testlib


def node_says() -> dict:
    kv = testlib.cpu0()
    gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        "model": kv.get("model name"),
        "vendor": kv.get("vendor_id"),
        "family": int(kv["cpu family"]) if "cpu family" in kv else None,
        "microcode": kv.get("microcode"),
        "kernel": os.uname().release,
        "governor": gov.read_text().strip() if gov.exists() else None,
    }


def result_json(user: User, job: str) -> dict:
    r = user.run("result", "--json", job)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_calls_fingerprint_is_what_the_node_says(alice):
    job = alice.submit("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
    assert alice.wait(job)["state"] == "completed"
    f = result_json(alice, job)["fingerprint"]
    assert f is not None, "no fingerprint recorded"
    want = node_says()
    assert f["node"] == os.uname().nodename.split(".")[0]
    assert f["cpu_model"] == want["model"] and f["cpu_vendor"] == want["vendor"]
    assert f["cpu_family"] == want["family"]
    assert f["microcode"] == want["microcode"], "a field the node lacks must stay unknown (null)"
    assert f["kernel"] == want["kernel"]
    assert f["governor"] == want["governor"]
    allowed = set(range(os.cpu_count() or 1))
    assert f["cores"] and set(f["cores"]) <= allowed, f["cores"]
    assert f["cores_busy_ms"] is not None and f["cores_busy_ms"] > 0, f
    assert f["perf_mode"] in ("seccomp", "perfmon", "off")
    assert f["image_id"] and f["image_id"].startswith("sha256:"), f["image_id"]
    # Tuning (the policy's tune_cpus): done where cpufreq allows, else said.
    tuning = " ".join(f["tuning"])
    if not Path("/sys/devices/system/cpu/cpu0/cpufreq").exists():
        assert "governor left as it is: this node has no cpufreq" in tuning, f["tuning"]
    else:
        assert "governor" in tuning, f["tuning"]
    # The text form names the machine and says unknown for what it lacks.
    text = alice.run("result", job).stdout
    assert f"machine:   {f['node']} · {want['model']}" in text, text
    if want["governor"] is None:
        assert "governor unknown" in text, text


def test_a_call_cannot_write_its_own_fingerprint(alice):
    """The call writes a forged `fingerprint` into its job directory; the
    runner replaces it with the agent's after the sandbox ended."""
    job = alice.submit("sh", "-c", "printf 'DLGTF\\0\\1\\0forged' > /job/fingerprint")
    assert alice.wait(job)["state"] == "completed"
    f = result_json(alice, job)["fingerprint"]
    assert f is not None and f["cpu_model"] == node_says()["model"], f


def test_a_call_that_never_ran_has_no_fingerprint(alice):
    job, _, _ = alice.held()
    r = alice.run("cancel", job)
    assert r.returncode == 0, r.stderr
    alice.wait(job)
    assert result_json(alice, job)["fingerprint"] is None


def test_a_call_that_never_ran_shows_no_forged_fingerprint(alice):
    """Security round 4, item 4: a held-then-cancelled job showed the
    fingerprint a student put in its directory (a real record of another
    of their jobs here; the attacker's said "XEON9999"). Only a call that
    started has a fingerprint."""
    ran = alice.submit("true")
    assert alice.wait(ran)["state"] == "completed"
    job, _, _ = alice.held()
    record = alice.job_dir(ran) / "fingerprint"
    alice.as_user("cp", str(record), str(alice.job_dir(job) / "fingerprint"))
    assert alice.run("cancel", job).returncode == 0
    alice.wait(job)
    assert result_json(alice, job)["fingerprint"] is None
    assert "machine:" not in alice.run("result", job).stdout


def test_another_students_process_names_do_not_leak(alice, bob):
    """Security round 4, item 5: a process another student renamed showed
    by name in the caller's `others_seen` while `ps` hid it. Another
    user's tasks show as "another user's process"; the caller's own and
    the system's by name."""
    hog = (
        "import ctypes, os, sys\n"
        "ctypes.CDLL(None).prctl(15, b'exam-keygen-v', 0, 0, 0)\n"
        "for c in sorted(os.sched_getaffinity(0)):\n"
        "    if os.fork() == 0:\n"
        "        os.sched_setaffinity(0, {c})\n"
        "        while True: pass\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
    )
    p = bob.popen(
        "python3", "-c", hog, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert p.stdout.readline().startswith("ready")
        job = alice.submit("sleep", "2")
        assert alice.wait(job)["state"] == "completed"
        seen = result_json(alice, job)["fingerprint"]["others_seen"]
    finally:
        os.killpg(p.pid, 9)
        p.wait(timeout=30)
    assert "exam-keygen-v" not in seen, seen
    assert "another user's process" in seen, seen


def test_a_command_repeated_in_one_sandbox(alice):
    """`--repeat N --warmup K`: K + N runs in one sandbox (one job
    directory, one container), the N measured ones' figures recorded and
    shown by `delegate result`. (Structure only: tests do not assert on
    time.)"""
    job = alice.submit("sh", "-c", "echo run >> /job/runs", opts=("--repeat", "4", "--warmup", "2"))
    assert alice.wait(job)["state"] == "completed"
    assert (alice.job_dir(job) / "runs").read_text().count("run") == 6
    rep = result_json(alice, job)["repeats"]
    assert rep["warmup"] == 2 and len(rep["seconds"]) == 4, rep
    assert rep["summary"].startswith("delegate: ") and "of 4 runs" in rep["summary"], rep
    text = alice.run("result", job).stdout
    assert "repeats:   " in text and "after 2 warm-up run(s)" in text, text


def test_a_failing_repeat_stops_with_its_exit_code(alice):
    r = alice.run("submit", "--wait", "--repeat", "3", "--", "sh", "-c", "exit 5")
    assert r.returncode == 5, r.stderr
    assert "run 1 of 3 exited with 5" in r.stderr, r.stderr
    r = alice.run("submit", "--warmup", "2", "--", "true")
    assert r.returncode == 2 and "--repeat" in r.stderr, r.stderr
