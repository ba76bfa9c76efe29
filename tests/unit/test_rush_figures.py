"""bench/rush.py's figures that are arithmetic, without a stack: the
drain's floor when a machine is lost mid-rush, and the count of calls that
ran again. The benchmark itself runs on the stack (bench/rush.sh) and its
short form in CI (tests/cluster/test_rush.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("rush", REPO / "bench" / "rush.py")
rush = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rush)


def test_the_floor_without_a_loss_is_the_work_over_the_workers():
    assert rush.work_floor(100.0, 4, 0.0, None) == 25.0


def test_a_machine_lost_after_the_work_could_end_changes_nothing():
    assert rush.work_floor(100.0, 4, 1000.0, 1030.0) == 25.0


def test_a_machine_lost_midway_leaves_the_rest_to_one_worker_fewer():
    # 2 workers, 100 s of work, one lost 20 s in: 40 s done by both, the
    # other 60 s by the one left.
    assert rush.work_floor(100.0, 2, 1000.0, 1020.0) == 20.0 + 60.0


def test_a_lost_machine_counts_the_calls_that_ran_again():
    def call(token, reason, state="completed"):
        return {
            "id": token,
            "state": state,
            "got": token,
            "want": token,
            "reason": reason,
            "started_ms": 1000,
            "finished_ms": 2000,
            "submitted_ms": 500,
        }

    data = {
        "meta": {
            "phase": "rush",
            "workers": 2,
            "rpc": [[0.0, 0], [10.0, 5]],
            "problems": [],
            "students": 1,
            "flooder": "",
            "allocations": [],
            "lifecycle_s": float("nan"),
            "killed": {"machine": "m1", "worker": "worker1", "at": 1.5},
        },
        "students": [
            {
                "kind": "student",
                "token": "a",
                "first_submit_ms": 500,
                "calls": [
                    call("a1", "completed"),
                    call("a2", "ran again on worker2 (attempt 2): worker1 was lost"),
                ],
            },
        ],
    }
    s = rush.summarize(data)
    assert s["calls_ok"] == 2 and s["ran_again"] == 1, s
    assert s["machine_killed"]["machine"] == "m1"
    assert s["ran_again_reasons"] == ["ran again on worker2 (attempt 2): worker1 was lost"]


def test_the_timeline_counts_waiting_allocations_and_busy_nodes():
    # (sacct: id, submit, start, end, node list; an allocation not started yet)
    allocs = [
        ["1", "100", "100", "110", "w1"],
        ["2", "100", "105", "120", "w2"],
        ["3", "102", "Unknown", "Unknown", ""],
    ]
    assert rush.timeline(allocs, 100.0, 115.0, 5) == [[0.0, 1, 1], [5.0, 1, 2], [10.0, 1, 1]]


def test_an_allocation_requeued_between_two_runs_waits_between_them():
    # (sacct --duplicates: allocation 1 ran on w1, stepped aside at 110 and
    # ran again from 120 on w2; 2 took w1 from 112)
    allocs = [
        ["1", "100", "100", "110", "w1"],
        ["1", "100", "120", "130", "w2"],
        ["2", "105", "112", "125", "w1"],
    ]
    assert rush.timeline(allocs, 100.0, 135.0, 5) == [
        [0.0, 0, 1],  # 1 runs on w1
        [5.0, 1, 1],  # 2 waits
        [10.0, 2, 0],  # 1 stepped aside, waits again; 2 not started yet
        [15.0, 1, 1],  # 2 on w1, 1 waits for its second run
        [20.0, 0, 2],  # both run
        [25.0, 0, 1],
        [30.0, 0, 0],
    ]
    # Two workers, idle while work waited: from 105 to 110 (w2 idle, 2
    # waiting), 110 to 112 (both idle, both waiting) and 112 to 120 (w2
    # idle, 1 waiting), in node-seconds.
    assert rush.idle_while_waiting(allocs, 2, 100.0, 135.0) == 5 * 1 + 2 * 2 + 8 * 1


def test_a_lost_worker_is_neither_idle_nor_busy_from_its_loss():
    # (w1's machine dies at 110: Slurm still counts allocation 1 running
    # there until 120; allocation 2 waits from 105 and runs on w2 from 115)
    allocs = [
        ["1", "100", "100", "120", "w1"],
        ["2", "105", "115", "130", "w2"],
        ["3", "112", "Unknown", "Unknown", ""],
    ]
    # Without the loss: w2 idle while work waits (105-115), and w1 once
    # Slurm gave it up (120-130) while 3 waits.
    assert rush.idle_while_waiting(allocs, 2, 100.0, 130.0) == 20
    # With it: one worker from 110, w2, idle while 2 waits until 115;
    # from 115 it runs 2 and 3 waits with no idle node: the dead w1 is no
    # idle node.
    assert rush.idle_while_waiting(allocs, 2, 100.0, 130.0, ("w1", 110.0)) == 10


def test_an_estimate_is_measured_against_the_jobs_first_start():
    # A map's allocation estimated to start at 110 started at 112, stepped
    # aside and started again at 200 (sacct's one record says 200).
    allocs = [["7", "100", "200", "230", "w1"]]
    seen = {"7": [100.0, 110]}
    assert rush.estimate_errors(seen, allocs)["estimate_signed_err_p50"] == 90
    assert rush.estimate_errors(seen, allocs, "", {"7": 112})["estimate_signed_err_p50"] == 2
