"""The course's day one on the stack, walked the way its people live it, in
the order of docs/instructors.md ("The course on the stack"):

1. the instructor deploys (`build_cluster.sh deploy`, elastic workers: one
   always on, one started by Slurm when work waits), adds the roster right
   after (`--stack accounts add --csv`), runs `build_cluster.sh test`;
2. two students log in to JupyterHub in a real browser (Debian's chromium,
   headless, Playwright) and, in a notebook, as a student would: an elastic
   cold call, a call, a map with one failing input, the README's CFiddle
   example with PERF_COUNT_SW_TASK_CLOCK, `delegate.jobs()`, `delegate
   doctor` and `sacct` from a cell; the second one tries the first one's
   files, jobs and server; the first one's TensorBoard of a training-like
   job, live, which the second one cannot reach, and a Dask graph whose
   tasks are calls;
3. `down`.

The assertions read what the page shows (cell outputs and live status
lines). Screenshots of every step: $DELEGATE_ARTIFACTS/acceptance (default
/var/lib/delegate/artifacts/acceptance), or acceptance-machines on the
worker machines (DELEGATE_ACCEPTANCE_MACHINES=1, below). Run by
tests/run.sh (stage 8) on the worker machines.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path

import pytest
from browser import ARTIFACTS_ROOT, URL, HubSession, browser_for

import testlib
from stacklib import (
    MACHINES,
    MACHINES_TOOL,
    SCRIPT,
    STACK_DIR,
    cid,
    initial_password,
    machine_docker,
    on,
    readme_block,
    run,
    wait_until,
    worker_machines,
)

ARTIFACTS = ARTIFACTS_ROOT / (
    "acceptance-machines" if os.environ.get("DELEGATE_ACCEPTANCE_MACHINES") == "1" else "acceptance"
)
# When this module was loaded: the screenshots of this run are newer.
RUN_STARTED = time.time()
ANN, BEN, PROF = "day-ann", "day-ben", "day-prof"
ROSTER = (
    "username,full name,email,role\n"
    "day-ann,Ann Day,ann@example.org\n"
    "day-ben,Ben Day,\n"
    "day-prof,Prof Day,prof@example.org,instructor\n"
)
ENV = {
    **os.environ,
    "DELEGATE_ELASTIC": "1",
    "DELEGATE_ELASTIC_MIN": "1",
    "DELEGATE_ELASTIC_MAX": "2",
    "DELEGATE_ELASTIC_IDLE": "30",
    "DELEGATE_ELASTIC_RESUME_TIMEOUT": "120",
    "DELEGATE_HUB_STUDENT_MEM": str(1 << 30),
}

# DELEGATE_ACCEPTANCE_MACHINES=1: the same day on worker machines with
# their own Docker engines and a home over the network
# (tests/machines/machines.sh), the instructor having joined each with
# `build_cluster.sh machine add` first (docs/instructors.md, "On real
# machines"); screenshots in acceptance-machines/.
ON_MACHINES = os.environ.get("DELEGATE_ACCEPTANCE_MACHINES") == "1"
if ON_MACHINES:
    # (what the instructor's cluster.toml says on such a cluster)
    ENV.update(
        DELEGATE_STACK_PLACEMENT="1",
        DELEGATE_MACHINE_SSH=run(MACHINES_TOOL, "ssh", quiet=True).stdout.strip(),
    )


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text(ROSTER)
    with contextlib.ExitStack() as machines:
        env = ENV
        if ON_MACHINES:
            env, _ = machines.enter_context(worker_machines(ENV))
        try:
            r = run(SCRIPT, "deploy", "--workers", "2", env=env, timeout=1800)
            assert r.returncode == 0, "deploy failed"
            yield roster
        finally:
            run(SCRIPT, "down", env=env, timeout=600)
            remove_roster()


def remove_roster():
    for u in (ANN, BEN, PROF):
        run(SCRIPT, "--stack", "accounts", "remove", u, "--archive", env=ENV)
        for f in (STACK_DIR / "archive").glob(f"{u}-*.tar.gz"):
            f.unlink()


def test_1_the_roster_right_after_deploy(day):
    r = run(SCRIPT, "--stack", "accounts", "add", "--csv", str(day), env=ENV, timeout=1800)
    assert r.returncode == 0, "the roster failed right after deploy"
    assoc = on("head", "sacctmgr", "-n", "-P", "show", "assoc", "format=user,account").stdout
    for u in (ANN, BEN, PROF):
        assert f"{u}|course" in assoc, f"{u} has no Slurm association: {assoc}"
    again = run(SCRIPT, "--stack", "accounts", "add", "--csv", str(day), env=ENV, timeout=1800)
    assert again.returncode == 0 and "nothing changed" in again.stdout + again.stderr


def test_2_the_instructors_check(day):
    r = run(SCRIPT, "test", env=ENV, timeout=1800)
    assert r.returncode == 0, "build_cluster.sh test failed"
    assert "https://:" not in r.stdout + r.stderr, "an address without its host"
    status = run(SCRIPT, "status", env=ENV).stdout
    assert status.count(":8888") <= 2, status


def powered_down(node: str, limit: float = 300) -> None:
    """Waits until Slurm has powered NODE down (idle after the instructor's
    check: DELEGATE_ELASTIC_IDLE, then its suspend) and its container is
    gone (Slurm says idle~ as soon as it asked for the stop)."""
    deadline = time.monotonic() + limit
    state = ""
    while time.monotonic() < deadline:
        state = on("head", "sinfo", "-h", "-N", "-n", node, "-o", "%T", quiet=True).stdout.strip()
        if state == "idle~" and not cid(node):
            return
        time.sleep(3)
    raise AssertionError(f"{node} is still {state!r} (container {cid(node) or 'gone'}) after {limit} s")


def host_cpu_model() -> str:
    """This host's CPU model name (the stack's workers run on it)."""
    return testlib.cpu0()["model name"]


@pytest.fixture(scope="module")
def browser(day):
    with browser_for(ARTIFACTS) as b:
        yield b


@pytest.fixture(scope="module")
def students(browser):
    ann, ben = (HubSession(browser, u, initial_password(u), ARTIFACTS) for u in (ANN, BEN))
    for s in (ann, ben):
        s.login()
        assert "Jupyter news" not in s.page.inner_text("body"), "the news popup covers the first screen"
        s.new_notebook()
    yield ann, ben
    for s in (ann, ben):
        s.ctx.close()


COLD = """import delegate
@delegate.remote(time="3m")
def nap(s):
    import time
    time.sleep(s)
first = nap.submit(45)
import time
deadline = time.time() + 120
while first.status.get("started") is None:  # (first holds worker1)
    assert time.time() < deadline, first.status
    time.sleep(0.5)
second = nap.submit(1)
first.result(); second.result()
print("hosts", sorted([first.status["host"], second.status["host"]]))
print("second waited %.0f s" % (second.status["started"] - second.status["submitted"]))"""

CALL = """@delegate.remote(cpus=1, time="2m")
def where(x):
    import os, socket, time
    time.sleep(4)
    return f"remote-uid={os.getuid()} on {socket.gethostname()} twice={2 * x}"
print("caller-uid", os.getuid())
where(21)"""

MAP = """def inverse(x):
    import time
    time.sleep(3 if x else 6)
    return 1 / x
with delegate.Executor(time="2m") as ex:
    try:
        print(list(ex.map(inverse, [1, 2, 0, 4, 5, 6, 7, 8])))
    except ZeroDivisionError as e:
        print("caught", type(e).__name__)"""

# The machine the call ran on, as the worker's agent recorded it (issue 32).
MACHINE = """f = where.submit(1); f.result()
fp = f.fingerprint
print("machine", fp["node"], "|", fp["cpu_model"], "| governor", fp["governor"], "| counters", fp["perf_mode"])
print("tuning", "; ".join(fp["tuning"]))"""

TABLE = "delegate.jobs()"
DOCTOR = "!delegate doctor; echo doctor-exit=$?"
SACCT = "!sacct -X -n --format=JobID,State%20 | tail -n 3; echo sacct-exit=$?"
ADMIN_NODES = "!delegate admin nodes; echo admin-nodes-exit=$?"
# The README's CFiddle run again, each measurement three times in one
# sandbox after one warm-up run (issue 32): rows told apart by `repeat`.
REPEATED = (
    "delegate.cfiddle.enable(time='5m', repeat=3, warmup=1)\n"
    "again = run(exes, 'loop', arg_map(count=[100000]), perf_counters=['PERF_COUNT_SW_TASK_CLOCK']).as_df()\n"
    "print(again.groupby('OPTIMIZE')['repeat'].apply(sorted).to_string())\n"
    "print(again.groupby('OPTIMIZE')['PERF_COUNT_SW_TASK_CLOCK'].median().to_string())\n"
    "print('rows', len(again))\n"
    "delegate.cfiddle.enable(time='5m')"
)


def test_3_a_students_day_in_the_browser(students):
    ann, ben = students
    # An elastic cold call: worker1 is busy, worker2 powered down.
    powered_down("worker2")
    states, text = ann.watch_cell(
        "import os\n" + COLD, "delegate: nap", "hosts", "cold-call", timeout=420_000
    )
    assert "['worker1', 'worker2']" in text, text
    # The second call's line, while worker2 powers up: in the user's words
    # (not "pending"), from its first Slurm answer (within 2-4 s) to its
    # start; a worker that came up faster leaves nothing to say.
    waited = float(re.search(r"second waited (\d+) s", text).group(1))
    kinds = sorted({re.sub(r" · [0-9hms ]+$", "", s) for s in states})
    print(f"cold start: the second call waited {waited:.0f} s; its states: {kinds}")
    if waited > 6:
        assert any("waiting for a worker to start" in k for k in kinds), f"no cold-start words: {kinds}"
    for s in (ann, ben):
        states, text = s.watch_cell("import os, delegate\n" + CALL, "delegate: where", "twice=42", "call")
        uid = on("user", "id", "-u", s.user).stdout.strip()
        assert f"caller-uid {uid}" in text and f"remote-uid={uid}" in text, text
        assert any(re.search(r"— running on worker\d · ", x) for x in states), states
        assert re.search(r"— done · ", text), text
    # The machine of Ann's call: the worker's own CPU (the stack's workers
    # share this host's), its tuning in words.
    text = ann.run_cell(MACHINE, "tuning", "machine")
    model = host_cpu_model()
    assert re.search(r"machine worker\d \| " + re.escape(model) + r" \| governor", text), text
    assert re.search(r"tuning .*governor", text), text
    # A map with one failing input: the line names the call that raised;
    # the traceback has no delegate frame.
    text = ann.run_cell(MAP, "caught ZeroDivisionError", "map-with-a-failure")
    assert "call 2 raised ZeroDivisionError" in text, text
    text = ann.run_cell(
        "@delegate.remote(time='2m')\ndef boom():\n    raise ValueError('no free lunch')\nboom()",
        "no free lunch",
        "traceback",
    )
    assert "ValueError" in text and "raise ValueError('no free lunch')" in text, text
    for internal in ("_traceback.py", "raise_remote", "_futures.py", "concurrent/futures"):
        assert internal not in text, f"{internal} in the traceback: {text}"
    # The README's CFiddle example, unchanged.
    ann.run_cell(readme_block("### CFiddle experiments"), "['", "cfiddle", timeout=600_000)
    text = ann.run_cell("print(results.as_df().to_string())", "PERF_COUNT_SW_TASK_CLOCK", "cfiddle-table")
    assert "-O3" in text and "-O0" in text, text
    text = ann.run_cell(REPEATED, "rows ", "cfiddle-repeat", timeout=600_000)
    assert "rows 6" in text, "2 builds x 1 argument x 3 repeats: " + text
    assert re.search(r"-O0\s+\[0, 1, 2\]", text) and re.search(r"-O3\s+\[0, 1, 2\]", text), text
    # Her jobs, in her words.
    text = ann.run_cell(TABLE, "function or command", "jobs-table")
    assert "raised ZeroDivisionError" in text and "raised ValueError" in text, text
    assert "cancelled by the user" not in text, text
    html = ann.page.locator(".delegate-jobs").last.inner_html()
    assert "#c62828" in html, "a call that raised is not in the failure colour"
    assert "machine" in text and model in text, "the table names the machine of each call: " + text
    for s in (ann, ben):
        text = s.run_cell(DOCTOR, "doctor-exit=", "doctor")
        assert "doctor-exit=0" in text and "FAIL" not in text and "user node" in text, text
        text = s.run_cell(SACCT, "sacct-exit=", "sacct")
        assert "sacct-exit=0" in text and "COMPLETED" in text, text
        assert "Munge" not in text and "authentication" not in text, text
    # Ben tries Ann's files, jobs and server.
    ann.run_cell(
        'open(os.path.expanduser("~/notes.txt"), "w").write("ann"); print("written")', "written", "file"
    )
    home = os.environ.get("DELEGATE_STACK_HOME", str(STACK_DIR / "home"))
    text = ben.run_cell(
        "for p in ("
        f'"{home}/{ANN}/notes.txt", "{home}/{ANN}/.delegate/jobs", "{home}"):\n'
        "    try:\n"
        "        print(p, open(p).read() if p.endswith('.txt') else os.listdir(p))\n"
        "    except OSError as e:\n"
        "        print(p, 'refused', type(e).__name__)",
        f"{home} refused",
        "others-files",
    )
    assert text.count("refused PermissionError") == 3 and "ann" not in text.replace(ANN, ""), text
    resp = ben.page.goto(f"{URL}/user/{ANN}/lab")
    ben.page.wait_for_load_state("load")
    ben.shot("others-server")
    assert ben.page.locator(".jp-LabShell").count() == 0, "Ben got a JupyterLab at Ann's URL"
    assert resp is not None and (resp.status == 403 or "403" in ben.page.inner_text("body"))


# A training-like job that writes one TensorBoard event a second (issue 43).
TRAIN = """@delegate.remote(time="4m")
def train(steps):
    import math, time
    from tensorboardX import SummaryWriter
    w = SummaryWriter("/job/runs/train")
    for step in range(steps):
        w.add_scalar("loss", math.exp(-step / 15) + 0.05 * math.sin(step), step)
        w.flush()
        time.sleep(1)
    w.close()
    return steps
training = train.submit(150)
board = delegate.tensorboard(training)
print("board", board.url)
board"""
BOARD_CLI = "!delegate tensorboard {id}; echo tensorboard-exit=$?"


def scalar_points(s, base: str) -> int:
    """How many points of `loss` the board serves now (asked as the page
    does, with the student's own session)."""
    r = s.ctx.request.get(f"{base}data/plugin/scalars/scalars?run=runs/train&tag=loss")
    return len(r.json()) if r.ok else -r.status


# A fetch as any script of a page at the hub's address would make it (mode
# cors, the student's cookies): its status and the start of its text.
FETCH = """async (u) => {
  try {
    const r = await fetch(u, {credentials: "include", redirect: "manual"});
    return [r.status, r.type + " " + (await r.text()).slice(0, 300)];
  } catch (e) {
    return [-1, String(e)];
  }
}"""
# Ben's page in his own home (written in his hub terminal's shell): would
# it run in Ann's browser, it would read her server's answers with her
# cookies.
EVIL = (
    "printf '%s' '<title>evil</title><script>fetch(\"/user/day-ann/api/status\")"
    '.then(() => { document.title = "ran" })</script>\' > ~/evil.html && echo evil written\n'
)


def test_3b_tensorboard_of_a_running_job(students):
    """Ann's training-like job writes an event a second; her board (served
    by her own Jupyter server) shows the curve grow while it runs; Ben can
    reach it neither through his server nor through hers."""
    ann, ben = students
    text = ann.run_cell(TRAIN, "TensorBoard of job", "tensorboard-link")
    job_id, url = re.search(r"board (/user/[^/]+/delegate/tensorboard/(\S+)/)", text).group(2, 1)
    assert url == f"/user/{ANN}/delegate/tensorboard/{job_id}/", text
    text = ann.run_cell(BOARD_CLI.format(id=job_id), "tensorboard-exit=", "tensorboard-cli")
    assert f"TensorBoard of job {job_id}: {url}" in text and "tensorboard-exit=0" in text, text
    deadline = time.monotonic() + 300
    while (first := scalar_points(ann, URL + url)) < 5:
        assert time.monotonic() < deadline, f"no curve on the board: {first}"
        time.sleep(3)
    page = ann.ctx.new_page()
    # Every request of the board's page answered (its fonts included: named
    # from the server's root by TensorBoard, they 404ed at the hub).
    answers: list[tuple[int, str]] = []
    page.on("response", lambda r: answers.append((r.status, r.url)))
    page.goto(URL + url)
    page.wait_for_load_state("load")
    page.screenshot(path=str(ARTIFACTS / f"{ANN}-tensorboard-0-opened.png"), full_page=True)
    page.wait_for_selector("text=loss", timeout=120_000)
    page.wait_for_selector("canvas, svg.line-chart, .line-chart", timeout=60_000)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(ARTIFACTS / f"{ANN}-tensorboard-1-live.png"), full_page=True)
    seen = {}

    def grown():
        seen["points"] = scalar_points(ann, URL + url)
        return seen["points"] >= first + 8

    wait_until(
        "the curve growing by 8 points while the job runs",
        grown,
        90,
        1,
        detail=lambda: f"{first} points, then {seen.get('points')}",
    )
    page.reload()
    page.wait_for_selector("text=loss", timeout=120_000)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(ARTIFACTS / f"{ANN}-tensorboard-2-grown.png"), full_page=True)
    assert "train" in page.inner_text("body"), page.inner_text("body")[:2000]
    page.close()
    failed = [a for a in answers if a[0] >= 400]
    fonts = [a for a in answers if "/font-roboto/" in a[1]]
    assert not failed and fonts, (failed, fonts[:3])
    assert all(u.startswith(URL + url + "font-roboto/") for _, u in fonts), fonts[:3]
    # Security round 5, item 2: the board's data is checked for the
    # server's XSRF token like any cookie-authenticated fetch (the board's
    # page sends it): a fetch from any other page at the hub's address (here
    # Ann's own lab page, the same origin as an attacker's would be) gets no
    # data. And Ben's own HTML is not served to Ann at all.
    got = ann.page.evaluate(FETCH, f"{url}data/runs")
    assert not (got[0] == 200 and "runs/train" in got[1]), got
    wrote = run(SCRIPT, "shell", BEN, input=EVIL, env=ENV, timeout=300)
    assert "evil written" in wrote.stdout, wrote.stdout + wrote.stderr
    evil = ann.ctx.new_page()
    answer = evil.goto(f"{URL}/user/{BEN}/files/evil.html")
    evil.wait_for_load_state("load")
    evil.screenshot(path=str(ARTIFACTS / f"{ANN}-opens-bens-page.png"), full_page=True)
    assert not evil.title().startswith("ran"), (answer.status if answer else None, evil.title())
    assert "runs/train" not in evil.inner_text("body"), evil.inner_text("body")[:500]
    evil.close()
    # Ben: through his own server (not his job), through Ann's (not his
    # server), and with his CLI.
    mine = ben.ctx.request.get(f"{URL}/user/{BEN}/delegate/tensorboard/{job_id}/data/runs")
    assert mine.status == 404, (mine.status, mine.text()[:300])
    hers = ben.ctx.request.get(f"{URL}{url}data/runs", max_redirects=0)
    assert hers.status in (302, 403) and "runs/train" not in hers.text(), (hers.status, hers.text()[:300])
    # (Ben's page is the hub's refusal of Ann's server, test_3: his shell,
    # as one of his hub terminals would run it.)
    script = f"echo home=$HOME; delegate status {job_id}; export JUPYTERHUB_SERVICE_PREFIX=/user/{BEN}/\n"
    r = run(
        SCRIPT,
        "shell",
        BEN,
        input=script + BOARD_CLI.format(id=job_id).lstrip("!") + "\n",
        env=ENV,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert f"no job {job_id}" in out and "tensorboard-exit=1" in out, out
    ann.run_cell("training.cancel(); print('cancelled', training.job_id)", "cancelled", "tensorboard-done")


# A Dask graph from the notebook, each task a call (issue 43, seed 003).
DASK = """import dask
@dask.delayed
def inc(x):
    import os
    return (x + 1, os.getuid())
@dask.delayed
def total(parts):
    return sum(p[0] for p in parts), sorted({p[1] for p in parts})
with delegate.Executor(time="2m") as ex:
    (got,) = dask.compute(total([inc(i) for i in range(3)]), scheduler=ex)
print("dask total", got[0], "uids", got[1])"""


def test_3c_a_dask_graph_from_the_notebook(students):
    """docs/ml.md's Dask example in Ann's notebook: four tasks, each a call
    in a sandbox as Ann, named on the page by its task, the value Dask's
    own."""
    ann, _ = students
    text = ann.run_cell(DASK, "dask total", "dask", timeout=300_000)
    uid = on("user", "id", "-u", ann.user).stdout.strip()
    assert f"dask total 6 uids [{uid}]" in text, text
    assert text.count("delegate: inc [") == 3 and text.count("delegate: total [") == 1, text
    assert "batch_execute_tasks" not in text, text


# A call whose machine dies under it (issue 52): it runs again elsewhere.
LONG = """import delegate
@delegate.remote(time="3m")
def slow():
    import socket, time
    time.sleep(40)
    return socket.gethostname()
print("came back from", slow())"""


def sandbox_on(m: str) -> bool:
    r = machine_docker("exec", m, "docker", "ps", "-q", "--filter", "label=delegate.slurm-job", quiet=True)
    return bool(r.stdout.split())


def worker_of_the_sandbox() -> str | None:
    """The worker whose node runs the (one) sandbox now: on the machines,
    the machine whose engine holds it; on this host alone, the sandbox's
    hostname (it is named after its node)."""
    if ON_MACHINES:
        return next((f"worker{i + 1}" for i, m in enumerate(MACHINES) if sandbox_on(m)), None)
    ids = run("docker", "ps", "-q", "--filter", "label=delegate.slurm-job", quiet=True).stdout.split()
    if not ids:
        return None
    return run("docker", "inspect", "-f", "{{.Config.Hostname}}", ids[0], quiet=True).stdout.strip() or None


def kill_the_machine_of(worker: str) -> None:
    """Pulls the power cord: the worker's machine killed (on this host
    alone, the machine is the worker's container: swarm starts it again
    by itself, as a machine's boot would)."""
    if ON_MACHINES:
        machine_docker("kill", MACHINES[int(worker.removeprefix("worker")) - 1])
    else:
        run("docker", "kill", cid(worker))


def test_3d_a_call_whose_machine_dies_comes_back(students):
    """Issue 52, as Ann lives it: her call runs on a machine that is
    killed hard mid-call (its engine, worker and home client gone at once).
    Her notebook's line says the node was lost and the call runs again,
    then names the new attempt, and the value comes back, from the other
    machine. Powered on again, the machine rejoins by itself."""
    ann, _ = students
    killed: dict[str, float | str] = {}

    def kill_where_it_runs():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            worker = worker_of_the_sandbox()
            if worker:
                kill_the_machine_of(worker)
                killed.update(worker=worker, at=time.monotonic())
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_where_it_runs, daemon=True)
    killer.start()
    started = None
    try:
        lost = watch_the_call_come_back(ann, killed)
    finally:
        # (however it went: a machine left off would fail the next tests)
        killer.join(5)
        if ON_MACHINES and killed:
            started = machine_docker(
                "start", MACHINES[int(str(killed["worker"]).removeprefix("worker")) - 1], timeout=120
            )
    t = time.monotonic()
    if ON_MACHINES:
        assert started is not None and started.returncode == 0, started
    wait_until(
        f"{lost} back in the course",
        lambda: (
            on("head", "sinfo", "-h", "-n", lost, "-o", "%T", quiet=True).stdout.strip().startswith("idle")
        ),
        600,
        3,
    )
    print(f"powered on: {lost} idle again after {time.monotonic() - t:.0f} s")


def watch_the_call_come_back(ann: HubSession, killed: dict) -> str:
    """Ann's LONG cell while its machine is killed (`killed` names the
    worker): the line says the node was lost and the call runs again, then
    names the new attempt, and the value comes back from the other machine.
    Returns the lost worker."""
    states, text = ann.watch_cell(LONG, "delegate: slow", "came back from", "machine-lost", timeout=600_000)
    wait_until("the killer thread's record of the machine it killed", lambda: bool(killed), 10, 0.5)
    lost = str(killed["worker"])
    # (on the machines the lost one stays off until powered on; on this
    # host alone swarm starts its container again at once, and the new
    # attempt may run there)
    other = ("worker2" if lost == "worker1" else "worker1") if ON_MACHINES else r"worker\d"
    print("machine lost:", lost, "states:", states)
    assert re.search(f"came back from {other}", text), text
    said_lost = [i for i, s in enumerate(states) if f"its node {lost} was lost, it runs again" in s]
    assert said_lost, states
    assert any(re.search(f"ran again on {other} \\(attempt 2\\): {lost} was lost", s) for s in states), states
    # Once it said the node was lost, it never says the call runs there
    # again (the lost attempt's start record, read between Slurm's answers;
    # on this host alone the new attempt may run on the same worker).
    back = [s for s in states[said_lost[0] :] if re.search(f"running on {lost}( |$)", s)]
    assert not (ON_MACHINES and back), back
    return lost


def test_4_the_instructor_in_the_browser(browser, students):
    """The roster's instructor: `delegate doctor` from a notebook (an admin
    on the user node: the shared munged) and the hub's admin page, which
    lists the class and no test account."""
    prof = HubSession(browser, PROF, initial_password(PROF), ARTIFACTS)
    prof.login()
    prof.new_notebook()
    text = prof.run_cell(DOCTOR, "doctor-exit=", "doctor")
    assert "doctor-exit=0" in text and "FAIL" not in text and "user node" in text, text
    # The fleet (issue 32): each worker's class, none drifted since deploy.
    text = prof.run_cell(ADMIN_NODES, "admin-nodes-exit=", "admin-nodes")
    assert "admin-nodes-exit=0" in text and re.search(r"\d+ node\(s\), \d class\(es\)", text), text
    assert "no drift" in text and "\ndrift:" not in text and "worker1" in text, text
    resp = prof.page.goto(f"{URL}/hub/admin")
    prof.page.wait_for_selector(f"text={ANN}")
    prof.shot("admin-page")
    body = prof.page.inner_text("body")
    assert resp is not None and resp.status == 200, resp and resp.status
    assert ANN in body and BEN in body, body
    assert "dlg-test" not in body, f"the instructor's test accounts are listed: {body}"
    prof.ctx.close()


# A student's burst before the deadline, from their shell: three calls of
# 40 s (with Ben's three, six calls for two workers: some wait).
RUSH = "for i in 1 2 3; do delegate submit --time 3m -- sleep 40 >/dev/null || echo submit-failed; done\necho rush-submitted\n"
ADMIN_RUSH = "delegate admin rush --since now-1hour; echo admin-rush-exit=$?\n"
# Ann's call behind the rush's calls (issue 56: her line says where it stands).
BEHIND = """import delegate
@delegate.remote(time="2m")
def behind():
    return "behind-done"
print(behind())"""
# A student's notebook asks the page's service for its data directly.
PEEK = """import os, urllib.request, urllib.error
class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
opener = urllib.request.build_opener(NoRedirect)
for token in (None, os.environ["JUPYTERHUB_API_TOKEN"]):
    auth = {"Authorization": f"token {token}"} if token else {}
    try:
        r = opener.open(urllib.request.Request("http://127.0.0.1:10102/services/rush/data", headers=auth), timeout=30)
        print("peek", r.status, r.read()[:200])
    except urllib.error.HTTPError as e:
        print("peek", e.code)
print("peek-done")"""


def back_to_a_notebook(s: HubSession) -> None:
    """The student's own JupyterLab again, on a notebook whose kernel is
    idle: the one the workspace restores, else a new one."""
    p = s.page
    p.goto(f"{URL}/user/{s.user}/lab")
    p.wait_for_selector(".jp-LauncherCard, .jp-Notebook .jp-Cell .cm-content", timeout=180_000)
    if p.locator(".jp-Notebook .jp-Cell .cm-content").count() == 0:
        s.new_notebook()
    p.wait_for_selector(".jp-StatusBar-TextItem:has-text('| Idle')", timeout=120_000)


def test_4b_the_instructors_page_during_a_rush(browser, students):
    """Issue 56, tried as its people live it: Ann and Ben each submit three
    calls of 40 s from their shells; Ann's `delegate list` says where her
    waiting calls stand (how many jobs are ahead, when they likely start),
    and so does her notebook's line for one more call; the instructor opens the rush page from the hub
    (/services/rush/): the calls running and waiting, the students waiting
    longest (both of them), the busy nodes, the plots after a few samples;
    `delegate admin rush` in the instructor's shell says the same numbers
    as text. Ben opening the page's address is refused by the hub."""
    ann, ben = students
    for u in (ANN, BEN):
        r = run(SCRIPT, "shell", u, input=RUSH, env=ENV, timeout=300)
        out = r.stdout + r.stderr
        assert "rush-submitted" in out and "submit-failed" not in out, out
    try:
        r = run(SCRIPT, "shell", ANN, input="delegate list; echo list-exit=$?\n", env=ENV, timeout=300)
        out = r.stdout + r.stderr
        print(out)
        assert "list-exit=0" in out and re.search(
            r"likely to start (within|in about)|no estimate of its start|running", out
        ), out
        # (the place helper's count: four of the six calls wait for the two
        # workers, Ann's behind some of them)
        assert re.search(r", (\d+ jobs? ahead|next in line);", out), out
        # ... and her notebook's line, for a call behind the rush's (it
        # runs on in her kernel while the instructor looks; the queue is
        # waited for below)
        back_to_a_notebook(ann)
        states, _ = ann.watch_cell(BEHIND, "delegate: behind", " ahead", "rush-place", timeout=180_000)
        print("Ann's line behind the rush:", states)
        assert any(
            re.search(r"pending — \d+ jobs? ahead, (likely to start|no estimate)", x) for x in states
        ), states
        prof = HubSession(browser, PROF, initial_password(PROF), ARTIFACTS)
        prof.login(lab=False)
        p = prof.page
        resp = p.goto(f"{URL}/services/rush/")
        assert resp is not None and resp.status == 200, resp and resp.status

        def fact(name: str) -> str:
            return p.inner_text(f"#f-{name} b").strip()

        def rush_shown():
            waiting = p.inner_text("#t-waits")
            return fact("pending") not in ("-", "0") and ANN in waiting and BEN in waiting

        wait_until("the page showing both students waiting", rush_shown, 120, 1)
        # two samples or more: the plots have lines
        wait_until("the plots drawn", lambda: p.locator("#p-queue polyline").count() == 2, 60, 1)
        prof.shot("rush-page")
        body = p.inner_text("body")
        print(body)
        assert "calls running" in body and "students waiting" in body and "Nodes out, and why" in body, body
        assert int(fact("running")) >= 1 and re.fullmatch(r"\d+ of 2", fact("busy")), body
        heavy = p.inner_text("#t-heavy")
        assert "node time" in heavy, heavy
        prof.ctx.close()
        r = run(SCRIPT, "shell", PROF, input=ADMIN_RUSH, env=ENV, timeout=300)
        out = r.stdout + r.stderr
        print(out)
        assert "admin-rush-exit=0" in out and re.search(r"calls: \d+ running, [1-9]\d* waiting", out), out
        assert re.search(rf"waiting longest: {ANN} \(\d+ waiting", out), out
        # Ben, a student, at the page's address (a new tab: his notebook
        # stays): the hub refuses him.
        tab = ben.ctx.new_page()
        resp = tab.goto(f"{URL}/services/rush/")
        tab.screenshot(path=str(ARTIFACTS / f"{BEN}-rush-page-refused.png"), full_page=True)
        text = tab.inner_text("body")
        print("Ben at the rush page:", resp and resp.status, text[:300])
        assert resp is not None and resp.status == 403, (resp and resp.status, text)
        assert "calls waiting" not in text and ANN not in text, text
        tab.close()
        # ... nor straight at the service's port from his own server, on
        # the same node, with or without his server's token (his own lab
        # first: test 3 left his page at Ann's address).
        back_to_a_notebook(ben)
        text = ben.run_cell(PEEK, "peek-done", "rush-peek")
        print(text)
        assert "peek-done" in text and re.search(r"peek (302|40[134])", text), text
        assert "peek 200" not in text and ANN not in text, text
    finally:
        # The rush's calls run to their end (test 5 reads Ben's last ones
        # in sacct as completed); cancelled only past a deadline.
        def queue_empty():
            r = on("head", "squeue", "-h", "-u", f"{ANN},{BEN}", quiet=True)
            return r.returncode == 0 and not r.stdout.strip()

        try:
            wait_until("the rush's calls done", queue_empty, 300, 3)
        finally:
            for u in (ANN, BEN):
                on("head", "scancel", "-u", u, quiet=True)


def test_5_a_students_shell_on_the_hub(day):
    """`./build_cluster.sh shell NAME` (docs/instructors.md's way to a student's
    shell): Slurm, sacct and delegate work there as in the hub's terminal."""
    script = "sacct -X -n --format=State%20 | tail -n 2; echo sacct-exit=$?\ndelegate doctor; echo doctor-exit=$?\n"
    r = run(SCRIPT, "shell", BEN, input=script, env=ENV, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "sacct-exit=0" in out and "COMPLETED" in out, out
    assert "doctor-exit=0" in out and "FAIL" not in out, out


# Ben's call returns an object that, unpickled, runs a command as whoever
# unpickles it; he then opens his jobs to everyone.
BAIT = """cat >bait.py <<'PY'
import os, delegate
class Bait:
    def __reduce__(self):
        return (os.system, ("touch ~/pwned-by-ben",))
@delegate.remote(time="1m")
def bait():
    return Bait()
f = bait.submit()
f.exception()
print("BAIT", f.job_id, f.state, flush=True)
PY
python3 bait.py
chmod 755 ~ ~/.delegate ~/.delegate/jobs
chmod -R a+rX ~/.delegate/jobs
ls "$(dirname "$HOME")/day-ann/.delegate/jobs"; echo ls-ann=$?
"""


def test_5b_no_student_makes_another_unpickle_their_data(day):
    """Security round 5, item 3c, in the students' shells on the hub: Ben
    leaves a finished call whose result runs a command when unpickled, opens
    his jobs to everyone, and has Ann point her delegate at them
    (DELEGATE_ROOT, the CLI and Python); her client refuses a jobs root that
    is not hers before it reads anything, so the bait never runs as her. Ben
    cannot list Ann's jobs either."""
    r = run(SCRIPT, "shell", BEN, input=BAIT, env=ENV, timeout=300)
    out = r.stdout + r.stderr
    m = re.search(r"BAIT (\S+) completed", out)
    assert m, out
    assert "Permission denied" in out and "ls-ann=0" not in out, out
    theirs = 'DELEGATE_ROOT="$(dirname "$HOME")/day-ben/.delegate/jobs"'
    victim = (
        f'ls "$(dirname "$HOME")/day-ben/.delegate/jobs/{m[1]}" >/dev/null && echo seen=yes\n'
        f"{theirs} delegate status {m[1]}; echo status=$?\n"
        f"{theirs} delegate wait {m[1]}; echo wait=$?\n"
        f"{theirs} python3 -c 'import delegate; print(delegate.Job(\"{m[1]}\").result())'; echo py=$?\n"
        "test -e ~/pwned-by-ben; echo pwned=$?\n"
    )
    r = run(SCRIPT, "shell", ANN, input=victim, env=ENV, timeout=300)
    out = r.stdout + r.stderr
    print(out)
    for what in ("status", "wait", "py"):
        assert f"{what}=0" not in out, out
    # (Ben's job is there for Ann to read, and her client refuses it, in
    # one sentence, before it reads anything)
    assert "seen=yes" in out and "pwned=1" in out, out
    assert "cannot use the delegate root" in out and "is owned by uid" in out, out


def test_6_down_leaves_nothing(day):
    r = run(SCRIPT, "down", env=ENV, timeout=600)
    assert r.returncode == 0 and "nothing of stack" in r.stdout + r.stderr


def test_screenshots_are_kept():
    # This run's, not an earlier one's (issue 44: any old *.png passed).
    fresh = [p for p in Path(ARTIFACTS).glob("*.png") if p.stat().st_mtime >= RUN_STARTED]
    assert fresh, f"no screenshot of this run in {ARTIFACTS}"
