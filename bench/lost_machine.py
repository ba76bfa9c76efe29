"""A worker machine lost mid-call (issue 52): how long until its call runs
again elsewhere and returns, against Slurm's own detection time
(`SlurmdTimeout`) in the same run; then how long the machine, powered on
again, takes to rejoin the course by itself.

    bench/lost_machine.py [--rounds N] [--out FILE]

Run as root on this host: it brings up the emulated worker machines
(tests/machines: m1 and m2, each its own Docker engine, the home over
GlusterFS), joins them and deploys the stack with placement, exactly as
tests/cluster/test_machines.py does, then per round:

1. two calls of 20 s from the student (one on each machine: exclusive
   nodes); once each machine's engine runs one sandbox, m1 is killed hard
   (`docker kill` of the machine: its kernel, engine, worker and home
   client gone at once, a pulled power cord);
2. it watches, once a second: Slurm setting worker1 down (detection),
   the call that was on m1 starting again elsewhere (its new attempt's
   `started`), and its result;
3. m1 is started again (powered on, no other command) and it watches
   until Slurm has worker1 idle and a call runs there again.

Prints each figure and its ratio to SlurmdTimeout, and writes them as JSON
(default bench/results/lost_machine.json). Benchmarks print figures;
nothing asserts on time, and this is not part of tests/run.sh.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))

from stacklib import HOME, STUDENT, deployed, machine_docker, on, wait_until, worker_machines  # noqa: E402


def slurm_setting(name: str) -> str:
    conf = on("head", "scontrol", "show", "config", quiet=True).stdout
    line = next(ln for ln in conf.splitlines() if ln.startswith(name))
    return line.split("=", 1)[1].strip()


def seconds(setting: str) -> int:
    """`60 sec`, or `cred_expire=30` in AuthInfo's list, as seconds."""
    m = re.search(r"(?:cred_expire=)?(\d+)", setting)
    return int(m.group(1)) if m else 0


def worker_state(worker: str) -> str:
    return on("head", "sinfo", "-h", "-n", worker, "-o", "%T", quiet=True).stdout.strip()


def sandboxes(m: str) -> int:
    r = machine_docker("exec", m, "docker", "ps", "-q", "--filter", "label=delegate.slurm-job", quiet=True)
    return len(r.stdout.split())


def status(ids: list[str]) -> list[dict]:
    st = json.loads(on("user", "delegate", "--json", "status", *ids, user=STUDENT, quiet=True).stdout)
    return st if isinstance(st, list) else [st]


def job_file(job: str, name: str) -> Path:
    return Path(HOME) / STUDENT / ".delegate" / "jobs" / job / name


def one_round() -> dict:
    r = on(
        "user", "delegate", "submit", "--time", "5m", "--count", "2", "--",
        "sh", "-c", "sleep 20; hostname", user=STUDENT,
    )  # fmt: skip
    ids = r.stdout.split()
    wait_until("a sandbox on each machine", lambda: sandboxes("m1") == 1 and sandboxes("m2") == 1, 180, 0.5)
    on_m1 = [j["id"] for j in status(ids) if j.get("host") == "worker1"]
    t0 = time.monotonic()
    machine_docker("kill", "m1")
    marks: dict[str, float] = {}
    while "result" not in marks:
        now = time.monotonic() - t0
        if "detected" not in marks and worker_state("worker1").startswith("down"):
            marks["detected"] = now
        st = status(on_m1)[0] if on_m1 else {}
        if "rerun" not in marks and job_file(on_m1[0], "attempts").exists() and st.get("state") == "running":
            marks["rerun"] = now
        if st.get("state") == "completed":
            marks["result"] = now
            marks.setdefault("rerun", now)
        if now > 900:
            raise SystemExit(f"the lost call did not come back within 900 s: {st}")
        time.sleep(1)
    t1 = time.monotonic()
    machine_docker("start", "m1", timeout=120)
    wait_until("worker1 idle again", lambda: worker_state("worker1") == "idle", 900, 1)
    marks["rejoined"] = time.monotonic() - t1
    return {"call": on_m1[0], "reason": status(on_m1)[0]["reason"], **marks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "lost_machine.json"))
    a = ap.parse_args()
    with worker_machines() as (env, _), deployed(env=env):
        timeout = seconds(slurm_setting("SlurmdTimeout"))
        requeue = seconds(slurm_setting("AuthInfo"))
        rounds = [one_round() for _ in range(a.rounds)]
    print(
        f"SlurmdTimeout {timeout} s (slurm.conf); a requeued job is eligible after cred_expire, {requeue} s"
    )
    for i, r in enumerate(rounds, 1):
        print(
            f"round {i}: detected {r['detected']:.0f} s ({r['detected'] / timeout:.2f}x SlurmdTimeout), "
            f"ran again {r['rerun']:.0f} s ({r['rerun'] / timeout:.2f}x), "
            f"result {r['result']:.0f} s ({r['result'] / timeout:.2f}x); "
            f"powered on, rejoined in {r['rejoined']:.0f} s"
        )
        print(f"  {r['reason']}")
    Path(a.out).write_text(json.dumps({"slurmd_timeout_s": timeout, "rounds": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
