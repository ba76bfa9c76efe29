"""The sandbox side of the Python package: runs one pickled call inside a
delegate sandbox (not to be confused with the user side's ``delegate.Executor``).

It is started by sandbox-runner as ``python3 -m delegate_sandbox /job``
(working directory ``/job``, the submitting user's uid, no network, a
read-only root filesystem). It reads ``payload``, checks that the caller's
Python (major.minor) and cloudpickle (exact) versions match this sandbox's,
unpickles ``(function, args, kwargs)``, calls it, and writes ``result``
atomically (temporary file in the job directory, fsync, rename).

This module is also shipped in the ``delegate`` wheel: the user side imports
the payload and result format from here, so both sides share one definition.
It must stay importable without cloudpickle (the format helpers use only the
standard library) and on Python 3.9.

Payload format::

    b"DLGTPY1\\n" + JSON header (one line) + b"\\n" + cloudpickle((fn, args, kwargs))

The header holds ``python`` and ``cloudpickle`` (the caller's versions) and
``function`` (the function's name, shown by ``delegate list``; optional,
never trusted for anything else). Unknown keys are ignored.

Result format: ``pickle`` (protocol 4) of a dict of builtins only, so the
caller can always read it, even when the value inside cannot be unpickled::

    {"v": 1,
     "status": "ok" | "err" | "raw",
     "kind": "" | "unpicklable-result" | "unpicklable-exception" |
             "version-mismatch" | "bad-payload",
     "summary": str,            # one line: "ValueError: bad input"
     "exc_type": str,           # qualified name of the exception type
     "traceback": str,          # the remote traceback, formatted remotely
     "frames": [(filename, lineno, name, line), ...],  # the remote frames
     "data": bytes | None}      # cloudpickle of the value (ok) or exception (err)
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback

PAYLOAD_MAGIC = b"DLGTPY1\n"
RESULT_VERSION = 1
PAYLOAD = "payload"
RESULT = "result"
RAISED = "raised"
# Upper bound on the JSON header of a payload.
MAX_HEADER = 4096


class PayloadError(Exception):
    """The payload is not a delegate payload."""


def python_version() -> str:
    return "%d.%d.%d" % sys.version_info[:3]


def encode_payload(call_bytes: bytes, python: str, cloudpickle_version: str, function: str = "") -> bytes:
    """The payload of a call; ``function`` (the function's name, for
    ``delegate list`` and ``delegate.jobs()``) is informative only."""
    fields = {"python": python, "cloudpickle": cloudpickle_version}
    if function:
        fields["function"] = function[:200]
    header = json.dumps(fields, sort_keys=True)
    return PAYLOAD_MAGIC + header.encode("utf-8") + b"\n" + call_bytes


def decode_payload(data: bytes):
    """Returns (header dict, call bytes)."""
    if not data.startswith(PAYLOAD_MAGIC):
        raise PayloadError("the payload does not start with the delegate magic %r" % PAYLOAD_MAGIC)
    rest = data[len(PAYLOAD_MAGIC) :]
    nl = rest.find(b"\n", 0, MAX_HEADER)
    if nl < 0:
        raise PayloadError("the payload header is missing or longer than %d bytes" % MAX_HEADER)
    try:
        header = json.loads(rest[:nl].decode("utf-8"))
    except ValueError as e:
        raise PayloadError("the payload header is not valid JSON: %s" % e) from None
    if not isinstance(header, dict):
        raise PayloadError("the payload header is not a JSON object")
    return header, rest[nl + 1 :]


def major_minor(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


def version_mismatch(header: dict, here_python: str, here_cloudpickle: str | None):
    """A message naming both sides' versions, or None when they agree."""
    theirs_py = str(header.get("python", "?"))
    theirs_cp = str(header.get("cloudpickle", "?"))
    problems = []
    if major_minor(theirs_py) != major_minor(here_python):
        problems.append(
            "Python %s on the caller's side but Python %s in the sandbox "
            "(major.minor must match)" % (theirs_py, here_python)
        )
    if here_cloudpickle is None:
        problems.append("cloudpickle %s on the caller's side but no cloudpickle in the sandbox" % theirs_cp)
    elif theirs_cp != here_cloudpickle:
        problems.append(
            "cloudpickle %s on the caller's side but cloudpickle %s in the sandbox "
            "(the versions must be equal)" % (theirs_cp, here_cloudpickle)
        )
    if not problems:
        return None
    return "version mismatch: " + "; ".join(problems)


def record(status, kind="", summary="", exc_type="", tb="", frames=(), data=None) -> dict:
    return {
        "v": RESULT_VERSION,
        "status": status,
        "kind": kind,
        "summary": summary,
        "exc_type": exc_type,
        "traceback": tb,
        "frames": list(frames),
        "data": data,
    }


def encode_result(rec: dict) -> bytes:
    return pickle.dumps(rec, protocol=4)


def decode_result(data: bytes) -> dict:
    """The result record; plain pickle of builtins only (nothing user-defined
    is unpickled here)."""
    rec = _SafeUnpickler(_io_bytes(data)).load()
    if not isinstance(rec, dict) or rec.get("v") != RESULT_VERSION:
        raise PayloadError("the result is not a delegate result of version %d" % RESULT_VERSION)
    return rec


def _io_bytes(data: bytes):
    import io

    return io.BytesIO(data)


class _SafeUnpickler(pickle.Unpickler):
    """Refuses every global: the outer record holds only builtins."""

    def find_class(self, module, name):  # pragma: no cover - only on corrupt input
        raise pickle.UnpicklingError("unexpected global %s.%s in a result record" % (module, name))


def _qualname(t) -> str:
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", getattr(t, "__name__", repr(t)))
    return name if mod in ("builtins", "__main__", "") else "%s.%s" % (mod, name)


def _frames(tb):
    out = []
    for fs in traceback.extract_tb(tb):
        out.append((str(fs.filename), int(fs.lineno or 0), str(fs.name), str(fs.line or "")))
    return out


def _write_atomic(directory: str, name: str, data: bytes) -> None:
    tmp = os.path.join(directory, ".%s.tmp-%d" % (name, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.rename(tmp, os.path.join(directory, name))
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _cloudpickle_version():
    try:
        import cloudpickle  # type: ignore[import-untyped]
    except ImportError:
        return None, None
    return cloudpickle, getattr(cloudpickle, "__version__", "?")


def _dump_checked(cloudpickle, obj) -> bytes:
    """cloudpickle of obj, checked by loading it back (an object that pickles
    but cannot be unpickled, e.g. an exception whose __init__ takes other
    arguments than its args, is caught here rather than in the caller)."""
    data = cloudpickle.dumps(obj, protocol=4)
    pickle.loads(data)
    return data


def run(job_dir: str) -> dict:
    """Runs the call of ``job_dir/payload``; returns the result record."""
    here_py = python_version()
    try:
        with open(os.path.join(job_dir, PAYLOAD), "rb") as f:
            raw = f.read()
        header, body = decode_payload(raw)
    except (OSError, PayloadError) as e:
        return record("raw", "bad-payload", "could not read the payload: %s" % e, "PayloadError")
    del raw
    cloudpickle, here_cp = _cloudpickle_version()
    mismatch = version_mismatch(header, here_py, here_cp)
    if mismatch:
        return record("raw", "version-mismatch", mismatch, "VersionMismatch")
    try:
        fn, args, kwargs = pickle.loads(body)
    except BaseException as e:  # noqa: BLE001 - any failure is reported, not raised
        return record(
            "raw",
            "bad-payload",
            "could not unpickle the call in the sandbox: %s: %s" % (_qualname(type(e)), e),
            _qualname(type(e)),
            traceback.format_exc(),
        )
    del body
    try:
        value = fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(e), e, tb))
        summary = "".join(traceback.format_exception_only(type(e), e)).strip()
        frames = _frames(tb)
        try:
            data = _dump_checked(cloudpickle, e)
        except BaseException as pe:  # noqa: BLE001
            return record(
                "raw",
                "unpicklable-exception",
                "%s (the exception could not be sent back: %s: %s)" % (summary, _qualname(type(pe)), pe),
                _qualname(type(e)),
                text,
                frames,
            )
        return record("err", "", summary, _qualname(type(e)), text, frames, data)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    try:
        data = _dump_checked(cloudpickle, value)
    except BaseException as pe:  # noqa: BLE001
        return record(
            "raw",
            "unpicklable-result",
            "the return value (a %s) could not be sent back: %s: %s"
            % (_qualname(type(value)), _qualname(type(pe)), pe),
            _qualname(type(pe)),
            traceback.format_exc(),
        )
    return record("ok", data=data)


def main(argv=None) -> int:
    argv = sys.argv if argv is None else argv
    job_dir = argv[1] if len(argv) > 1 else "/job"
    try:
        os.chdir(job_dir)
    except OSError as e:
        print("delegate_sandbox: cannot enter %s: %s" % (job_dir, e), file=sys.stderr)
        return 2
    rec = run(job_dir)
    try:
        out = encode_result(rec)
    except BaseException as e:  # noqa: BLE001 - never lose the error
        out = encode_result(
            record(
                "raw",
                rec.get("kind") or "unpicklable-result",
                "%s (and the result record could not be written: %s)" % (rec.get("summary", ""), e),
                str(rec.get("exc_type", "")),
                str(rec.get("traceback", "")),
            )
        )
    # A rank of a multi-node call (DELEGATE_RANK, set by the agent) writes
    # its own result.<rank>, and fails its task when the call failed, so
    # that the other ranks are ended.
    rank = os.environ.get("DELEGATE_RANK", "")
    name = "%s.%d" % (RESULT, int(rank)) if rank.isdigit() and len(rank) < 4 else RESULT
    try:
        _write_atomic(job_dir, name, out)
    except OSError as e:
        print("delegate_sandbox: cannot write the result: %s" % e, file=sys.stderr)
        if rec.get("traceback"):
            sys.stderr.write(rec["traceback"])
        return 3
    if name == RESULT and (rec["status"] == "err" or rec.get("kind") == "unpicklable-exception"):
        # The exception's type, for `delegate list` and `delegate.jobs()`
        # in any process ("raised ZeroDivisionError").
        try:
            _write_atomic(job_dir, RAISED, str(rec.get("exc_type", ""))[:200].encode("utf-8", "replace"))
        except OSError:
            pass
    if rec["status"] == "raw" and rec["kind"] in ("version-mismatch", "bad-payload"):
        print("delegate_sandbox: %s" % rec["summary"], file=sys.stderr)
    if name != RESULT and rec["status"] != "ok":
        return 1
    return 0
