"""Local mode: each call runs in a fresh local subprocess, with no cluster.

``delegate.Executor(backend="local")``, ``@delegate.remote(backend="local")``
or ``DELEGATE_BACKEND=local`` in the environment (which switches a whole
notebook) run each call as ``python -m delegate_sandbox <job-dir>``: the
same payload file, the same executor and the same result file as in the
sandbox, so pickling problems, exceptions and the printed output behave as
on the cluster. The job directories are private temporary directories,
removed when the process exits.

NOT A SANDBOX: the call runs as you, on this machine, with your files and
the network. Only the time limit is enforced (``time=``); ``cpus`` and
``mem`` are not. At most ``DELEGATE_LOCAL_WORKERS`` (default: the number of
CPUs) calls run at once.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import delegate_sandbox as fmt  # type: ignore[import-untyped]
from delegate import _core
from delegate._errors import NoSuchJobError
from delegate._futures import DelegateFuture, mark_cancelled, watch

ENV_WORKERS = "DELEGATE_LOCAL_WORKERS"
#: Time limit when none is given (the cluster's default).
DEFAULT_TIME = 600


class _Runner:
    """The local jobs of this process: their directories and a bound on how
    many run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.root: str | None = None
        self.jobs: dict[str, LocalFuture] = {}
        self.slots: threading.Semaphore | None = None

    def job_dir(self, job_id: str) -> str:
        with self.lock:
            if self.root is None:
                self.root = tempfile.mkdtemp(prefix="delegate-local-")
                atexit.register(shutil.rmtree, self.root, True)
                workers = os.environ.get(ENV_WORKERS, "")
                n = int(workers) if workers.isdigit() and int(workers) > 0 else (os.cpu_count() or 1)
                self.slots = threading.Semaphore(n)
            d = os.path.join(self.root, job_id)
        os.mkdir(d, 0o700)
        return d


RUNNER = _Runner()


def new_id() -> str:
    """A local job id: ``local-`` + time + random, like the cluster's."""
    return "local-%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), uuid.uuid4().hex[:6])


class LocalFuture(DelegateFuture):
    """A ``DelegateFuture`` of a call run in a local subprocess (not
    sandboxed)."""

    def __init__(self, job_id: str, label: str, directory: str, time_limit: int, env: dict):
        super().__init__(job_id, label)
        self.directory = directory
        self._time_limit = time_limit
        self._env = env
        self._proc: subprocess.Popen | None = None
        self._cancel = threading.Event()
        now = time.time()
        self._status = {
            "id": job_id,
            "slurm_id": None,
            "state": "pending",
            "reason": "waiting for a free local slot",
            "exit_code": None,
            "refused": False,
            "oom_killed": False,
            "host": None,
            "submitted": now,
            "started": None,
            "finished": None,
            "elapsed": None,
            "what": label.split(" [", 1)[0] + "()",
        }

    def _read(self, name, limit):
        path = os.path.join(self.directory, name)
        try:
            with open(path, "rb") as f:
                return f.read(limit if name != _core.RESULT else _core.MAX_RESULT_BYTES)
        except FileNotFoundError:
            return None

    @property
    def fingerprint(self) -> dict | None:
        """None: a local call has no worker to record its machine."""
        return None

    def cancel(self) -> bool:
        if self.done():
            return self.cancelled()
        self._cancel.set()
        proc = self._proc
        if proc is not None:
            _kill(proc)  # _wait records the end
            return mark_cancelled(self)
        ok = mark_cancelled(self)
        self._status = dict(self._status, state="cancelled", reason="cancelled before it started")
        self._status["finished"] = time.time()
        return ok

    def _run(self) -> None:
        slots = RUNNER.slots
        assert slots is not None
        with slots:
            if self._cancel.is_set():
                return
            self._start()
            self._wait()

    def _start(self) -> None:
        st = dict(
            self._status, state="running", reason="running locally on %s" % socket.gethostname(), host="local"
        )
        st["started"] = time.time()
        env = dict(os.environ)
        env.update(self._env)
        env["PYTHONUNBUFFERED"] = "1"
        with (
            open(os.path.join(self.directory, _core.STDOUT), "wb") as out,
            open(os.path.join(self.directory, _core.STDERR), "wb") as err,
        ):
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "delegate_sandbox", self.directory],
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # its own process group: a time limit kills its children too
            )
        self._update(st)

    def _wait(self) -> None:
        proc = self._proc
        assert proc is not None
        timed_out = False
        try:
            rc = proc.wait(self._time_limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
            rc = proc.wait()
        st = dict(self._status)
        st["finished"] = time.time()
        st["elapsed"] = st["finished"] - (st["started"] or st["finished"])
        st["exit_code"] = rc
        if self._cancel.is_set():
            st.update(state="cancelled", reason="cancelled")
        elif timed_out:
            st.update(state="timed-out", reason="time limit of %s reached" % _duration(self._time_limit))
        elif rc == 0 and os.path.exists(os.path.join(self.directory, _core.RESULT)):
            st.update(state="completed", reason="completed")
        elif rc < 0:
            st.update(state="failed", reason="the executor was killed by signal %d" % -rc)
        else:
            st.update(state="failed", reason="the executor exited with code %d without a result" % rc)
        try:
            self._finish(st)
        except Exception as e:  # noqa: BLE001 - never leave a future pending
            self._set(False, e)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _duration(secs: int) -> str:
    if secs % 3600 == 0:
        return "%dh" % (secs // 3600)
    if secs % 60 == 0:
        return "%dm" % (secs // 60)
    return "%ds" % secs


def submit(payloads: list, label: str, res: dict) -> list:
    """Runs each payload in its own local subprocess; returns the futures at
    once, under one live line."""
    limit = _core.parse_duration_secs(str(res["time"])) if "time" in res else DEFAULT_TIME
    env = dict(res.get("env") or {})
    futs = []
    for payload in payloads:
        job_id = new_id()
        d = RUNNER.job_dir(job_id)
        with open(os.path.join(d, fmt.PAYLOAD), "wb") as f:
            f.write(payload)
        fut = LocalFuture(job_id, "%s [%s]" % (label, job_id), d, limit, env)
        with RUNNER.lock:
            RUNNER.jobs[job_id] = fut
        futs.append(fut)
    watch(futs, label)
    for fut in futs:
        threading.Thread(target=fut._run, name="delegate-local-%s" % fut.job_id, daemon=True).start()
    return futs


def job(job_id: str) -> LocalFuture:
    """The future of a local job of this process."""
    with RUNNER.lock:
        fut = RUNNER.jobs.get(job_id)
    if fut is None:
        raise NoSuchJobError(
            "no local job %s in this process (local jobs live as long as their process)" % job_id
        )
    return fut


def statuses(limit: int | None = None) -> list:
    """The status dicts of this process's local jobs, oldest first."""
    with RUNNER.lock:
        futs = list(RUNNER.jobs.values())
    if limit is not None:
        futs = futs[-limit:] if limit > 0 else []
    out = []
    for f in futs:
        st = dict(f.status)
        if st.get("elapsed") is None and st.get("started"):
            st["elapsed"] = time.time() - st["started"]
        out.append(st)
    return out


__all__ = ["LocalFuture", "job", "new_id", "statuses", "submit"]
