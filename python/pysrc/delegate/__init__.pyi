"""Type stubs of the public API of ``delegate`` (everything in ``__all__``).
Keep in step with __init__.py, _futures.py and _jobs.py;
``python -m mypy.stubtest delegate`` checks them against the installed
package (tests/unit/test_stubs.py)."""

import concurrent.futures as cf
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from delegate._core import DelegateError as DelegateError
from delegate._core import JobRecord, JobStatus
from delegate._core import NoSuchJobError as NoSuchJobError
from delegate._core import SubmitError as SubmitError
from delegate._errors import JobFailed as JobFailed
from delegate._errors import JobTimedOut as JobTimedOut
from delegate._errors import RemoteError as RemoteError
from delegate._errors import RemoteTraceback as RemoteTraceback
from delegate._errors import VersionMismatchError as VersionMismatchError
from delegate._tensorboard import tensorboard as tensorboard

__all__ = [
    "Comparison",
    "DelegateError",
    "DelegateFuture",
    "Executor",
    "Job",
    "JobFailed",
    "JobTable",
    "JobTimedOut",
    "NoSuchJobError",
    "RemoteError",
    "RemoteFunction",
    "RemoteTraceback",
    "Repeated",
    "Stats",
    "SubmitError",
    "VersionMismatchError",
    "cancel",
    "compare",
    "jobs",
    "logs",
    "remote",
    "sbatch_count",
    "status",
    "tensorboard",
]

__version__: str
#: The environment variable choosing the backend: ``cluster`` or ``local``.
BACKEND_ENV: str

_P = ParamSpec("_P")
_R = TypeVar("_R")
_Backend = Literal["cluster", "local"]
_Size = str | int
_Duration = str | int

class DelegateFuture(cf.Future[Any]):
    """A ``concurrent.futures.Future`` of one call (a cluster job, or a local
    subprocess in local mode)."""

    job_id: str
    label: str
    def __init__(self, job_id: str, label: str = "") -> None: ...
    @property
    def state(self) -> str:
        """pending, running, completed, failed, timed-out, cancelled or lost."""
    @property
    def reason(self) -> str: ...
    @property
    def status(self) -> dict[str, Any]: ...
    @property
    def fingerprint(self) -> dict[str, Any] | None:
        """The machine the call ran on (None before it ended); unknown fields are None."""
    @property
    def outcome(self) -> str:
        """The state in the user's words (``done``, ``raised ZeroDivisionError``...)."""
    @property
    def stdout(self) -> str | None: ...
    @property
    def stderr(self) -> str | None: ...
    def running(self) -> bool: ...
    def cancel(self) -> bool: ...
    def result(self, timeout: float | None = None) -> Any: ...
    def exception(self, timeout: float | None = None) -> BaseException | None: ...

class RemoteFunction(Generic[_P, _R]):
    """A function that runs remotely: call it, ``submit`` it or ``map`` it."""

    def __init__(
        self,
        fn: Callable[_P, _R],
        *,
        backend: _Backend | None = None,
        repeat: int | None = None,
        warmup: int | None = None,
        **resources: Any,
    ) -> None: ...
    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R: ...
    def submit(self, *args: _P.args, **kwargs: _P.kwargs) -> DelegateFuture: ...
    def map(self, *iterables: Iterable[Any], timeout: float | None = None) -> list[_R]: ...
    def options(self, *, backend: _Backend | None = None, **resources: Any) -> RemoteFunction[_P, _R]: ...

@overload
def remote(
    fn: Callable[_P, _R],
    *,
    cpus: int | None = None,
    gpus: int | None = None,
    nodes: int | None = None,
    mem: _Size | None = None,
    time: _Duration | None = None,
    image: str | None = None,
    env: Mapping[str, str] | None = None,
    files: Sequence[str | os.PathLike[str]] | None = None,
    backend: _Backend | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
    mix_classes: bool | None = None,
) -> RemoteFunction[_P, _R]: ...
@overload
def remote(
    fn: None = None,
    *,
    cpus: int | None = None,
    gpus: int | None = None,
    nodes: int | None = None,
    mem: _Size | None = None,
    time: _Duration | None = None,
    image: str | None = None,
    env: Mapping[str, str] | None = None,
    files: Sequence[str | os.PathLike[str]] | None = None,
    backend: _Backend | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
    mix_classes: bool | None = None,
) -> Callable[[Callable[_P, _R]], RemoteFunction[_P, _R]]: ...

class Stats:
    """Statistics of one series of durations (seconds)."""

    seconds: list[float]
    min: float
    max: float
    median: float
    mad: float
    mean: float
    std: float
    outliers: list[int]
    unstable: bool
    def __init__(self, seconds: Sequence[float]) -> None: ...
    @property
    def warning(self) -> str | None: ...

class Repeated:
    """What ``repeat=N`` returns: ``values``, ``seconds``, ``stats``."""

    values: list[Any]
    seconds: list[float]
    warmup: int
    stats: Stats
    def __init__(self, values: Sequence[Any], seconds: Sequence[float], warmup: int) -> None: ...
    @property
    def value(self) -> Any: ...
    @property
    def warning(self) -> str | None: ...

class Comparison:
    """What ``compare(a, b, ...)`` returns: ``ratio`` a/b, its 95% ``ci``, both ``stats``."""

    names: tuple[str, ...]
    a: Stats
    b: Stats
    warmup: int
    ratio: float
    ci: tuple[float, float]
    def __init__(
        self, a_seconds: Sequence[float], b_seconds: Sequence[float], warmup: int, names: Sequence[str] = ...
    ) -> None: ...
    @property
    def warning(self) -> str | None: ...

def compare(
    a: Callable[..., Any],
    b: Callable[..., Any],
    *args: Any,
    repeat: int = 10,
    warmup: int = 1,
    kwargs: Mapping[str, Any] | None = None,
    backend: _Backend | None = None,
    **resources: Any,
) -> Comparison:
    """Times ``a`` against ``b``, interleaved in one sandbox: the ratio with its confidence interval."""

class Executor(cf.Executor):
    """A ``concurrent.futures.Executor``; ``map`` is one submission."""

    def __init__(
        self,
        cpus: int | None = None,
        gpus: int | None = None,
        mem: _Size | None = None,
        time: _Duration | None = None,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        backend: _Backend | None = None,
        files: Sequence[str | os.PathLike[str]] | None = None,
        mix_classes: bool | None = None,
    ) -> None: ...
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> DelegateFuture: ...
    def map(
        self,
        fn: Callable[..., _R],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[_R]: ...
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None: ...

class JobTable(list[JobRecord]):
    """Jobs as a table: HTML in a notebook, text in a terminal."""

    def _repr_html_(self) -> str: ...
    def classes(self) -> list[str]:
        """The hardware classes the listed calls ran on."""

def Job(job_id: str) -> DelegateFuture: ...  # noqa: N802
def status(job_ids: Iterable[str]) -> list[JobStatus]: ...
def cancel(job_ids: Iterable[str]) -> None: ...
def logs(job: str | DelegateFuture, follow: bool = False) -> None: ...
def sbatch_count() -> int: ...
def jobs(limit: int = 20, backend: _Backend | None = None) -> JobTable: ...
