"""Cold start of elastic workers (issue 17, docs/elastic.md): a map of N
calls submitted while every worker is powered down; prints the time from
submit to the first result and to the last, and where each call ran.

Runs on the stack's user node as a student (the delegate package of the
user image):
    python3 - [N] < bench/cold_start.py
bench/cold_start.sh deploys an elastic stack, waits until its workers are
powered down and runs this; tests/cluster/test_elastic.py runs it too. The
last line of output is one JSON object:
    {"calls": N, "first_s": ..., "all_s": ..., "hosts": [...], "results": [...]}
"""

import json
import sys
import time

import delegate


def stamp(i):
    import socket

    return i, socket.gethostname()


def main(n: int) -> None:
    t0 = time.monotonic()
    with delegate.Executor(cpus=1, time="5m") as ex:
        # One map: one job array (workers are started for its allocations).
        it = ex.map(stamp, range(n), timeout=900)
        results = [next(it)]
        first = time.monotonic() - t0
        print(f"cold start: first result {first:.1f} s after submit", flush=True)
        results += list(it)
        total = time.monotonic() - t0
        hosts = sorted({str(f.status.get("host")) for f in ex._futures})
    print(f"cold start: all {n} results {total:.1f} s after submit, on {', '.join(hosts)}", flush=True)
    print(
        json.dumps(
            {
                "calls": n,
                "first_s": round(first or 0, 1),
                "all_s": round(total, 1),
                "hosts": hosts,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
