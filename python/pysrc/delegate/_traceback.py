"""Tracebacks a student reads: a remote exception re-raised here shows the
remote frames (its ``RemoteTraceback`` cause) and the caller's own line,
without the frames of delegate's and ``concurrent.futures``' internals.

- The exception is raised afresh by ``DelegateFuture.result`` (its old
  traceback dropped with ``with_traceback(None)``), never through
  ``concurrent.futures``' own ``result``, from a one-line code object that
  carries the remote frame where it was raised (its file, line and function
  name): the last frame shown is where the remote call failed, with its
  source line when the caller has the file (a notebook cell, a script).
- In IPython and Jupyter, every delegate frame left on the way sets
  ``__tracebackhide__``, which IPython's traceback printer skips.
- In a plain interpreter, ``sys.excepthook`` is wrapped (once, at the first
  re-raised remote exception) to drop those frames from the traceback of an
  exception that came from a delegate job, and only of such an exception.

``DELEGATE_TRACEBACK=full`` in the environment (read at each raise, so a
notebook may set ``os.environ`` in a cell) shows every frame, for debugging
delegate itself.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import types

ENV = "DELEGATE_TRACEBACK"
_MARK = "_delegate_job"
_FRAME = "_delegate_frame"
_NAME = "__delegate_exception__"
# A remote line number beyond this is not reproduced (the code object would
# be as many newlines long).
_MAX_LINE = 100_000
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FUTURES_DIR = os.path.dirname(os.path.abspath(concurrent.futures.__file__)) + os.sep
_lock = threading.Lock()
_hook_installed = False


def full() -> bool:
    """True when ``DELEGATE_TRACEBACK=full``: nothing is hidden."""
    return os.environ.get(ENV, "").strip().lower() == "full"


def hide() -> bool:
    """The value of ``__tracebackhide__`` for delegate's frames."""
    return not full()


def internal(filename: str) -> bool:
    path = os.path.abspath(filename) if filename else ""
    return path.startswith((_PACKAGE_DIR, _FUTURES_DIR))


def mark(exc: BaseException, job_id: str) -> None:
    """Marks an exception as coming from a delegate job."""
    try:
        setattr(exc, _MARK, job_id)
    except Exception:  # noqa: BLE001 - an exception type refusing attributes stays unmarked
        pass


def remember_frame(exc: BaseException, frames) -> None:
    """Keeps the innermost remote frame ``(filename, lineno, name, line)``
    with the exception, for ``raise_remote``."""
    try:
        filename, lineno, name, _line = frames[-1]
        setattr(exc, _FRAME, (str(filename), int(lineno), str(name)))
    except Exception:  # noqa: BLE001 - no frame, no grafting
        pass


def raise_remote(exc: BaseException) -> None:
    """Raises ``exc`` from a code object named after its innermost remote
    frame (file, line, function), so that the last frame of the traceback
    is the remote line that failed."""
    __tracebackhide__ = hide()  # IPython and Jupyter skip this frame
    frame = getattr(exc, _FRAME, None)
    job = getattr(exc, _MARK, "?")
    if frame is None or full():
        filename, lineno, name = "<delegate job %s>" % job, 1, "<remote call>"
    else:
        filename, lineno, name = frame
    if not 0 < lineno <= _MAX_LINE:
        lineno = 1
    try:
        code = compile("\n" * (lineno - 1) + "raise " + _NAME, filename, "exec")
        code = code.replace(co_name=name)
        if hasattr(code, "co_qualname"):
            code = code.replace(co_qualname=name)
    except Exception:  # noqa: BLE001 - an odd name or file: raise it plainly
        raise exc from exc.__cause__
    exec(code, {_NAME: exc, "__name__": "delegate-remote", "__tracebackhide__": False})


def marked(exc: BaseException) -> bool:
    return getattr(exc, _MARK, None) is not None


def trimmed(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The same traceback without the frames of delegate's package and of
    ``concurrent.futures``."""
    frames = []
    while tb is not None:
        if not internal(tb.tb_frame.f_code.co_filename):
            frames.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(frames):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def prepare(exc: BaseException) -> BaseException:
    """The exception to raise from ``result()``: its previous traceback (of
    an earlier ``result()`` call) dropped; the plain interpreter's hook
    installed."""
    if marked(exc):
        _install_hook()
        return exc.with_traceback(None)
    return exc


def _install_hook() -> None:
    global _hook_installed
    with _lock:
        if _hook_installed:
            return
        _hook_installed = True
        previous = sys.excepthook

        def delegate_excepthook(etype, value, tb):
            if value is not None and marked(value) and not full():
                tb = trimmed(tb)
                value = value.with_traceback(tb)  # the printer reads the exception's own
            previous(etype, value, tb)

        sys.excepthook = delegate_excepthook
