"""A future's words before and while its call runs again (no cluster
needed): what the notebook's live line says."""

from __future__ import annotations

from delegate._futures import DelegateFuture


def future(reason: str, state: str = "pending") -> DelegateFuture:
    f = DelegateFuture("20261128T000000-%08x" % (hash(reason) & 0xFFFFFFFF))
    f._status = dict(f._status, state=state, reason=reason)
    return f


def test_a_new_future_has_the_keys_a_student_reads():
    """A cell that waits for its call to start reads status["started"]
    before the waiter's first answer."""
    st = DelegateFuture("20261128T000000-00000001").status
    assert st["started"] is None and st["host"] is None and st["state"] == "pending"


def test_a_call_whose_node_was_lost_says_whether_it_runs_again():
    """Issue 52: with retries left the line says it runs again; spent, that
    it ends lost (not that it runs again)."""
    lost = "its node worker2 was lost: Slurm queued it again (PENDING, BeginTime)"
    again = future(lost + "; a new attempt runs it afresh")
    assert again.outcome == "pending — its node worker2 was lost, it runs again"
    spent = future(lost + "; its retries are spent: it ends lost when Slurm starts it again")
    assert spent.outcome == (
        "pending — its node worker2 was lost; its retries are spent: it ends lost when a node takes it"
    )
    # (its last attempt lost, and Slurm starting it again on a machine that
    # came back: the start that ends it lost, never "running on worker1")
    restarted = future(
        "its node worker2 was lost: Slurm started it again on worker1; its retries are spent: it ends lost there"
    )
    assert restarted.outcome == spent.outcome


def test_a_waiting_call_says_when_it_likely_starts():
    """Issue 56: Slurm's estimate of a waiting call's start, in the line."""
    soon = future(
        "waiting in Slurm's queue (Resources); likely to start within 3 min "
        "(Slurm's estimate from the time limits of the jobs ahead)"
    )
    assert soon.outcome == "pending — likely to start within 3 min"
    none = future(
        "waiting in Slurm's queue (Priority); no estimate of its start yet (Slurm's scheduler has not placed it)"
    )
    assert none.outcome == "pending — no estimate of its start yet"


def test_a_waiting_call_says_how_many_jobs_are_ahead():
    """Issue 56: the place helper's count of the jobs ahead, in the line."""
    ahead = future(
        "waiting in Slurm's queue (Priority), 37 jobs ahead; likely to start within 3 min "
        "(Slurm's estimate from the time limits of the jobs ahead)"
    )
    assert ahead.outcome == "pending — 37 jobs ahead, likely to start within 3 min"
    helpers = future(
        "waiting in Slurm's queue (Priority), 12 jobs ahead; likely to start in about 7 min "
        "(from the running calls and how long calls lasted lately)"
    )
    assert helpers.outcome == "pending — 12 jobs ahead, likely to start in about 7 min"
    first = future("waiting in Slurm's queue (Resources), next in line; no estimate of its start yet (...)")
    assert first.outcome == "pending — next in line, no estimate of its start yet"
    one = future("waiting in Slurm's queue, 1 job ahead; cancellation requested")
    assert one.outcome == "pending — 1 job ahead"
    # Submitted after the helper's last read: its place comes (not Slurm's
    # latest start, hours off in a rush).
    coming = future(
        "waiting in Slurm's queue (Priority); its place in line comes within seconds "
        "(the queue is read every few seconds)"
    )
    assert coming.outcome == "pending — its place in line comes within seconds"
