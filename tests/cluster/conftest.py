"""What the stack suites share: one deployment of the single-machine
stack of two workers, and the order the suites run in.

A deploy and a `down` cost minutes each, so the suites that need the plain
stack of two workers (test_hub, test_ranks, test_stack,
test_stack_accounting) share one, deployed the first time one of them asks
and taken down by test_stack's `test_down_leaves_nothing_behind`, the last
test of the stage (and here, whatever happened). The suites with a stack
of their own run first: test_machines (the worker machines join this
host's swarm, which must not hold a stack yet), then test_elastic (workers
that power up on demand).
"""

from __future__ import annotations

import os

import pytest

from stacklib import HUB_STUDENT_MEM, deployed, require_root

# The suites in the order they run; the shared stack's suites last.
ORDER = (
    "test_machines.py",
    "test_elastic.py",
    "test_hub.py",
    "test_ranks.py",
    "test_stack.py",
    "test_stack_accounting.py",
)
LAST = "test_down_leaves_nothing_behind"


def pytest_sessionstart(session):
    require_root()


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(ORDER)}
    # (a stable sort: each suite's own order is kept)
    items.sort(key=lambda it: (it.name == LAST, rank.get(it.path.name, len(ORDER))))


@pytest.fixture(scope="session")
def course_stack():
    """The stack of two workers, deployed once for the suites that share it,
    with the hub's per-student memory (test_hub reads it back)."""
    env = {**os.environ, "DELEGATE_HUB_STUDENT_MEM": str(HUB_STUDENT_MEM)}
    with deployed("--workers", "2", env=env) as r:
        yield r
