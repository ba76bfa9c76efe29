"""Lockdown (issue 11): the sandbox is the only way onto a node, and one
student's jobs are invisible to another. Each attack is tried as a test
student through plain Slurm, as a hostile student would; every test failed
on the main before the lockdown and passes with it (docs/security.md,
docs/robustness.md "Plain Slurm and other students").

The gates: slurmctld's job_submit.lua (slurm-conf/job_submit.lua) refuses
every submission that is not one of delegate's generated scripts; the SPANK
plugin (slurm-conf/spank/delegate_lockdown.c) refuses every job step but the
batch step in slurmstepd and scrubs the batch step's environment;
PrivateData and /proc hidepid hide other users' jobs and processes.
"""

from __future__ import annotations

import grp
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO, RUNNER, User, sh

from testlib import ensure_user, wait_until

REFUSED = "delegate: only delegate's own jobs may run here"


def slurm_as(user: User, *cmd, input=None, timeout=120, env_extra=None):
    """A Slurm command (or any) as the student, in their home, with a plain
    environment: what the student can type in their shell."""
    return user.as_user(*cmd, check=False, timeout=timeout, input=input, env_extra=env_extra, in_home=True)


def marker(user: User) -> Path:
    """A path the student could create if their command ran; it must not appear."""
    return user.home / f"lockdown-marker-{uuid.uuid4().hex[:8]}"


def fresh_job_dir(user: User) -> str:
    """A job directory path of delegate's form (below the user's root, a job id
    as basename) that does not exist: a script naming it is delegate's form,
    and if it ever ran the runner would refuse it."""
    return str(user.root / (time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8]))


# The single call's form as the client writes it (the fixture its unit
# test checks and the gate's Lua test reads: one source), with its
# example runner and job directory.
SINGLE_FORM = (Path(__file__).resolve().parents[1] / "fixtures" / "batch-scripts" / "single.sh").read_text()
FORM_RUNNER = "/usr/local/bin/sandbox-runner"
FORM_DIR = "/home/alice/.delegate/jobs/20261123T103000-abcdef01"


def delegate_script(job_dir: str) -> str:
    """broker/client/src/slurm/script.rs batch_script, for `job_dir`."""
    assert SINGLE_FORM.count(FORM_DIR) == 1 and SINGLE_FORM.count(FORM_RUNNER) == 1, SINGLE_FORM
    return SINGLE_FORM.replace(FORM_RUNNER, RUNNER).replace(FORM_DIR, job_dir)


def slurm_id(user: User, job: str) -> str:
    return (user.job_dir(job) / "slurm-id").read_text().split()[0]


def queued(user: User) -> list[str]:
    """The student's jobs in Slurm's queue."""
    return sh("squeue", "-h", "-u", user.name, "-o", "%i", check=False).stdout.split()


def gone_from_queue(sid: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while sh("squeue", "-h", "-j", sid, "-o", "%i", check=False).stdout.strip():
        assert time.monotonic() < deadline, f"Slurm job {sid} still in the queue"
        time.sleep(0.5)


def held_delegate_job(user: User, *sbatch_args: str) -> str:
    """Delegate's own script for a job directory that does not exist,
    submitted held by the student by hand (it never runs): its Slurm id."""
    r = slurm_as(
        user, "sbatch", "--parsable", "--hold", "--output=/dev/null", *sbatch_args,
        input=delegate_script(fresh_job_dir(user)),
    )  # fmt: skip
    assert r.returncode == 0, f"delegate's own form was refused: {r.stderr}"
    return r.stdout.strip().split(";")[0]


def slurmctld_log() -> Path:
    """slurmctld's log (its path from `scontrol show config`)."""
    conf = sh("scontrol", "show", "config").stdout
    return Path(
        next(ln.split("=", 1)[1].strip() for ln in conf.splitlines() if ln.startswith("SlurmctldLogFile"))
    )


def log_since(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def job_field(sid: str, fmt: str) -> str:
    return sh("squeue", "-h", "-j", sid, "-o", fmt).stdout.strip()


def assert_refused(r, reason: str | None = None):
    assert r.returncode != 0, f"accepted: rc=0 stdout={r.stdout!r} stderr={r.stderr!r}"
    assert REFUSED in r.stderr, r.stderr
    if reason:
        assert reason in r.stderr, r.stderr


# ------------------------------------------------------------ the gates' own tests
def test_job_submit_lua_unit_tests_on_the_installed_gate():
    """The slurmctld gate's unit tests (tests/lua/job_submit_test.lua; the
    fast tier runs them on the source) on the gate as installed here
    (/etc/slurm/job_submit.lua, rendered): every generated form accepted,
    forged scripts refused, fail-closed on errors."""
    lua = shutil.which("lua5.1")
    assert lua, "lua5.1 is not installed (build_cluster.sh --local installs it)"
    r = sh(lua, str(REPO / "tests/lua/job_submit_test.lua"), "/etc/slurm/job_submit.lua", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 failures" in r.stdout, r.stdout


def test_the_gates_are_installed():
    conf = Path("/etc/slurm/slurm.conf").read_text()
    assert "JobSubmitPlugins=lua" in conf
    assert "PrivateData=jobs,usage,users,accounts" in conf
    plugstack = Path("/etc/slurm/delegate-plugstack.conf").read_text()
    assert any(
        line.startswith("required ") and "delegate_lockdown.so" in line for line in plugstack.splitlines()
    )
    assert "delegate lockdown" in Path("/etc/slurm/job_submit.lua").read_text()


# ------------------------------------------------------------ slurmctld: submissions
def test_srun_allocation_is_refused(alice):
    m = marker(alice)
    r = slurm_as(alice, "srun", "-N1", "sh", "-c", f"touch {m}")
    assert_refused(r, "interactive allocations")
    assert not m.exists()


def test_salloc_is_refused(alice):
    m = marker(alice)
    r = slurm_as(alice, "salloc", "-N1", "sh", "-c", f"touch {m}")
    assert_refused(r, "interactive allocations")
    assert not m.exists()


def test_sbatch_wrap_is_refused(alice):
    m = marker(alice)
    before = queued(alice)
    r = slurm_as(alice, "sbatch", "--wrap", f"touch {m}")
    assert_refused(r, "--wrap")
    # (refused at submission: no job was queued that could touch it later)
    assert queued(alice) == before
    assert not m.exists()


@pytest.mark.parametrize(
    "form",
    [
        "extra-line",
        "command-substitution",
        "quote-break-out",
        "other-binary",
        "runner-probe",
        "newline-in-path",
    ],
)
def test_forged_script_is_refused(alice, form):
    """Scripts that mimic delegate's with extra shell: refused before they
    reach a node."""
    m = marker(alice)
    d = fresh_job_dir(alice)
    script = {
        "extra-line": delegate_script(d) + f"touch {m}\n",
        "command-substitution": f"#!/bin/sh\nexec '{RUNNER}' \"$(touch {m})\"'{d}'\n",
        "quote-break-out": f"#!/bin/sh\nexec '{RUNNER}' '{d}'; touch {m}; ''\n",
        "other-binary": f"#!/bin/sh\nexec '/usr/bin/touch' '{m}'\n",
        "runner-probe": f"#!/bin/sh\nexec '{RUNNER}' 'probe'\n",
        "newline-in-path": f"#!/bin/sh\nexec '{RUNNER}' '{alice.root}/x\n'; touch {m}; '/{Path(d).name}'\n",
    }[form]
    before = queued(alice)
    r = slurm_as(alice, "sbatch", "--output=/dev/null", input=script)
    assert_refused(r)
    assert queued(alice) == before
    assert not m.exists()


@pytest.mark.parametrize("flag", ["--export=NONE", "--get-user-env", "--export=ALL,FOO=1"])
def test_user_env_flags_are_refused(alice, flag):
    """With --get-user-env / --export other than ALL, slurmd (root) would run
    `su - <user> -c env` on the node (the user's login files, outside any
    step): refused even with delegate's own script. The same script without
    the flag is accepted (submitted held, then cancelled)."""
    script = delegate_script(fresh_job_dir(alice))
    r = slurm_as(alice, "sbatch", "--output=/dev/null", flag, input=script)
    assert_refused(r, "--get-user-env")
    ok = slurm_as(alice, "sbatch", "--parsable", "--hold", "--output=/dev/null", input=script)
    assert ok.returncode == 0, f"delegate's own form was refused: {ok.stderr}"
    sid = ok.stdout.strip().split(";")[0]
    sh("scancel", sid)
    gone_from_queue(sid)


def test_the_calls_comment_is_the_scripts_own(alice):
    """`delegate admin usage` counts a student's calls by the job's comment
    (`delegate:calls=N`). A student's own `--comment` is replaced at
    submission by the count of the script's job directories, and changing
    it later (`scontrol update comment=`) is refused; holding and shortening
    the job still work, root may still correct it."""
    sid = held_delegate_job(alice, "--comment=delegate:calls=999999")
    try:
        assert job_field(sid, "%k") == "delegate:calls=1"
        u = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "comment=delegate:calls=5000")
        assert u.returncode != 0, u.stdout + u.stderr
        assert job_field(sid, "%k") == "delegate:calls=1"
        t = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "TimeLimit=1")
        assert t.returncode == 0, t.stderr
        assert sh("scontrol", "update", f"jobid={sid}", "comment=delegate:calls=2").returncode == 0
        assert job_field(sid, "%k") == "delegate:calls=2", "root keeps the right to correct it"
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)


@pytest.mark.parametrize(
    "update,field,fmt",
    [("NumNodes=2", "node count", "%D"), ("NumNodes=1-2", "node count", "%D"), ("Gres=gpu:1", "GPUs", "%b")],
)
def test_a_pending_job_cannot_grow(alice, update, field, fmt):
    """slurmctld lets a user grow a pending job's node count or GRES: on an
    exclusive partition more nodes would be whole nodes the one sandbox
    never uses, taken from other students. The job gate's modify hook
    refuses it; the job keeps its script's own resources."""
    sid = held_delegate_job(alice)
    try:
        before = job_field(sid, fmt)
        log = slurmctld_log()
        offset = log.stat().st_size
        u = slurm_as(alice, "scontrol", "update", f"jobid={sid}", update)
        assert u.returncode != 0, u.stdout + u.stderr
        assert job_field(sid, fmt) == before
        # (22.05 shows the user only "Access/permission denied"; the gate's
        # reason is in slurmctld's log)
        assert "Access/permission denied" in u.stderr, u.stderr
        assert f"refused an update by uid {alice.uid}: a job's {field}" in log_since(log, offset), (
            "not the gate"
        )
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)


@pytest.mark.parametrize("raised", ["30", "UNLIMITED"])
def test_a_student_cannot_raise_a_time_limit(alice, raised):
    """Security round 4, item 2: slurmctld lets a user raise a pending job's
    time limit up to the partition's MaxTime; a held call raised to two
    hours, or a shared allocation raised past max_allocation_time, then
    released, held its node while another student waited. The gate
    refuses any raise; shortening still works."""
    sid = held_delegate_job(alice, "--time=5")
    try:
        log = slurmctld_log()
        offset = log.stat().st_size
        u = slurm_as(alice, "scontrol", "update", f"jobid={sid}", f"TimeLimit={raised}")
        assert u.returncode != 0, u.stdout + u.stderr
        assert job_field(sid, "%l") == "5:00"
        assert f"refused an update by uid {alice.uid}: a job's time limit may only be shortened" in log_since(
            log, offset
        )
        t = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "TimeLimit=2")
        assert t.returncode == 0, t.stderr
        assert job_field(sid, "%l") == "2:00"
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)


def test_the_partitions_maxtime_is_the_policys():
    """Security round 4, item 2: the partition's MaxTime was a fixed two
    hours above the policy's max_time (1h); it is now the policy's longest
    limit, a map's allocation's (max_allocation_time 10 minutes, max_time
    and 30 s for the call in progress), plus the client's minute, so no
    student's job asks for more."""
    part = sh("scontrol", "show", "partition", "-o").stdout
    assert "MaxTime=01:12:00" in part, part


def requeue_flag(sid: str) -> str:
    out = sh("scontrol", "show", "job", sid).stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("Requeue="))


def test_whether_a_students_job_runs_again_is_delegates(alice):
    """Issue 52: a one-node call with retries is submitted `--requeue` (a
    new attempt when its node is lost); the runner, not Slurm's flag,
    decides whether a requeued job runs anything (only when the last
    attempt left no outcome, within the call's retries). What the student
    submitted is kept (`--no-requeue` stays so: a call without retries
    ends lost); the flag of a job is never the student's to change later,
    and Slurm refuses `scontrol requeue` of a job that may not run again."""
    sid = held_delegate_job(alice, "--no-requeue")
    try:
        assert requeue_flag(sid) == "0", "the submitter's --no-requeue was not kept"
        log = slurmctld_log()
        offset = log.stat().st_size
        u = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "Requeue=1")
        assert u.returncode != 0, u.stdout + u.stderr
        assert requeue_flag(sid) == "0"
        assert f"refused an update by uid {alice.uid}: whether a job may run again" in log_since(log, offset)
        # (the job is pending: Slurm refuses its requeue for that already;
        # a running one is refused as non-requeueable, Slurm's own check)
        r = slurm_as(alice, "scontrol", "requeue", sid)
        assert r.returncode != 0, r.stdout + r.stderr
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)
    sid = held_delegate_job(alice, "--requeue")
    try:
        assert requeue_flag(sid) == "1", "a call with retries is requeueable"
        u = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "Requeue=0")
        assert u.returncode != 0, u.stdout + u.stderr
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)


def test_a_students_job_sends_no_mail(alice):
    """`--mail-user=<anyone> --mail-type=ALL` with delegate's own script
    would have slurmctld mail any address a student names, for every job:
    the gate submits it without mail and refuses adding mail later; the
    student may still shorten the job."""
    sid = held_delegate_job(alice, "--mail-type=ALL", "--mail-user=victim@example.org")
    try:
        # (scontrol shows MailUser/MailType only for a job that sends mail)
        shown = sh("scontrol", "show", "job", sid).stdout
        assert "MailType=" not in shown and "victim" not in shown, shown
        log = slurmctld_log()
        offset = log.stat().st_size
        u = slurm_as(
            alice, "scontrol", "update", f"jobid={sid}", "MailType=END", "MailUser=victim@example.org"
        )
        assert u.returncode != 0, u.stdout + u.stderr
        assert f"refused an update by uid {alice.uid}: delegate's jobs send no mail" in log_since(log, offset)
        shown = sh("scontrol", "show", "job", sid).stdout
        assert "MailType=" not in shown and "victim" not in shown, shown
        ok = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "TimeLimit=1")
        assert ok.returncode == 0, ok.stderr
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)


def test_batch_step_environment_is_scrubbed(alice, tmp_path):
    """`env LD_PRELOAD=~/x.so sbatch <delegate's script>`: the library would
    run inside /bin/sh on the node before it execs the runner, outside the
    sandbox. The SPANK plugin reduces the batch step's environment to an
    allowlist, so it never loads there."""
    m = marker(alice)
    src = tmp_path / "preload.c"
    src.write_text(
        "#include <stdlib.h>\n#include <fcntl.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void hit(void) {\n"
        '  if (getenv("SLURM_JOB_ID")) close(open("' + str(m) + '", O_CREAT | O_WRONLY, 0600));\n}\n'
    )
    so = alice.home / f"lockdown-preload-{uuid.uuid4().hex[:8]}.so"
    sh("gcc", "-shared", "-fPIC", "-o", str(so), str(src))
    shutil.chown(so, alice.uid, alice.gid)
    try:
        d = fresh_job_dir(alice)
        r = slurm_as(
            alice,
            "env",
            f"LD_PRELOAD={so}",
            "sbatch",
            "--parsable",
            f"--output={alice.home}/lockdown-preload.log",
            input=delegate_script(d),
        )
        assert r.returncode == 0, r.stderr
        sid = r.stdout.strip().split(";")[0]
        gone_from_queue(sid)
        assert not m.exists(), "LD_PRELOAD from the submitting shell ran in the batch step"
    finally:
        so.unlink(missing_ok=True)
        m.unlink(missing_ok=True)
        (alice.home / "lockdown-preload.log").unlink(missing_ok=True)


# srun's options as environment variables (sbatch reads none of them).
SRUN_OPTION_VARS = (
    "SLURM_PROLOG", "SLURM_EPILOG", "SLURM_TASK_PROLOG", "SLURM_TASK_EPILOG",
    "SLURM_MPI_TYPE", "SLURM_CPU_BIND", "SLURM_OVERLAP",
)  # fmt: skip


def runner_environ(uid: int, job_dir: Path) -> dict[str, str]:
    """The environment of the batch step's runner (the student's process
    on the node that runs `<runner> <job_dir>`)."""
    want = (RUNNER.encode(), str(job_dir).encode())
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit() or p.stat().st_uid != uid:
                continue
            argv = (p / "cmdline").read_bytes().split(b"\0")
            if argv[0] != want[0] or want[1] not in argv:
                continue
            raw = (p / "environ").read_bytes().decode()
        except OSError:
            continue
        return dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)
    raise AssertionError(f"no runner process for {job_dir}")


def test_srun_options_in_the_environment_never_reach_the_batch_step(alice):
    """`SLURM_PROLOG=~/p.sh delegate submit ...`: srun reads SLURM_PROLOG
    as --prolog (and SLURM_TASK_PROLOG, ...) and would run it as the
    student outside the sandbox when a rank job's runner starts srun. The
    plugin keeps only the SLURM_* variables slurmstepd sets."""
    m = marker(alice)
    script = alice.home / f"lockdown-prolog-{uuid.uuid4().hex[:8]}.sh"
    script.write_text(f"#!/bin/sh\ntouch {m}\n")
    script.chmod(0o755)
    shutil.chown(script, alice.uid, alice.gid)
    forged = {v: str(script) for v in SRUN_OPTION_VARS}
    try:
        r = alice.run("submit", "--", "sleep", "30", env_extra=forged)
        assert r.returncode == 0, r.stderr
        job = r.stdout.strip().splitlines()[-1]
        alice.wait_started(job)
        env = runner_environ(alice.uid, alice.job_dir(job))
        assert env.get("SLURM_JOB_ID", "").isdigit(), sorted(env)
        leaked = sorted(set(env) & set(SRUN_OPTION_VARS))
        assert not leaked, f"srun options from the submitter reached the batch step: {leaked}"
        alice.run("cancel", job)
        alice.wait(job)
        assert not m.exists()
    finally:
        script.unlink(missing_ok=True)
        m.unlink(missing_ok=True)


def test_no_rank_step_in_a_one_node_job(alice):
    """`srun --jobid=<own job> --overlap <runner> rank <dir>` into one's own
    single-node job: the plugin admits the rank form only in a job of two
    nodes or more (and the agent serves ranks only to those)."""
    job = alice.submit("sleep", "60")
    try:
        alice.wait_started(job)
        sid = slurm_id(alice, job)
        r = slurm_as(
            alice, "srun", f"--jobid={sid}", "--overlap", RUNNER, "rank", str(alice.job_dir(job)), timeout=60
        )
        assert "Plugin initialization failed" in r.stderr or "launch failed" in r.stderr, r.stderr
        assert not (alice.job_dir(job) / "started.0").exists()
    finally:
        alice.run("cancel", job)
        alice.wait(job)


def test_more_nodes_than_the_site_allows_is_one_sentence(alice):
    r = alice.run("submit", "--nodes", "2", "--", "true")
    assert r.returncode != 0
    err = r.stderr.strip()
    assert (
        err == "delegate: error: the site does not allow this job: nodes 2 is more than the site maximum of 1"
    ), err
    assert "Node count specification" not in err and len(err.splitlines()) == 1, err


def test_client_refuses_a_root_the_gate_would_refuse(alice):
    """A delegate root with a quote in its path: shell_quote would write
    '\\'' into the script and the job gate would refuse every job; the client
    says so first, naming the byte and the way out."""
    parent = alice.home / "o'k"
    try:
        r = slurm_as(
            alice, "delegate", "submit", "--", "true", env_extra={"DELEGATE_ROOT": str(parent / "jobs")}
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert "0x27" in r.stderr and "A-Z a-z 0-9" in r.stderr and "DELEGATE_ROOT" in r.stderr, r.stderr
    finally:
        shutil.rmtree(parent, ignore_errors=True)


# ------------------------------------------------------------ slurmstepd: steps
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
def test_step_into_own_allocation_is_refused(alice, overlap):
    """`srun --jobid=<own running delegate job> [--overlap] CMD`: the step
    fails in slurmstepd before it forks ("Plugin initialization failed";
    srun itself exits 0 on 22.05, so the test checks stderr and that the
    command left no trace), and the delegate job goes on unharmed."""
    job = alice.submit("sleep", "60")
    try:
        alice.wait_started(job)
        sid = slurm_id(alice, job)
        m = marker(alice)
        args = ["srun", f"--jobid={sid}", *(["--overlap"] if overlap else []), "sh", "-c", f"touch {m}; id"]
        r = slurm_as(alice, *args, timeout=120)
        assert "uid=" not in r.stdout, r.stdout
        assert "Plugin initialization failed" in r.stderr or "launch failed" in r.stderr, r.stderr

        def steps():
            out = sh("squeue", "-h", "-s", "-j", sid, "-o", "%i", check=False).stdout.split()
            return [s for s in out if re.fullmatch(rf"{sid}\.\d+", s)]

        wait_until("the refused step gone from Slurm's queue", lambda: not steps(), 30, detail=steps)
        assert not m.exists(), "the step ran"
        assert alice.status(job)["state"] == "running", "the refused step disturbed the job"
    finally:
        alice.run("cancel", job)
    assert alice.wait(job)["state"] == "cancelled"


def test_root_can_still_srun():
    r = sh("srun", "-N1", "-t", "1", "id", "-u", timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr


def test_admin_group_member_keeps_full_slurm():
    """A member of the admin group (not root) passes both gates: the job gate
    reads /etc/group (re-read at most every 60 s), the SPANK plugin the
    node's account database. The test account delegate-staff is made a
    member; the students never are."""
    m = re.search(r'^local ADMIN_GROUP\s*=\s*"([^"]+)"', Path("/etc/slurm/job_submit.lua").read_text(), re.M)
    assert m, "no ADMIN_GROUP in /etc/slurm/job_submit.lua"
    group = m.group(1)
    staff = User(ensure_user("delegate-staff").pw_name)
    if staff.name not in grp.getgrnam(group).gr_mem:
        sh("usermod", "-aG", group, staff.name)
    deadline = time.monotonic() + 90
    while True:
        r = slurm_as(staff, "srun", "-N1", "-t", "1", "id", "-u", timeout=300)
        if r.returncode == 0 or time.monotonic() > deadline or REFUSED not in r.stderr:
            break
        time.sleep(5)  # the job gate has not re-read /etc/group yet
    assert r.returncode == 0 and r.stdout.strip() == str(staff.uid), r.stdout + r.stderr


# ------------------------------------------------------------ privacy
def test_other_students_jobs_are_invisible(alice, bob):
    """PrivateData=jobs: bob's squeue and scontrol show nothing of alice's
    job; alice and root see it."""
    job = alice.submit("true", opts=("--hold",))
    try:
        sid = slurm_id(alice, job)
        r = slurm_as(bob, "squeue", "-h", "-o", "%i %u %Z %o")
        assert sid not in r.stdout and alice.name not in r.stdout, r.stdout
        r = slurm_as(bob, "scontrol", "show", "job", sid)
        assert f"JobId={sid}" not in r.stdout and alice.name not in r.stdout, r.stdout
        assert r.returncode != 0, r.stdout
        r = slurm_as(alice, "squeue", "-h", "-j", sid, "-o", "%i")
        assert r.stdout.strip() == sid, r.stdout + r.stderr
        assert sh("squeue", "-h", "-j", sid, "-o", "%i").stdout.strip() == sid
    finally:
        alice.run("cancel", job)


def test_other_students_processes_are_invisible(alice, bob):
    """/proc is mounted hidepid=invisible: bob's ps shows no process of
    alice's (the runner's command line names her job directory); root sees
    them."""
    job = alice.submit("sleep", "30")
    try:
        alice.wait_started(job)
        r = slurm_as(bob, "ps", "-ww", "-eo", "uid=,args=")
        assert r.returncode == 0, r.stderr
        uids = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
        assert str(alice.uid) not in uids, r.stdout
        assert job not in r.stdout, r.stdout
        mine = sh("ps", "-ww", "-eo", "uid=,args=").stdout
        assert job in mine, "root no longer sees the runner"
    finally:
        alice.run("cancel", job)


def test_no_student_makes_another_students_call_run_again(alice, bob):
    """Security round 5, the new round (issue 52's attempts): Bob cannot
    make Alice's running call with retries run again or stop it: Slurm
    refuses his requeue, requeuehold, hold, signal and cancel of her job,
    and the gate his update of its flag; her call runs once (no attempt
    recorded) and completes."""
    job = alice.submit("sleep", "8", opts=("--retries", "2", "--time", "1m"))
    alice.wait_started(job)
    sid = alice.status(job)["slurm_id"]
    for cmd in (
        ("scontrol", "requeue", sid),
        ("scontrol", "requeuehold", sid),
        ("scontrol", "hold", sid),
        ("scontrol", "update", f"jobid={sid}", "Requeue=0"),
        ("scancel", "--signal=STOP", "--batch", sid),
        ("scancel", sid),
    ):
        r = slurm_as(bob, *cmd)
        assert r.returncode != 0 or "denied" in (r.stdout + r.stderr).lower(), f"{cmd}: {r.stdout}{r.stderr}"
    st = alice.wait(job, timeout=120)
    assert st["state"] == "completed", st
    assert not (alice.job_dir(job) / "attempts").exists(), "it ran more than once"
    assert "ran again" not in st["reason"], st


def test_protected_links_and_files():
    for k in ("symlinks", "hardlinks", "fifos", "regular"):
        v = Path(f"/proc/sys/fs/protected_{k}").read_text().strip()
        assert int(v) >= 1, f"fs.protected_{k} = {v}"


def test_students_read_no_log(alice):
    """Security round 3, item 5: the logs (agent, slurmctld, slurmdbd,
    epilog, dockerd, ...) name every student's jobs, uids, refusals and
    kills; readable by root and group adm only, the directory not listable."""
    logs = Path("/var/log/delegate")
    files = sorted(p for p in logs.iterdir() if p.is_file())
    assert any(p.name == "agent.log" for p in files), files
    assert alice.as_user("ls", str(logs), check=False).returncode != 0
    for p in files:
        r = alice.as_user("head", "-c1", str(p), check=False)
        assert r.returncode != 0 and "Permission denied" in r.stderr, f"{p} is readable by a student"
        # group adm, or the daemon's own (slurmdbd re-owns its log to
        # SlurmUser's group when it restarts; a slurmstepd that crashes, as
        # 22.05's does when a dead node's spool makes its launch fail, dumps
        # `core` there as root:root 0600): never a student's, never other
        st = p.stat()
        assert st.st_mode & 0o007 == 0, (p, oct(st.st_mode))
        assert grp.getgrgid(st.st_gid).gr_name in ("adm", "slurm", "mysql", "root"), (p, st.st_gid)


FORGED_NAME = "x|COMPLETED|0|1|vm|delegate:calls=77777\n99999|other|y|FAILED|86400|1|vm|delegate:calls=5000"


@pytest.mark.parametrize("name", [FORGED_NAME, "a|b", "red\x1b[31m", "csi\u009b31m"])
def test_job_names_that_forge_fields_or_escape_are_refused(alice, name):
    """Security round 3, item 4: a job name is shown raw by squeue, sacct
    and scontrol; '|' and newlines forged the instructor's usage rows of
    another student, escapes reach everyone's terminal. Refused on submit
    and on a later `scontrol update JobName=`."""
    r = slurm_as(
        alice, "sbatch", "--parsable", "--hold", "--output=/dev/null", f"--job-name={name}",
        input=delegate_script(fresh_job_dir(alice)),
    )  # fmt: skip
    assert_refused(r, "a job name may not hold")
    sid = held_delegate_job(alice)
    try:
        r = slurm_as(alice, "scontrol", "update", f"jobid={sid}", f"JobName={name}")
        assert r.returncode != 0, r.stdout
        assert "|" not in job_field(sid, "%j") and "\x1b" not in job_field(sid, "%j")
        ok = slurm_as(alice, "scontrol", "update", f"jobid={sid}", "JobName=mon-essai")
        assert ok.returncode == 0 and job_field(sid, "%j") == "mon-essai", ok.stderr
    finally:
        sh("scancel", sid)
        gone_from_queue(sid)
