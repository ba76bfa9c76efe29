"""Exceptions of the delegate package, all exported from ``delegate``::

    Exception
     ├── DelegateError             a delegate operation failed (raised by the Rust core)
     │    ├── NoSuchJobError       no job with this id in the delegate root
     │    ├── SubmitError          the job could not be submitted (sbatch, the job directory, the request)
     │    └── RemoteError          the remote call failed and cannot be re-raised as its own type
     │         ├── VersionMismatchError   Python or cloudpickle differ between caller and sandbox
     │         ├── JobFailed              the job ended without a result (refused, killed, lost)
     │         └── JobTimedOut            the job reached its time limit (also a TimeoutError)
     └── RemoteTraceback           the ``__cause__`` of a remote exception re-raised as its own type

An exception raised by the remote function itself is re-raised as its own
type (with a ``RemoteTraceback`` as its cause), not wrapped. Invalid
arguments (an unknown resource, a malformed ``mem``, ``time`` or job id)
raise ``TypeError`` or ``ValueError`` at once.
"""

from __future__ import annotations

from delegate._core import DelegateError, NoSuchJobError, SubmitError

__all__ = [
    "DelegateError",
    "JobFailed",
    "JobTimedOut",
    "NoSuchJobError",
    "RemoteError",
    "RemoteTraceback",
    "SubmitError",
    "VersionMismatchError",
]


class RemoteError(DelegateError):
    """The remote call failed in a way that cannot be re-raised as its own
    type: the exception or the return value could not be pickled in the
    sandbox or unpickled here, or the job ended without a result.

    ``remote_traceback`` holds the remote text, ``remote_type`` the name of
    the remote exception type (when there was one), ``job_id`` the job.
    """

    def __init__(
        self,
        message: str,
        remote_traceback: str = "",
        remote_type: str = "",
        job_id: str = "",
        kind: str = "",
    ):
        super().__init__(message)
        self.remote_traceback = remote_traceback
        self.remote_type = remote_type
        self.job_id = job_id
        self.kind = kind

    def __str__(self) -> str:
        msg = super().__str__()
        if self.remote_traceback:
            return "%s\n\nRemote traceback:\n%s" % (msg, self.remote_traceback.rstrip())
        return msg


class VersionMismatchError(RemoteError):
    """The caller's Python (major.minor) or cloudpickle (exact) version differs
    from the sandbox's; the message names both."""


class JobFailed(RemoteError):
    """The job ended without a result: refused by the site policy, killed
    (out of memory), lost, or the executor failed before writing one."""


class JobTimedOut(RemoteError, TimeoutError):
    """The job reached its time limit."""


class RemoteTraceback(Exception):
    """Attached as ``__cause__`` of a re-raised remote exception: its text is
    the remote traceback, with the caller's source lines filled in."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
