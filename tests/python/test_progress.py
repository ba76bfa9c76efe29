"""States in the user's words on the real cluster, and the job listings.
A call whose function raised says ``raised ZeroDivisionError`` (its job
completed); a refused, timed-out or cancelled call says so with the reason,
in ``fut.outcome``, in ``delegate.jobs()`` and (the job's state and reason)
in ``delegate list``, whose rows name the Python function and the node."""

from __future__ import annotations

import json
import subprocess

SCRIPT = """
import json, time
import delegate

def divide(x):
    return x / 0

# Job ids name the second of their submission; a job of the previous test
# made in the same second would sort among these three (see the notes):
# start in a fresh second.
time.sleep(1.05 - time.time() % 1)
ex = delegate.Executor(time="1m")
raised = ex.submit(divide, 1)
refused = delegate.Executor(image="evil/miner:latest", time="1m").submit(len, "abc")
slow = delegate.Executor(time="3s").submit(time.sleep, 60)
for f in (raised, refused, slow):
    try:
        f.result(240)
    except Exception:
        pass
table = delegate.jobs(3)
print("RESULT: " + json.dumps({
    "outcomes": [raised.outcome, refused.outcome, slow.outcome],
    "states": [raised.state, refused.state, slow.state],
    "ids": [raised.job_id, refused.job_id, slow.job_id],
    "text": str(table),
    "html": table._repr_html_(),
}))
"""


def test_states_in_the_users_words_and_the_listings(alice):
    res, proc = alice.result(SCRIPT, timeout=400, name="states")
    raised, refused, slow = res["outcomes"]
    assert res["states"] == ["completed", "failed", "timed-out"], res
    assert raised == "raised ZeroDivisionError", res
    assert refused.startswith("refused: ") and "not allowed" in refused, res
    assert slow.startswith("timed out: ") and "3s" in slow, res
    assert "\r" not in proc.stderr, "no progress line when stderr is not a terminal"

    text = res["text"]
    for part in ("FUNCTION OR COMMAND", "NODE", "ELAPSED", "SUBMITTED", "divide()", "len()", "sleep()"):
        assert part in text, (part, text)
    assert "raised ZeroDivisionError" in text and "refused: " in text and "timed out: " in text, text
    assert res["html"].count("<tr>") == 4, res["html"]

    r = subprocess.run(
        alice.argv("delegate", "list", "--json"),
        capture_output=True,
        text=True,
        timeout=120,
        env=alice.env(),
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    rows = {j["id"]: j for j in json.loads(r.stdout)}
    mine = [rows[i] for i in res["ids"]]
    assert [j["what"] for j in mine] == ["divide()", "len()", "sleep()"], mine
    assert [j["state"] for j in mine] == ["completed", "failed", "timed-out"], mine
    assert mine[0]["host"], "the node that ran the call: %r" % mine[0]

    r = subprocess.run(
        alice.argv("delegate", "list"),
        capture_output=True,
        text=True,
        timeout=120,
        env=alice.env(),
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.split() == ["ID", "FUNCTION/COMMAND", "STATE", "NODE", "ELAPSED", "SUBMITTED", "REASON"], (
        header
    )
    (line,) = [ln for ln in lines if ln.startswith(res["ids"][1])]
    assert "len()" in line and "failed" in line and "not allowed" in line and "ago" in line, line
    assert "\x1b[" not in r.stdout, "no colours when stdout is not a terminal"
