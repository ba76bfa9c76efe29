"""Futures, the shared waiter thread, result decoding. All job handling
(job directories, sbatch, squeue, scancel, waiting on the directory) is the
Rust core, ``delegate._core``; this module only turns its answers into
``concurrent.futures`` semantics and pickled values into Python objects."""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import json
import linecache
import os
import pickle
import re
import sys
import threading
import time
import weakref
from typing import Any

import delegate_sandbox as fmt  # type: ignore[import-untyped]
from delegate import _core, _traceback
from delegate._display import TERMINAL, Progress, outcome_words
from delegate._errors import (
    DelegateError,
    JobFailed,
    JobTimedOut,
    RemoteError,
    RemoteTraceback,
    VersionMismatchError,
)

# Longest round of the shared waiter. The Rust core returns earlier when one
# of the jobs is over (inotify on the job directories) or when a future is
# added (``_core.wake``); Slurm is asked at most once per 2 s across rounds.
POLL_INTERVAL = float(os.environ.get("DELEGATE_POLL_INTERVAL", "2"))
MAX_LOG = 64 * 1024 * 1024
# A waiting call's place in Slurm's queue, in its reason (the client's
# words when the place helper told it: broker/client/src/state.rs).
_PLACE = re.compile(r", (\d+ jobs? ahead|next in line)[;,]")


def _format_frames(frames, summary: str, remote_text: str) -> str:
    """The remote traceback, with source lines taken from the caller's files
    when the sandbox could not read them (a function from __main__ or a
    notebook cell runs remotely without its source file)."""
    if not frames:
        return remote_text
    lines = ["Traceback (most recent call last, remote):\n"]
    for filename, lineno, name, line in frames:
        lines.append('  File "%s", line %d, in %s\n' % (filename, lineno, name))
        src = line or linecache.getline(filename, lineno).strip()
        if src:
            lines.append("    %s\n" % src)
    lines.append(summary.rstrip() + "\n")
    return "".join(lines)


def decode_result(data: bytes, job_id: str):
    """("ok", value) or ("err", exception) from a result file."""
    try:
        rec = fmt.decode_result(data)
    except Exception as e:  # noqa: BLE001
        return "err", RemoteError("job %s: the result file is unreadable: %s" % (job_id, e), job_id=job_id)
    status, kind = rec.get("status"), rec.get("kind", "")
    summary, tb_text = str(rec.get("summary", "")), str(rec.get("traceback", ""))
    exc_type = str(rec.get("exc_type", ""))
    text = _format_frames(rec.get("frames") or [], summary, tb_text)
    if status == "ok":
        try:
            return "ok", pickle.loads(rec["data"])
        except Exception as e:  # noqa: BLE001
            return "err", RemoteError(
                "job %s: the return value could not be unpickled here: %s: %s"
                % (job_id, type(e).__name__, e),
                "",
                "",
                job_id,
                "unpicklable-result",
            )
    if status == "err":
        try:
            exc = pickle.loads(rec["data"])
            if not isinstance(exc, BaseException):
                raise TypeError("not an exception: %r" % type(exc))
        except Exception as e:  # noqa: BLE001
            return "err", RemoteError(
                "job %s: the remote %s could not be unpickled here (%s: %s): %s"
                % (job_id, exc_type, type(e).__name__, e, summary),
                text,
                exc_type,
                job_id,
                "unpicklable-exception",
            )
        exc.__cause__ = RemoteTraceback(text)
        _traceback.remember_frame(exc, rec.get("frames") or [])
        if hasattr(exc, "add_note"):
            try:
                exc.add_note("(raised remotely in delegate job %s; remote traceback above)" % job_id)
            except Exception:  # noqa: BLE001
                pass
        return "err", exc
    if kind == "version-mismatch":
        return "err", VersionMismatchError("job %s: %s" % (job_id, summary), "", "", job_id, kind)
    return "err", RemoteError("job %s: %s" % (job_id, summary), text, exc_type, job_id, kind)


#: The futures of this process by job id, while they live (for the user's
#: words in ``delegate.jobs()``).
_KNOWN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def known_future(job_id: str):
    """This process's future of a job, if it still has one."""
    return _KNOWN.get(job_id)


class DelegateFuture(cf.Future[Any]):
    """A ``concurrent.futures.Future`` of a delegate job, with ``job_id``,
    ``state``, ``stdout`` and ``stderr``. ``cancel()`` cancels the Slurm job
    whether it is pending or running."""

    def __init__(self, job_id: str, label: str = "") -> None:
        super().__init__()
        self.job_id = job_id
        self.label = label or job_id
        # (the keys a student reads before the waiter's first answer)
        self._status: dict[str, Any] = {"state": "pending", "reason": "", "host": None, "started": None}
        self._stdout: str | None = None
        self._stderr: str | None = None
        self._shown = False
        self._words: str | None = None
        self._progress: Progress | None = None
        _KNOWN[job_id] = self

    def __repr__(self) -> str:
        return "<DelegateFuture job %s %s>" % (self.job_id, self.state)

    # -- state -------------------------------------------------------------
    @property
    def state(self) -> str:
        """pending, running, completed, failed, timed-out, cancelled or lost."""
        return str(self._status.get("state", "pending"))

    @property
    def reason(self) -> str:
        return str(self._status.get("reason", ""))

    @property
    def status(self) -> dict:
        return dict(self._status)

    @property
    def fingerprint(self) -> dict | None:
        """The machine the call ran on, as the worker's agent recorded it
        after the call (never the call's own code): ``node``, ``cpu_model``,
        ``cpu_vendor``, ``microcode``, ``cores`` and their ``smt_siblings``,
        ``governor``, ``boost``, frequencies, ``kernel``, ``boot_params``,
        ``image_id``, ``perf_mode``, ``hardware_counters``, ``others_seen``
        and more; a field the node cannot tell is None. None before the call
        ended (or when its worker recorded none)."""
        text = _core.fingerprint(self.job_id)
        return None if text is None else json.loads(text)

    @property
    def outcome(self) -> str:
        """The call's state in the user's words: ``pending``, ``running on
        node1``, ``done``, ``raised ZeroDivisionError``, ``refused: ...``,
        ``timed out: ...``, ``lost: ...``, ``cancelled``, ``failed: ...``."""
        return self._words_now()

    def _words_now(self) -> str:
        if self._words is not None:
            return self._words
        if self.cancelled():
            return "cancelled"
        state = self.state
        if state in ("running", "completed", "failed", "timed-out", "lost"):
            host = self._status.get("host")
            if host:
                return "running on %s%s" % (host, self._again())
            # (its start record not seen yet: the node Slurm gave it)
            return self.reason if self.reason.startswith("running on ") else "running"
        if self.reason.startswith("waiting for a worker to start"):
            return self.reason  # an elastic worker's cold start
        if self.reason.startswith("its node ") and " was lost" in self.reason:
            # (Slurm holds it again: a new attempt runs it, issue 52, or,
            # its retries spent, the runner's verdict ends it lost)
            lost = self.reason.split(":", 1)[0]
            if "its retries are spent" in self.reason:
                return "pending — %s; its retries are spent: it ends lost when a node takes it" % lost
            return "pending — %s, it runs again" % lost
        # (where it stands, from the place helper: "37 jobs ahead", issue 56)
        place = _PLACE.search(self.reason)
        ahead = place.group(1) + ", " if place else ""
        for words in ("likely to start", "no estimate of its start", "its place in line comes"):
            # (Slurm's estimate of a waiting call's start, issue 56; the
            # reason's words before its parenthesis)
            at = self.reason.find(words)
            if at >= 0:
                return "pending — " + ahead + self.reason[at:].split(" (", 1)[0].split(";", 1)[0]
        return "pending — " + place.group(1) if place else "pending"

    def _again(self) -> str:
        """`` — ran again on worker1 (attempt 2): worker2 was lost`` for a
        call that runs (or ran) again after its node was lost."""
        at = self.reason.find("ran again on ")
        return " — " + self.reason[at:] if at >= 0 else ""

    def _phase(self) -> str:
        """done, failed, cancelled, running or pending (the counts of a
        submission's line)."""
        w = self._words
        if w is None:
            if self.cancelled():
                return "cancelled"
            return "running" if self._words_now().startswith("running") else "pending"
        if w == "done":
            return "done"
        if w.startswith("cancelled"):
            return "cancelled"
        return "failed"

    def _changed(self) -> None:
        p = self._progress
        if p is not None:
            try:
                p.changed()
            except Exception:  # noqa: BLE001 - a status line is never worth an error
                pass

    def running(self) -> bool:
        return self.state == "running" and not self.done()

    def _read(self, name: str, limit: int) -> bytes | None:
        """One of the job's files (None when absent); raises DelegateError."""
        return _core.read_file(self.job_id, name, limit)

    def _read_log(self, name: str) -> str:
        try:
            data = self._read(name, MAX_LOG)
        except DelegateError:
            data = None
        return (data or b"").decode("utf-8", "replace")

    @property
    def stdout(self) -> str:
        """The remote standard output so far (all of it once the job ended)."""
        return self._stdout if self._stdout is not None else self._read_log(_core.STDOUT)

    @property
    def stderr(self) -> str:
        return self._stderr if self._stderr is not None else self._read_log(_core.STDERR)

    # -- concurrent.futures ------------------------------------------------
    def cancel(self) -> bool:
        with self._condition:
            if self._state in (cf._base.CANCELLED, cf._base.CANCELLED_AND_NOTIFIED):
                return True
            if self._state == cf._base.FINISHED:
                return False
        _core.cancel([self.job_id])
        return mark_cancelled(self)

    def _show_output(self) -> None:
        if self._shown or not self.done() or self.cancelled():
            return
        self._shown = True
        for text, stream in ((self._stdout, sys.stdout), (self._stderr, sys.stderr)):
            if text:
                TERMINAL.clear()
                try:
                    stream.write(text)
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass

    def result(self, timeout: float | None = None) -> Any:
        """The return value, or the remote exception re-raised with the
        remote traceback as its cause (delegate's frames hidden; see
        ``delegate._traceback``)."""
        __tracebackhide__ = _traceback.hide()
        try:
            exc = cf.Future.exception(self, timeout)
        finally:
            self._show_output()
        if exc is not None:
            exc = _traceback.prepare(exc)
            if _traceback.marked(exc):
                _traceback.raise_remote(exc)
            raise exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return super().exception(timeout)
        finally:
            self._show_output()

    # -- called by the waiter ---------------------------------------------
    def _update(self, st: dict) -> None:
        old = (self.state, self._status.get("host"))
        self._status = st
        if (self.state, self._status.get("host")) != old:
            self._changed()

    def _finish(self, st: dict) -> None:
        self._status = st
        state = self.state
        self._stdout = self._read_log(_core.STDOUT)
        self._stderr = self._read_log(_core.STDERR)
        try:
            data = self._read(_core.RESULT, _core.MAX_RESULT_BYTES)
        except DelegateError as e:
            data = None
            if state == "completed":
                self._set(False, RemoteError("job %s: %s" % (self.job_id, e), job_id=self.job_id))
                return
        if state == "cancelled":
            self._words = outcome_words(state, self.reason)
            self._changed()
            mark_cancelled(self)
            return
        if data is not None:
            kind, obj = decode_result(data, self.job_id)
            self._set(kind == "ok", obj)
            return
        ranks = self._rank_results()
        if ranks is not None and state == "completed":
            self._set(True, [obj for _, obj in ranks])
            return
        if ranks:
            for kind, obj in ranks:
                if kind != "ok":
                    self._set(False, obj)
                    return
        why = self.reason or "no reason given"
        tail = self._stderr[-2000:] if self._stderr else ""
        msg = "job %s %s without a result: %s" % (self.job_id, state, why)
        if state == "timed-out":
            self._set(False, JobTimedOut(msg, tail, "", self.job_id, state))
        else:
            self._set(False, JobFailed(msg, tail, "", self.job_id, state))

    def _rank_results(self):
        """A multi-node call's ``result.<K>`` decoded, in rank order (None
        when there is no ``result.0``); stops at the first missing rank."""
        out = []
        for k in range(256):
            try:
                data = self._read("%s.%d" % (_core.RESULT, k), _core.MAX_RESULT_BYTES)
            except DelegateError:
                data = None
            if data is None:
                break
            out.append(decode_result(data, self.job_id))
        return out or None

    def _set(self, ok: bool, obj) -> None:
        """Completes the future; the line shows the outcome first, so that a
        caller woken by it finds the line final."""
        if self._words is None:
            self._words = outcome_words(
                self.state, self.reason, None if ok else obj, bool(self._status.get("refused"))
            )
        if not ok:
            _traceback.mark(obj, self.job_id)
        self._changed()
        try:
            if ok:
                self.set_result(obj)
            else:
                self.set_exception(obj)
        except cf.InvalidStateError:
            pass  # cancelled in the meantime


def mark_cancelled(fut, reason: str | None = None) -> bool:
    """Cancels a future AND notifies its waiters: ``concurrent.futures.wait``
    (hence ``Executor.shutdown``) counts a future as done only once it is
    CANCELLED_AND_NOTIFIED, which plain ``Future.cancel`` does not reach
    (executors normally do it when they would have started the call).
    ``reason``: why, in the user's words (its state reads ``cancelled:
    <reason>``)."""
    if not cf.Future.cancel(fut):
        return False
    if reason and getattr(fut, "_words", "") is None:
        fut._words = "cancelled: " + reason
        fut._changed()
    if getattr(fut, "_words", "") is None:
        was = str(getattr(fut, "_status", {}).get("state", ""))
        fut._words = {"pending": "cancelled before it started", "running": "cancelled while running"}.get(
            was, "cancelled"
        )
        fut._changed()
    with fut._condition:  # re-entrant: set_running_or_notify_cancel takes it too
        if fut._state == cf._base.CANCELLED:
            fut.set_running_or_notify_cancel()  # CANCELLED -> CANCELLED_AND_NOTIFIED
    return True


class _Waiter:
    """One thread waiting for every job of this process: each round is one
    call of the Rust core's ``wait`` for all ids (one Slurm query, and the
    job directories' notifications), whatever the number of futures."""

    def __init__(self):
        self._cv = threading.Condition()
        self._futures = {}  # job id -> list of futures
        self._thread = None
        self._stopping = False
        self.rounds = 0
        atexit.register(self.stop)

    def stop(self) -> None:
        """At interpreter exit: let the thread leave the Rust core before the
        interpreter finalizes (a daemon thread inside a call that released
        the GIL would otherwise be torn down mid-call)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            t = self._thread
        _wake()
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(POLL_INTERVAL + 5)

    def add(self, fut: DelegateFuture) -> None:
        with self._cv:
            if self._stopping:
                raise RuntimeError("the interpreter is shutting down")
            new = fut.job_id not in self._futures
            self._futures.setdefault(fut.job_id, []).append(fut)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="delegate-waiter", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        if new:
            _wake()  # a round in progress returns and the next one includes it

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cv:
                while not self._futures and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                ids = list(self._futures)
            try:
                statuses = _core.wait(ids, POLL_INTERVAL, True)
                failures = 0
            except Exception as e:  # noqa: BLE001
                failures += 1
                if failures >= 5:
                    with self._cv:
                        dead = {i: self._futures.pop(i) for i in ids if i in self._futures}
                    for futs in dead.values():
                        for f in futs:
                            f._set(False, e)
                    failures = 0
                time.sleep(min(POLL_INTERVAL * failures, 10))
                continue
            self.rounds += 1
            if self._stopping:
                return
            for st in statuses:
                jid = st.get("id")
                if st.get("state") in _core.TERMINAL_STATES:
                    with self._cv:
                        futs = self._futures.pop(jid, [])
                    for f in futs:
                        try:
                            f._finish(st)
                        except Exception as e:  # noqa: BLE001 - never kill the waiter
                            f._set(False, e)
                else:
                    with self._cv:
                        futs = list(self._futures.get(jid, []))
                    for f in futs:
                        f._update(st)


def _wake() -> None:
    try:
        _core.wake()
    except Exception:  # noqa: BLE001 - never fail an add for this
        pass


WAITER = _Waiter()


def watch(futs: list, label: str) -> list:
    """Gives the futures of one submission their live line: one line for a
    single call, one aggregated line for several. Call it in the caller's
    thread (a notebook shows the line in the cell that submitted)."""
    if futs:
        p = Progress(label if len(futs) > 1 else futs[0].label, single=len(futs) == 1)
        for f in futs:
            f._progress = p
        p.start(futs)
    return futs


def attach_many(job_ids: list, label: str) -> list:
    """Futures of the jobs of one submission, waited for by the shared
    waiter, under one live line."""
    futs = [DelegateFuture(i, "%s [%s]" % (label, i)) for i in job_ids]
    watch(futs, label)
    for f in futs:
        WAITER.add(f)
    return futs


def attach(job_id: str, label: str = "") -> DelegateFuture:
    fut = DelegateFuture(job_id, label)
    watch([fut], label)
    WAITER.add(fut)
    return fut
