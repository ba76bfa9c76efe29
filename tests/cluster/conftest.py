"""What the stack suites share: one deployment of the single-machine
stack of two workers, and the order the suites run in.

A deploy and a `down` cost minutes each, so the suites that need the plain
stack of two workers (test_hub, test_ranks, test_stack,
test_stack_accounting, test_rush) share one, deployed the first time one
of them asks (the hub's roster and the rush's accounts enrolled before it,
its per-student memory set) and
taken down by test_stack's `test_down_leaves_nothing_behind`, the last test
of the stage (and here, whatever happened); the roster's accounts are
removed once it is down (a change of the roster redeploys a running
stack). The suites with a stack
of their own run first: test_machines (the worker machines join this
host's swarm, which must not hold a stack yet), then test_elastic (workers
that power up on demand). tests/run.sh runs test_machines as a stage of
its own (7b: it restarts this host's engine), after the others, which run
beside the single-machine stages (its side lane).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

from stacklib import (
    HUB_ADA,
    HUB_BOB,
    HUB_IVY,
    HUB_ROSTER,
    HUB_STUDENT_MEM,
    RUSH_FLOODER,
    RUSH_STUDENTS,
    SCRIPT,
    STACK_DIR,
    deployed,
    require_root,
    run,
)

# The suites in the order they run; the shared stack's suites last.
ORDER = (
    "test_machines.py",
    "test_elastic.py",
    "test_hub.py",
    "test_ranks.py",
    "test_stack.py",
    "test_stack_accounting.py",
    "test_rush.py",
)
LAST = "test_down_leaves_nothing_behind"


def pytest_sessionstart(session):
    require_root()


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(ORDER)}
    # (a stable sort: each suite's own order is kept)
    items.sort(key=lambda it: (it.name == LAST, rank.get(it.path.name, len(ORDER))))


class CourseStack(NamedTuple):
    deploy: object
    # The roster file enrolled before the deploy.
    roster: Path


@pytest.fixture(scope="session")
def course_stack(tmp_path_factory):
    """The stack of two workers, deployed once for the suites that share it,
    the hub's roster enrolled first, with the hub's per-student memory
    (test_hub reads it back; every command of the stage sees it, so that a
    redeploy keeps it)."""
    os.environ["DELEGATE_HUB_STUDENT_MEM"] = str(HUB_STUDENT_MEM)
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text(HUB_ROSTER)
    try:
        run(SCRIPT, "--stack", "accounts", "add", "--csv", str(roster), check=True)
        with deployed("--workers", "2") as r:
            yield CourseStack(r, roster)
    finally:
        for u in (HUB_ADA, HUB_BOB, HUB_IVY, *RUSH_STUDENTS, RUSH_FLOODER):
            run(SCRIPT, "--stack", "accounts", "remove", u, "--archive")
            for f in (STACK_DIR / "archive").glob(f"{u}-*.tar.gz"):
                f.unlink()
