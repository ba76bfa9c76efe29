"""A per-student limit of Slurm's accounting, met from Python: the
submission raises delegate.SubmitError whose message is the one sentence
naming the limit and what to do (never Slurm's raw text), and nothing is
left behind. Fails when the local cluster keeps no accounting (slurmdbd)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Student

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import testlib

USER = "delegate-carol"


@pytest.fixture(autouse=True)
def _accounting():
    """slurmdbd and MariaDB start here: no accounting is a broken setup."""
    testlib.require_accounting()


@pytest.fixture
def carol():
    with testlib.tight_qos(USER):
        s = Student(USER)
        yield s
        s.cleanup()


def test_a_limit_is_one_sentence_in_python(carol):
    before = set(carol.root.iterdir()) if carol.root.is_dir() else set()
    res, _ = carol.result(
        """
        import json, os, delegate

        @delegate.remote(time="1m")
        def f(x):
            return x

        first = f.submit(1)          # takes the one job carol may have
        try:
            f.submit(2)
            out = {"raised": None}
        except delegate.SubmitError as e:
            out = {"raised": type(e).__name__, "msg": str(e)}
        first.cancel()
        print("RESULT: " + json.dumps(out))
        """
    )
    assert res["raised"] == "SubmitError", res
    msg = res["msg"]
    assert "MaxSubmitJobsPerUser" in msg and "wait for some to finish" in msg, msg
    assert "QOSMax" not in msg and "violates" not in msg and "\n" not in msg, msg
    after = set(carol.root.iterdir()) if carol.root.is_dir() else set()
    # Only the first call's job directory (and its log) are new.
    new_dirs = [p for p in after - before if p.is_dir()]
    assert len(new_dirs) == 1, new_dirs


@pytest.fixture
def flooder():
    with testlib.tight_qos(USER, max_submit=3):
        s = Student(USER)
        yield s
        s.cleanup()


def test_a_dask_flood_past_the_limit_stops_at_it_and_leaves_nothing(flooder):
    """Security round 5, item 3b: a Dask graph of 40 independent tasks, all
    ready at once and all handed to delegate.Executor (num_workers=40), by a
    student who may have 3 jobs queued or running. Slurm's limit holds (3
    calls submitted, never more), dask.compute raises the one sentence
    naming the limit, the calls already submitted finish when the `with`
    block ends, and nothing of the student's is left: no job in Slurm's
    queue, no container, every job directory with its outcome."""
    res, _ = flooder.result(
        """
        import json, os, dask, delegate

        @dask.delayed
        def sq(x):
            return x * x

        root = os.path.expanduser("~/.delegate/jobs")
        before = set(os.listdir(root)) if os.path.isdir(root) else set()
        out = {"raised": None}
        try:
            with dask.config.set(num_workers=40):
                with delegate.Executor(time="1m") as ex:
                    dask.compute(*[sq(i) for i in range(40)], scheduler=ex)
        except delegate.SubmitError as e:
            out = {"raised": type(e).__name__, "msg": str(e)}
        mine = [n for n in set(os.listdir(root)) - before if os.path.isdir(os.path.join(root, n))]
        out["states"] = sorted(r["state"] for r in delegate.jobs() if r["id"] in mine)
        print("RESULT: " + json.dumps(out))
        """,
        timeout=600,
    )
    assert res["raised"] == "SubmitError", res
    assert "MaxSubmitJobsPerUser" in res["msg"] and "\n" not in res["msg"], res
    # (the three Dask submitted before the limit, each done once the `with`
    # block ended: none pending, none lost)
    assert res["states"] == ["completed"] * 3, res

    def queued() -> str:
        r = subprocess.run(
            ["squeue", "-h", "-u", USER, "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return r.stdout.strip()

    # (the last call's epilog may still be running: COMPLETING)
    testlib.wait_until("no job of the flooder in Slurm's queue", lambda: queued() == "", 60, 1, detail=queued)
    assert testlib.containers_of_user(USER) == [], "a container of the flood is left"
