"""A per-student limit of Slurm's accounting, met from Python: the
submission raises delegate.SubmitError whose message is the one sentence
naming the limit and what to do (never Slurm's raw text), and nothing is
left behind. Fails when the local cluster keeps no accounting (slurmdbd)."""

from __future__ import annotations

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
