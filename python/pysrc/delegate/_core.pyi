"""Type stubs of ``delegate._core``, the Rust core of the package (PyO3,
python/src/lib.rs): job directories, sbatch, squeue, scancel, waiting and the
readers. Every call that may block releases the GIL. Keep in step with
lib.rs; ``python -m mypy.stubtest delegate._core`` checks them against a
built wheel."""

from collections.abc import Callable, Sequence
from typing import TypedDict, type_check_only

__all__ = [
    "MAX_RESULT_BYTES",
    "RESULT",
    "STDERR",
    "STDOUT",
    "TENSORBOARD_ROUTE",
    "TERMINAL_STATES",
    "DelegateError",
    "NoSuchJobError",
    "SubmitError",
    "__version__",
    "cancel",
    "fingerprint",
    "follow_output",
    "job_dir",
    "jobs",
    "own_job_dir",
    "parse_duration_secs",
    "parse_size_bytes",
    "read_file",
    "root",
    "sbatch_count",
    "squeue_count",
    "status",
    "submit_python",
    "wait",
    "wake",
]

__version__: str
#: The states a job never leaves: completed, failed, timed-out, cancelled, lost.
TERMINAL_STATES: tuple[str, ...]
#: The largest result file read back, in bytes (the protocol's payload bound).
MAX_RESULT_BYTES: int
#: The job directory's file names of a call's output and its result
#: (protocol/src/layout.rs, the one list).
STDOUT: str
STDERR: str
RESULT: str
#: Where a student's Jupyter server serves a job's TensorBoard, below its
#: base URL (broker/client/src/tensorboard.rs).
TENSORBOARD_ROUTE: str

class DelegateError(Exception):
    """A delegate operation failed (submission, Slurm, the job directory)."""

class NoSuchJobError(DelegateError):
    """No job with this id in the delegate root."""

class SubmitError(DelegateError):
    """The job could not be submitted."""

@type_check_only
class JobStatus(TypedDict):
    """One job's status, as ``status``, ``wait`` and ``cancel`` return it.
    Times are Unix seconds; ``None`` where not known (yet)."""

    id: str
    slurm_id: str | None
    #: pending, running, completed, failed, timed-out, cancelled or lost
    state: str
    #: one human-readable sentence
    reason: str
    exit_code: int | None
    refused: bool
    oom_killed: bool
    host: str | None
    submitted: float | None
    started: float | None
    finished: float | None
    elapsed: float | None

@type_check_only
class JobRecord(JobStatus):
    """A status plus what the job runs, as ``jobs`` returns it."""

    #: the command line, or the Python function's name (``square()``)
    what: str
    #: the state in the user's words (``raised ZeroDivisionError``,
    #: ``cancelled: call 2 of this map raised ...``, else the state)
    outcome: str
    #: the CPU model of the machine the call ran on (None: not recorded)
    cpu: str | None
    #: its hardware class (CPU model, stepping, microcode, governor, boost, kernel)
    machine: str | None

def submit_python(
    payloads: Sequence[bytes],
    python_version: str,
    cloudpickle_version: str,
    *,
    cpus: int | None = None,
    gpus: int | None = None,
    nodes: int | None = None,
    mem: str | None = None,
    time: str | None = None,
    image: str | None = None,
    env: dict[str, str] | None = None,
    files: Sequence[str] | None = None,
    mix_classes: bool | None = None,
    retries: int | None = None,
) -> list[str]:
    """Submits Python calls (each payload one pickled call): one sbatch for
    all of them. Returns the job ids in order. Raises ``SubmitError``, or
    ``ValueError`` for a malformed ``mem`` or ``time``."""

def status(ids: Sequence[str]) -> list[JobStatus]:
    """The status of each job (one Slurm query for all)."""

def wait(ids: Sequence[str], timeout: float | None = None, any: bool = False) -> list[JobStatus]:
    """Waits up to ``timeout`` seconds (None: until all are over); with
    ``any``, returns as soon as one job is over or ``wake()`` is called."""

def wake() -> None:
    """Makes the waits in progress return early."""

def cancel(ids: Sequence[str], reason: str | None = None) -> list[JobStatus]:
    """Cancels the jobs (one scancel); ``reason``, in the user's words, is
    kept with each (their state reads ``cancelled: <reason>``); returns
    their statuses."""

def read_file(id: str, name: str, limit: int = ...) -> bytes | None:
    """A job's ``stdout``, ``stderr`` (at most ``limit`` bytes, 64 MiB by default),
    ``result`` or a multi-node call's ``result.<rank>``; None when the file
    does not exist."""

def follow_output(id: str, sink: Callable[[str, bytes], bool | None]) -> None:
    """Hands a job's output to ``sink(stream, data)`` as it is written
    (``stream`` "stdout" or "stderr"; ``data`` empty after a pause without
    news) until the job is over. A sink returning False, or an interrupt,
    ends it early; an exception in the sink is raised here."""

def fingerprint(id: str) -> str | None:
    """The machine a job's call ran on, as the worker's agent recorded it
    (JSON); None before the call ended or when the worker recorded none."""

def jobs(limit: int | None = None) -> list[JobRecord]:
    """The ``limit`` most recent jobs of the delegate root (all with None),
    oldest first, each with ``what`` it runs (one Slurm query for all)."""

def parse_duration_secs(s: str) -> int:
    """Seconds from ``90``, ``30s``, ``5m``, ``1h30m``; ValueError otherwise."""

def parse_size_bytes(s: str) -> int:
    """Bytes from ``512M``, ``2G``, ``1048576``; ValueError otherwise."""

def job_dir(id: str) -> str:
    """The job directory of a job."""

def own_job_dir(id: str) -> str:
    """The directory of one of the caller's own jobs (delegate-client
    `own_job_dir`); NoSuchJobError for any other id."""

def root() -> str:
    """The delegate root in use."""

def sbatch_count() -> int:
    """How many sbatch calls this process made."""

def squeue_count() -> int:
    """How many squeue calls this process made."""
