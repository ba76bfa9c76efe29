"""``delegate submit --repeat N [--warmup K] -- CMD``, the sandbox side:
``python3 -m delegate_sandbox.repeat --repeat N --warmup K -- CMD ARGS...``
runs the command K times unmeasured, then N times measured (wall time of
each run, ``time.perf_counter`` around the process), all in this sandbox on
the same cores. Writes ``/job/repeats`` (JSON: warmup, seconds, summary) and
prints the summary on stderr. Stops at the first run that fails, with its
exit code. Standard library only; Python 3.9."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from delegate_sandbox.measure import Stats

#: Where the runs' figures go (the job directory; `delegate result` shows them).
REPEATS_FILE = "/job/repeats"


def _args(argv):
    repeat, warmup, i = None, 0, 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] in ("--repeat", "--warmup") and i + 1 < len(argv) and argv[i + 1].isdigit():
            if argv[i] == "--repeat":
                repeat = int(argv[i + 1])
            else:
                warmup = int(argv[i + 1])
            i += 2
            continue
        raise SystemExit("usage: python3 -m delegate_sandbox.repeat --repeat N [--warmup K] -- CMD ARGS...")
    cmd = argv[i + 1 :]
    if not repeat or repeat < 1 or not cmd:
        raise SystemExit("usage: python3 -m delegate_sandbox.repeat --repeat N [--warmup K] -- CMD ARGS...")
    return repeat, warmup, cmd


def summary(stats: Stats, warmup: int) -> str:
    """One line: the statistics, the warm-up, the warning when there is one."""
    line = "delegate: %r after %d warm-up run(s)" % (stats, warmup)
    return line + ("; WARNING: " + stats.warning if stats.warning else "")


def main(argv=None, out_file: str = REPEATS_FILE) -> int:
    repeat, warmup, cmd = _args(list(sys.argv[1:] if argv is None else argv))
    for _ in range(warmup):
        rc = subprocess.call(cmd)
        if rc != 0:
            print("delegate: a warm-up run exited with %d; no measured run" % rc, file=sys.stderr)
            return rc
    seconds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        seconds.append(time.perf_counter() - t0)
        if rc != 0:
            print("delegate: run %d of %d exited with %d" % (len(seconds), repeat, rc), file=sys.stderr)
            return rc
    stats = Stats(seconds)
    line = summary(stats, warmup)
    tmp = out_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"warmup": warmup, "seconds": seconds, "summary": line}, f)
    os.replace(tmp, out_file)
    print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
