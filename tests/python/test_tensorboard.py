"""TensorBoard of a job (issue 43, seeds 003 and 004; docs/ml.md
"TensorBoard"): a call writes event files into /job with tensorboardX, and
the student's own Jupyter server (jupyter_server with the delegate._jupyter
extension, as the user image enables it) serves the job's board at
<base url>delegate/tensorboard/<id>/, to its own student only; another
student's server says it has no such job. The browser's view of it, live,
is the acceptance suite's (tests/acceptance, test_3b). Run by tests/run.sh
(stage 5), as students, on the real local cluster."""

from __future__ import annotations

SERVE = """
import http.client, json, os, re, socket, subprocess, sys, time
import delegate
def out(**kw):
    print("RESULT: " + json.dumps(kw), flush=True)
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
port, token, base = free_port(), "t0ken", "/user/me/"
server = subprocess.Popen(
    [sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
     f"--ServerApp.base_url={base}", f"--IdentityProvider.token={token}",
     "--ServerApp.jpserver_extensions={'delegate._jupyter': True}"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=os.path.expanduser("~"))
def get(path, auth=True):
    # (no redirect followed: an anonymous request's answer is the redirect to the login)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", path, headers={"Authorization": f"token {token}"} if auth else {})
    r = c.getresponse()
    return r.status, r.read().decode(errors="replace")
for _ in range(120):
    try:
        if get(base + "api/status")[0] == 200:
            break
    except OSError:
        pass
    time.sleep(0.5)
"""


def test_a_jobs_events_are_served_to_its_student_only(alice, bob):
    res, _ = alice.result(
        SERVE
        + """
@delegate.remote(time="2m")
def train(steps):
    from tensorboardX import SummaryWriter
    w = SummaryWriter("/job/runs/train")
    for step in range(steps):
        w.add_scalar("loss", 1.0 / (step + 1), step)
    w.close()
    return steps
fut = train.submit(12)
assert fut.result() == 12
board = base + "delegate/tensorboard/" + fut.job_id + "/"
for _ in range(60):
    runs = get(board + "data/runs")
    if "runs/train" in runs[1]:
        break
    time.sleep(1)
points = get(board + "data/plugin/scalars/scalars?run=runs/train&tag=loss")
page = get(board)
# (the page's fonts: below the board, where they are served, not at the
# server's root, where a hub answers 404)
fonts = sorted(set(re.findall(r"url\\((/[^)]*\\.woff2)\\)", page[1])))
font = get(fonts[0])[0] if fonts else None
unknown = get(base + "delegate/tensorboard/20200101T000000-0badcafe/data/runs")
xsrf = get(board + "delegate-xsrf.js")
anonymous = get(board + "data/runs", auth=False)
server.terminate()
out(job=fut.job_id, runs=runs, points=len(json.loads(points[1])) if points[0] == 200 else points,
    page=[page[0], "<title>TensorBoard</title>" in page[1]], font=font,
    first_script=page[1][:80], xsrf=[xsrf[0], "X-XSRFToken" in xsrf[1] and "_xsrf=" in xsrf[1]],
    fonts_below=len(fonts) > 0 and all(f.startswith(board + "font-roboto/") for f in fonts), unknown=unknown[0], anonymous=anonymous[0],
    url=delegate.tensorboard(fut).url if os.environ.get("JUPYTERHUB_SERVICE_PREFIX") else None)
""",
        timeout=600,
        name="tensorboard-alice",
    )
    assert res["runs"] == [200, '["runs/train"]'], res
    assert res["points"] == 12, res
    assert res["page"] == [200, True], res
    assert res["fonts_below"] and res["font"] == 200, res
    # The page's first script adds the server's XSRF token to the board's
    # requests (security round 5, item 2: the route is checked as any other).
    assert res["first_script"].startswith('<!doctype html><script src="delegate-xsrf.js"></script>'), res
    assert res["xsrf"] == [200, True], res
    assert res["unknown"] == 404 and res["anonymous"] in (302, 403), res
    # Bob's own server has no board of Alice's job.
    other, _ = bob.result(
        SERVE
        + f"""
theirs = get(base + "delegate/tensorboard/{res["job"]}/data/runs")
server.terminate()
out(theirs=theirs[0], leaked="runs/train" in theirs[1])
""",
        timeout=300,
        name="tensorboard-bob",
    )
    assert other == {"theirs": 404, "leaked": False}, other


def test_the_board_address_is_below_the_students_server(alice):
    """delegate.tensorboard(job) and `delegate tensorboard ID` name the same
    address, below the hub server's base URL (JUPYTERHUB_SERVICE_PREFIX);
    outside a hub server they say where to run them instead."""
    res, _ = alice.result(
        """
import json, os, subprocess
import delegate
def out(**kw):
    print("RESULT: " + json.dumps(kw), flush=True)
fut = delegate.remote(time="1m")(lambda: 1).submit()
fut.result()
outside = subprocess.run(["delegate", "tensorboard", fut.job_id], capture_output=True, text=True)
try:
    delegate.tensorboard(fut)
    py_outside = None
except RuntimeError as e:
    py_outside = str(e)
os.environ["JUPYTERHUB_SERVICE_PREFIX"] = "/user/alice/"
cli = subprocess.run(["delegate", "tensorboard", fut.job_id], capture_output=True, text=True)
url = delegate.tensorboard(fut).url
# The job's directory swapped for a link (to her own copy of it): not a
# directory of hers as the board opens it.
d = delegate._core.job_dir(fut.job_id)
os.rename(d, d + ".moved")
os.symlink(d + ".moved", d)
linked = subprocess.run(["delegate", "tensorboard", fut.job_id], capture_output=True, text=True)
try:
    delegate.tensorboard(fut)
    py_linked = None
except delegate.NoSuchJobError as e:
    py_linked = str(e)
out(job=fut.job_id, url=url, cli=cli.stdout, cli_rc=cli.returncode,
    outside=[outside.returncode, outside.stderr], py_outside=py_outside,
    linked=[linked.returncode, linked.stderr], py_linked=py_linked)
"""
    )
    url = f"/user/alice/delegate/tensorboard/{res['job']}/"
    assert res["url"] == url, res
    assert res["cli"].startswith(f"TensorBoard of job {res['job']}: {url}") and res["cli_rc"] == 0, res
    assert res["outside"][0] == 1 and "JUPYTERHUB_SERVICE_PREFIX is not set" in res["outside"][1], res
    assert "JUPYTERHUB_SERVICE_PREFIX is not set" in (res["py_outside"] or ""), res
    assert res["linked"][0] == 1 and f"no job {res['job']} of yours" in res["linked"][1], res
    assert res["py_linked"] and f"no job {res['job']} of yours" in res["py_linked"], res
