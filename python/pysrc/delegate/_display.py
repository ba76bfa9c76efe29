"""The live line of a submission: ONE line per single call, ONE aggregated
line per ``map`` (done, running, pending and failed counts, elapsed time, an
ETA once some calls finished), updated in place.

- In a notebook: a plain ``display(..., display_id=True)`` updated with
  ``update_display_data`` (no widget packages); its final state stays in
  the cell's output.
- In a terminal: a single carriage-return line on stderr, only when stderr
  is a TTY; it is erased when the submission is over, and before the jobs'
  own output is printed.
- Anywhere else (a script with its output redirected, a test, CI): nothing.

The states are in the user's words (``done``, ``raised ZeroDivisionError``,
``refused: ...``, ``timed out: ...``); :func:`outcome_words` makes them.
"""

from __future__ import annotations

import html
import sys
import threading
import time
import weakref

#: How often a live line's clock is refreshed (seconds).
TICK = 1.0

_COLOURS = {
    "pending": "#777777",
    "running": "#1f6fb2",
    "done": "#2e7d32",
    "failed": "#c62828",
    "cancelled": "#b26a00",
}


def in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        ip = ipython.get_ipython()
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except Exception:  # noqa: BLE001
        return False


def seconds(s: float) -> str:
    """``7 s``, ``2m05s``, ``1h02m``."""
    s = max(0, round(s))
    if s < 60:
        return "%d s" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, (s % 3600) // 60)


def outcome_words(
    state: str, reason: str = "", exc: BaseException | None = None, refused: bool = False
) -> str:
    """A finished call's state in the user's words: ``done``, ``raised
    ZeroDivisionError``, ``refused: <reason>``, ``timed out: <reason>``,
    ``lost: <reason>``, ``cancelled``, ``out of memory: <reason>``,
    ``failed: <reason>``."""
    reason = " ".join((reason or "").split())
    if state == "cancelled":
        if not reason or reason.lower().startswith("cancel"):
            return reason or "cancelled"
        return "cancelled: " + reason
    if exc is None and state == "completed":
        return "done"
    # The remote function's own exception: the job completed, the call did not.
    from delegate._errors import RemoteError

    if exc is not None and state == "completed" and not isinstance(exc, RemoteError):
        return "raised " + type(exc).__name__
    if refused:
        if reason.lower().startswith("refused"):
            reason = reason[len("refused") :].lstrip(" :")
        return "refused: " + (reason or "by the site policy")
    if state == "timed-out":
        return "timed out: " + (reason or "the time limit was reached")
    if state == "lost":
        return "lost: " + (reason or "Slurm no longer knows the job and it left no outcome")
    if getattr(exc, "kind", "") == "unpicklable-result":
        return "failed: the return value could not be sent back"
    if getattr(exc, "kind", "") == "unpicklable-exception":
        return "raised %s (not picklable)" % (getattr(exc, "remote_type", "") or "an exception")
    if getattr(exc, "kind", "") == "version-mismatch":
        return "failed: Python or cloudpickle versions differ"
    if "out of memory" in reason or "oom" in reason.lower():
        return "out of memory: " + reason
    if not reason and exc is not None:
        reason = str(exc).split("\n", 1)[0]
    return "failed: " + (reason or "no reason given")


class _Terminal:
    """The one carriage-return line on a TTY stderr, shared by every live
    submission of the process (the most recent update wins)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.shown = False

    def show(self, text: str) -> None:
        with self.lock:
            try:
                width = 200
                try:
                    import shutil

                    width = max(20, shutil.get_terminal_size().columns - 1)
                except Exception:  # noqa: BLE001
                    pass
                sys.stderr.write("\r\x1b[K" + text[:width])
                sys.stderr.flush()
                self.shown = True
            except Exception:  # noqa: BLE001
                pass

    def clear(self) -> None:
        with self.lock:
            if not self.shown:
                return
            self.shown = False
            try:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass


TERMINAL = _Terminal()


class Progress:
    """The live line of one submission: a single call (``label`` names it)
    or a map of ``len(futures)`` calls. Futures tell it when they change
    (``changed``); a shared ticker refreshes the clock every second."""

    def __init__(self, label: str, single: bool):
        self.label = label
        self.single = single
        self.futures: list = []
        self.t0 = time.monotonic()
        self.t_end: float | None = None
        self.lock = threading.RLock()
        self.handle = None
        self.last: str | None = None
        self.final = False
        self.mode = "notebook" if in_notebook() else ("terminal" if _stderr_is_tty() else None)

    def start(self, futures) -> Progress:
        """Shows the line (in the caller's thread: a notebook puts it in the
        cell that submitted) and starts refreshing it."""
        self.futures = list(futures)
        if self.mode == "notebook":
            try:
                from IPython.display import display

                self.handle = display(self._bundle(self.text()), raw=True, display_id=True)
            except Exception:  # noqa: BLE001 - a status line is never worth an error
                self.mode = None
        if self.mode is not None:
            _TICKER.add(self)
        return self

    # -- the text ----------------------------------------------------------
    def counts(self) -> dict:
        c = {"done": 0, "running": 0, "pending": 0, "failed": 0, "cancelled": 0}
        for f in self.futures:
            c[f._phase()] += 1
        return c

    def text(self) -> str:
        now = time.monotonic() if self.t_end is None else self.t_end
        elapsed = now - self.t0
        if self.single:
            f = self.futures[0] if self.futures else None
            words = f._words_now() if f is not None else "submitted"
            return "delegate: %s — %s · %s" % (self.label, words, seconds(elapsed))
        c = self.counts()
        n = len(self.futures)
        finished = c["done"] + c["failed"] + c["cancelled"]
        parts = ["%d/%d done" % (c["done"], n)]
        for k in ("running", "pending", "failed", "cancelled"):
            if c[k]:
                parts.append("%d %s" % (c[k], k))
        parts.append(seconds(elapsed))
        if 0 < finished < n and self.t_end is None:
            eta = elapsed / finished * (n - finished)
            parts.append("ETA " + seconds(eta))
        text = "delegate: %s × %d — %s" % (self.label, n, " · ".join(parts))  # noqa: RUF001
        failures = [(i, f) for i, f in enumerate(self.futures) if f._phase() == "failed"]
        if failures:
            i, f = failures[0]
            text += " — call %d %s" % (i, f._words_now())
            if len(failures) > 1:
                text += " (and %d more)" % (len(failures) - 1)
        return text

    def phase(self) -> str:
        c = self.counts()
        if c["failed"]:
            return "failed"
        if c["running"]:
            return "running"
        if c["pending"]:
            return "pending"
        if c["cancelled"] and not c["done"]:
            return "cancelled"
        return "done"

    def _bundle(self, text: str) -> dict:
        colour = _COLOURS.get(self.phase(), "inherit")
        return {
            "text/plain": text,
            "text/html": '<pre style="margin:0;color:%s">%s</pre>' % (colour, html.escape(text)),
        }

    # -- updates -------------------------------------------------------------
    def changed(self) -> None:
        """A future of this submission changed state (any thread)."""
        if self.mode is None:
            return
        with self.lock:
            if self.final:
                return
            done = all(f._phase() not in ("running", "pending") for f in self.futures)
            if done:
                self.t_end = time.monotonic()
            self._show(self.text(), done)

    def tick(self) -> bool:
        """Refreshes the clock; False once the line is final."""
        with self.lock:
            if self.final or self.mode is None:
                return False
            self._show(self.text(), False)
            return True

    def _show(self, text: str, final: bool) -> None:
        if final:
            self.final = True
        if text == self.last and not final:
            return
        self.last = text
        if self.mode == "notebook" and self.handle is not None:
            try:
                self.handle.update(self._bundle(text), raw=True)
            except Exception:  # noqa: BLE001
                self.handle = None
        elif self.mode == "terminal":
            if final:
                TERMINAL.clear()
            else:
                TERMINAL.show(text)


class _Ticker:
    """One daemon thread refreshing the clock of every live line each
    ``TICK`` seconds (less often beyond 20 lines) while there is one."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.thread: threading.Thread | None = None

    def add(self, p: Progress) -> None:
        with self.cv:
            self.live.add(p)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="delegate-progress", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            with self.cv:
                live = list(self.live)
                if not live:
                    self.thread = None
                    return
            for p in live:
                try:
                    if not p.tick():
                        with self.cv:
                            self.live.discard(p)
                except Exception:  # noqa: BLE001 - never kill the ticker
                    with self.cv:
                        self.live.discard(p)
            # Many live lines (a loop of single submits): fewer refreshes each.
            time.sleep(TICK * max(1.0, len(live) / 20))


_TICKER = _Ticker()
