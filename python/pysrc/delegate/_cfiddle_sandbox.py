"""The half of ``delegate.cfiddle`` that runs in the sandbox.

It travels by value with each call (``delegate.cfiddle`` registers this
module with ``cloudpickle.register_pickle_by_value``): the sandbox has
CFiddle (python/requirements-cfiddle.txt) but not the ``delegate`` package.
So this module imports nothing but the standard library at module level,
and CFiddle only inside ``run``.

``run`` writes the executables the caller sent under ``/job/cfiddle`` (the
job directory, the one mount of the sandbox), then runs CFiddle's own runner
(``cfiddle-run --runner ... --results ...``) on them in a child process, as
CFiddle does locally: a crash (a segfault) in a measured function kills the
child, not this executor, and is reported with its exit status and output.
"""

from __future__ import annotations

from typing import Any

# Where the caller's files go inside the sandbox; the paths in the runner
# pickle the caller made point here.
ROOT = "/job/cfiddle"
# How much of the runner's stdout/stderr comes back with a failure.
TAIL = 16 * 1024
# cfiddle-run without its console script: the same click command.
BOOT = "import sys; from cfiddle.Runner import invoke_runner; invoke_runner(prog_name='cfiddle-run')"


def _tail(data: bytes) -> str:
    return data[-TAIL:].decode("utf-8", "replace")


def installed_version() -> str | None:
    """CFiddle's version in this Python, or None when it is not installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version("cfiddle")
    except importlib.metadata.PackageNotFoundError:
        return None


def mismatch(caller: str, here: str | None) -> str | None:
    """A message naming both sides' CFiddle versions, or None when equal."""
    if here is None:
        return (
            "version mismatch: cfiddle %s on the caller's side but no cfiddle in the sandbox image "
            "(install python/requirements-cfiddle.txt into the image)" % caller
        )
    if here != caller:
        return (
            "version mismatch: cfiddle %s on the caller's side but cfiddle %s in the sandbox "
            "(the versions must be equal: both sides install python/requirements-cfiddle.txt)"
            % (caller, here)
        )
    return None


def _write(rel: str, data: bytes) -> str:
    import os

    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("refusing the file name %r" % rel)
    path = os.path.join(ROOT, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def merge_repeats(runs: list[Any]) -> list[Any]:
    """The results of several runs of one runner as one: each invocation's
    rows from every run, each row with its ``repeat`` (0, 1, ...)."""
    merged = runs[0]
    for j, inv in enumerate(merged):
        rows = []
        for k, results in enumerate(runs):
            for row in getattr(results[j], "results", None) or []:
                if isinstance(row, dict):
                    row = dict(row, repeat=k)
                rows.append(row)
        if hasattr(inv, "results"):
            inv.results = rows
    return merged


def run(
    files: dict[str, bytes], runner: bytes, caller_version: str, repeat: int = 1, warmup: int = 0
) -> tuple[Any, ...]:
    """Runs one CFiddle runner pickle ``warmup`` times unmeasured, then
    ``repeat`` times, in this sandbox on its cores. Returns ``("ok", results
    pickle)`` (several runs merged: each row with its ``repeat``),
    ``("crashed", exit code, stdout, stderr)`` when cfiddle-run failed, or
    ``("version-mismatch", message)``."""
    import os
    import pickle
    import subprocess
    import sys
    import warnings

    problem = mismatch(caller_version, installed_version())
    if problem:
        return ("version-mismatch", problem)
    for rel, data in files.items():
        _write(rel, data)
    runner_path = _write("run/runner.pickle", runner)
    results_path = os.path.join(ROOT, "run", "results.pickle")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cfiddle.paths  # type: ignore[import-untyped]

    # The dynamic loader reads LD_LIBRARY_PATH when a process starts: the
    # child finds libcfiddle.so (which the executables link) through it.
    env = dict(os.environ)
    lib = cfiddle.paths.cfiddle_lib_path()
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join(paths + ([lib] if lib not in paths else []))
    runs = []
    for k in range(warmup + repeat):
        proc = subprocess.run(
            [sys.executable, "-c", BOOT, "--runner", runner_path, "--results", results_path],
            capture_output=True,
            env=env,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            return ("crashed", proc.returncode, _tail(proc.stdout), _tail(proc.stderr))
        with open(results_path, "rb") as f:
            data = f.read()
        if repeat == 1 and warmup == 0:
            return ("ok", data)
        if k >= warmup:
            runs.append(pickle.loads(data))
    if any(isinstance(r, BaseException) for r in runs):
        # CFiddle's own error (pickled as the results): the first one.
        return ("ok", pickle.dumps(next(r for r in runs if isinstance(r, BaseException))))
    return ("ok", pickle.dumps(merge_repeats(runs)))
