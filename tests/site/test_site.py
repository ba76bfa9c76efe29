"""delegate on a Slurm site it did not build (issue 33): Debian 13's Slurm
24.11 with the site's own configuration (general + course partitions, its
own job_submit.lua, epilog and plugstack.conf), delegate's Debian packages
installed and the site admin's lines of docs/existing-site.md added
(tests/site/site.sh). As a student, a researcher and an admin."""

from __future__ import annotations

import json
import re
import time

from sitelib import Shell

import testlib

REFUSED = "delegate: "


def job_field(root: Shell, job: str, field: str) -> str:
    out = root.run("scontrol", "show", "job", job, check=True).stdout
    m = re.search(rf"\b{field}=(\S*)", out)
    assert m, out
    return m.group(1)


def wait_gone(root: Shell, job: str, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not root.run("squeue", "-h", "-j", job).stdout.strip():
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} still queued after {seconds} s")


def submitted_id(r) -> str:
    m = re.search(r"Submitted batch job (\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    return m.group(1)


# ------------------------------------------------------------------ packages
def test_the_packages_are_installed_and_the_site_files_kept(root):
    """dpkg installed delegate and delegate-controller on ctl, delegate and
    delegate-node on c1, nothing on g1; installing them changed no file
    under /etc/slurm (site.sh compares before and after and stops
    otherwise); the node package's SPANK plugin is built for 24.11."""
    pkgs = root.run("dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "delegate*", check=True).stdout
    assert "delegate 0.1.0" in pkgs and "delegate-controller 0.1.0" in pkgs, pkgs
    node = Shell("root", "c1").run("dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "delegate*").stdout
    assert "delegate-node 0.1.0+slurm24.11" in node, node
    g1 = Shell("root", "g1").run("dpkg-query", "-W", "delegate*")
    assert g1.returncode != 0, "a general node has no delegate package"
    unit = Shell("root", "c1").run("cat", "/usr/lib/systemd/system/delegate-agent.service", check=True).stdout
    assert "ExecStart=/usr/sbin/sandbox-agent" in unit
    verify = Shell("root", "c1").run(
        "systemd-analyze", "verify", "/usr/lib/systemd/system/delegate-agent.service"
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    place = root.run("systemd-analyze", "verify", "/usr/lib/systemd/system/delegate-place.service")
    assert place.returncode == 0, place.stdout + place.stderr
    assert "24.11" in root.run("sinfo", "--version", check=True).stdout


def test_what_the_site_admin_added_is_all_delegate_touched(root):
    """The site's files after the admin's lines: job_submit.lua is the
    site's rule plus delegate's lines, delegate_gate.lua is delegate's own
    (a module: no global), plugstack.conf is Debian's untouched."""
    js = root.run("cat", "/etc/slurm/job_submit.lua", check=True).stdout
    # The site's own script, its two functions renamed, delegate's block added.
    assert "-- The test site's own job_submit.lua" in js and "job_desc.time_limit = 60" in js
    assert "local function site_job_submit(" in js and "local function site_job_modify(" in js
    assert 'pcall(dofile, "/etc/slurm/delegate_gate.lua")' in js and js.rstrip().endswith(
        "return slurm.SUCCESS"
    )
    gate = root.run("cat", "/etc/slurm/delegate_gate.lua", check=True).stdout
    assert "local AS_MODULE   = true" in gate and 'local RUNNER      = "/usr/bin/sandbox-runner"' in gate
    c1 = Shell("root", "c1")
    assert c1.run("cat", "/etc/slurm/plugstack.conf", check=True).stdout.strip() == (
        "include /etc/slurm/plugstack.conf.d/*.conf"
    )
    line = c1.run("cat", "/etc/slurm/plugstack.conf.d/delegate.conf", check=True).stdout
    assert "required /usr/lib/delegate/delegate_lockdown.so" in line and "nodes=c1" in line


# ------------------------------------------------------------------ student
def listed(alice: Shell) -> list[str]:
    return alice.run("delegate", "list", check=True).stdout.splitlines()


def test_a_students_call_runs_in_course_on_24_11(alice, root):
    r = alice.run("delegate", "--json", "submit", "--", "python3", "-c", "print('hello', 6 * 7)", check=True)
    sub = json.loads(r.stdout)
    job, jid = sub["id"], sub["slurm_id"]
    assert job_field(root, jid, "Partition") == "course"
    w = alice.run("delegate", "wait", job)
    assert w.returncode == 0, w.stdout + w.stderr
    assert "hello 42" in alice.run("delegate", "logs", job, check=True).stdout
    row = next(line for line in listed(alice) if line.startswith(job))
    assert " completed " in row and " c1 " in row, row


def test_a_waiting_call_says_where_it_stands_from_the_login_nodes_helper(alice, root):
    """The package's place helper (delegate-place.service, started on ctl
    by site.sh as the unit says: Slurm's user) answers the student's
    client: her second call, behind her first on the course's one node,
    reads `next in line` in `delegate status`."""
    who = root.run("ps", "-o", "user=", "-C", "delegate-place", check=True).stdout.split()
    assert who == ["slurm"], who

    def submit(*cmd: str) -> str:
        return json.loads(alice.run("delegate", "--json", "submit", "--", *cmd, check=True).stdout)["id"]

    first, second = submit("sleep", "60"), submit("true")

    def status() -> dict:
        return json.loads(alice.run("delegate", "--json", "status", second, check=True).stdout)[0]

    try:
        st = testlib.wait_until(
            "her second call `next in line`",
            lambda: next((st for st in [status()] if "next in line" in st["reason"]), None),
            60,
            1,
            detail=lambda: status()["reason"],
        )
        assert st["state"] == "pending", st
    finally:
        alice.run("delegate", "cancel", first, second)


def test_a_students_map_is_pulled_by_one_allocation_in_course(alice):
    """delegate's map form, `sandbox-runner pull` (the gate's `unpack`:
    Lua 5.1 here, 5.4 in the fast tier's Lua tests), on Slurm 24.11."""
    r = alice.run("delegate", "submit", "--count", "3", "--wait", "--", "python3", "-c", "print('map call')")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("map call") == 3, r.stdout


def test_a_call_that_fails_reads_failed(alice):
    r = alice.run("delegate", "submit", "--wait", "--", "python3", "-c", "raise SystemExit(3)")
    assert r.returncode == 3, r.stdout + r.stderr
    row = [line for line in listed(alice) if "raise SystemExit(3)" in line][-1]
    assert " failed " in row and "exited with code 3" in row, row


def test_doctor_names_a_node_shared_with_general(alice, root):
    """An admin puts c1 into general too: delegate doctor fails, naming the
    node and both partitions (a call's node would no longer be exclusive)."""
    root.run("scontrol", "update", "PartitionName=general", "Nodes=g1,c1", check=True)
    try:
        r = alice.run("delegate", "doctor", timeout=120)
        assert r.returncode != 0, r.stdout
        assert "node c1 is in delegate's partition course and in general" in r.stdout, r.stdout
    finally:
        root.run("scontrol", "update", "PartitionName=general", "Nodes=g1", check=True)
    assert alice.run("delegate", "doctor", timeout=120).returncode == 0


PYTHON_CALLS = """
import delegate

@delegate.remote(time="2m")
def square(x):
    print("squaring", x)
    return x * x

class Oops(Exception):
    pass

@delegate.remote(time="2m")
def fails():
    raise Oops("no luck")

print("value", square(7))
print("map", list(delegate.Executor(time="2m").map(abs, [-1, -2])))
try:
    fails()
except Oops as e:
    print("raised", type(e).__name__, e, "fails" in str(e.__cause__))
"""


def test_a_students_python_calls_on_the_sites_python(alice):
    """The wheel of the `delegate` package in a student's venv on Debian
    13's Python 3.13, calls in a sandbox of the same Python: a value, a map,
    a remote exception raised as itself with its remote traceback."""
    venv = alice.run("python3", "-m", "venv", "venv", timeout=300)
    assert venv.returncode == 0, venv.stderr
    wheel = alice.run(
        "venv/bin/pip",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        "/usr/share/delegate/wheels",
        "delegate",
        timeout=600,
    )
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    r = alice.run("venv/bin/python", "-c", PYTHON_CALLS, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "value 49" in r.stdout, r.stdout
    assert "map [1, 2]" in r.stdout, r.stdout
    assert "raised Oops no luck True" in r.stdout, r.stdout


def test_doctor_on_the_login_node(alice):
    r = alice.run("delegate", "doctor", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "course have 1 node(s) of their own: c1" in r.stdout, r.stdout


def test_plain_slurm_is_refused_in_course(alice):
    for cmd in (
        ["srun", "-p", "course", "hostname"],
        ["salloc", "-p", "course", "true"],
        ["sbatch", "-p", "course", "--wrap", "hostname"],
        ["sbatch", "-p", "course,general", "--wrap", "hostname"],
    ):
        r = alice.run(*cmd, timeout=60)
        assert r.returncode != 0, f"{cmd} accepted: {r.stdout}"
        assert REFUSED in r.stderr, (cmd, r.stderr)


def test_a_delegate_job_cannot_be_sent_to_general(alice):
    r = alice.run("env", "DELEGATE_PARTITION=general", "delegate", "submit", "--", "true", timeout=60)
    assert r.returncode != 0, r.stdout
    assert "run only in its partitions (course)" in r.stderr, r.stderr


def test_a_forged_runner_is_refused(alice):
    """The client writes the runner it is told; the gate regenerates the
    script with the policy's runner and compares it whole."""
    r = alice.run("env", "DELEGATE_RUNNER=/bin/sh", "delegate", "submit", "--", "true", timeout=60)
    assert r.returncode != 0, r.stdout
    assert REFUSED in r.stderr, r.stderr


def test_a_students_delegate_job_cannot_move_to_general(alice, root):
    r = alice.run("delegate", "--json", "submit", "--hold", "--", "true", check=True)
    jid = json.loads(r.stdout)["slurm_id"]
    moved = alice.run("scontrol", "update", f"jobid={jid}", "partition=general")
    assert moved.returncode != 0, moved.stdout
    assert job_field(root, jid, "Partition") == "course"
    root.run("scancel", jid)


def test_a_students_time_limit_cannot_be_raised_on_24_11(alice, root):
    """Security round 4, item 2, on Slurm 24.11: the gate module refuses
    a raise of a held delegate job's time limit; shortening still works."""
    r = alice.run("delegate", "--json", "submit", "--hold", "--time", "1m", "--", "true", check=True)
    jid = json.loads(r.stdout)["slurm_id"]
    try:
        raised = alice.run("scontrol", "update", f"jobid={jid}", "TimeLimit=60")
        assert raised.returncode != 0, raised.stdout
        assert job_field(root, jid, "TimeLimit") == "00:02:00"
        shorter = alice.run("scontrol", "update", f"jobid={jid}", "TimeLimit=1")
        assert shorter.returncode == 0, shorter.stderr
        assert job_field(root, jid, "TimeLimit") == "00:01:00"
    finally:
        root.run("scancel", jid)


def test_no_step_joins_a_students_job_on_delegates_node(alice, root):
    """The SPANK plugin (built against 24.11's headers, nodes=c1): a student's
    `srun --jobid=<own delegate job> --overlap` fails on c1."""
    r = alice.run(
        "delegate", "--json", "submit", "--", "python3", "-c", "import time; time.sleep(60)", check=True
    )
    jid = json.loads(r.stdout)["slurm_id"]
    end = time.monotonic() + 60
    while job_field(root, jid, "JobState") != "RUNNING":
        assert time.monotonic() < end, "the delegate job did not start"
        time.sleep(0.5)
    step = alice.run("srun", f"--jobid={jid}", "--overlap", "hostname", timeout=60)
    assert step.returncode != 0 and "c1" not in step.stdout, step.stdout + step.stderr
    log = Shell("root", "c1").run("cat", "/var/log/slurm/slurmd.log", check=True).stdout
    assert "delegate_lockdown: job steps are disabled for users" in log, log[-2000:]
    root.run("scancel", jid)
    wait_gone(root, jid)


# ------------------------------------------------------------------ researcher
def test_a_researchers_plain_slurm_works_in_general(rita, root):
    assert rita.run("srun", "hostname", check=True).stdout.strip() == "g1"
    assert "g1" in rita.run("salloc", "-p", "general", "srun", "hostname", check=True).stdout
    r = rita.run(
        "sbatch", "-p", "general", "-o", "out-%j.txt", "--wrap", "srun hostname; echo batch-done", check=True
    )
    jid = submitted_id(r)
    wait_gone(root, jid)
    out = rita.run("cat", f"out-{jid}.txt", check=True).stdout
    assert "g1" in out and "batch-done" in out, out
    # The site's own rule still applies (its job_submit.lua, before delegate's check).
    assert job_field(root, jid, "TimeLimit") == "01:00:00"
    # The site's own epilog still runs.
    end = time.monotonic() + 30
    while f"job={jid}" not in Shell("root", "g1").run("cat", "/var/log/slurm/site-epilog.log").stdout:
        assert time.monotonic() < end, "the site's epilog did not run"
        time.sleep(0.5)


def test_a_researcher_cannot_reach_courses_nodes(rita, root):
    # delegate's gate refuses course by name...
    for cmd in (["srun", "-p", "course", "hostname"], ["sbatch", "-p", "course", "--wrap", "hostname"]):
        r = rita.run(*cmd, timeout=60)
        assert r.returncode != 0, f"{cmd} accepted: {r.stdout}"
        assert REFUSED in r.stderr, (cmd, r.stderr)
    # ...and Slurm itself a node of course in general (the default partition).
    for cmd in (["srun", "-w", "c1", "hostname"], ["salloc", "-w", "c1", "true"]):
        r = rita.run(*cmd, timeout=60)
        assert r.returncode != 0, f"{cmd} accepted: {r.stdout}"
        assert "c1" not in r.stdout, r.stdout
    r = rita.run("sbatch", "-p", "general", "--hold", "--wrap", "hostname", check=True)
    jid = submitted_id(r)
    moved = rita.run("scontrol", "update", f"jobid={jid}", "partition=course")
    assert moved.returncode != 0, moved.stdout
    assert job_field(root, jid, "Partition") == "general"
    root.run("scancel", jid)


# ------------------------------------------------------------------ admin
def test_admins_keep_full_slurm_in_course(root, ada):
    assert root.run("srun", "-p", "course", "hostname", check=True).stdout.strip() == "c1"
    r = ada.run("srun", "-p", "course", "hostname", timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "c1", r.stdout + r.stderr


def test_both_epilogs_run_after_a_delegate_job(alice, root):
    r = alice.run("delegate", "--json", "submit", "--wait", "--", "true")
    assert r.returncode == 0, r.stdout + r.stderr
    jid = json.loads(r.stdout)["slurm_id"]
    c1 = Shell("root", "c1")
    end = time.monotonic() + 30
    while True:
        site = c1.run("cat", "/var/log/slurm/site-epilog.log").stdout
        ours = c1.run("cat", "/var/log/delegate/epilog.log").stdout
        if f"job={jid}" in site and f"job={jid}" in ours:
            break
        assert time.monotonic() < end, f"epilogs for {jid}: site {site[-300:]!r} delegate {ours[-300:]!r}"
        time.sleep(0.5)
