"""delegate: run a Python function on a Slurm cluster, inside a single-use
Docker sandbox on a node allocated exclusively to it.

    import delegate

    @delegate.remote(cpus=2, time="5m")
    def measure(n):
        ...

    fut = measure.submit(1000)   # a concurrent.futures.Future, at once
    print(fut.result())          # the value, or the remote exception re-raised

    with delegate.Executor(time="2m") as ex:
        squares = list(ex.map(lambda x: x * x, range(50)))   # one sbatch

    delegate.Job(job_id).result()   # reattach from another process
    delegate.jobs()                 # your recent jobs: a table

Each submission shows one live line in a notebook (a map: one line with its
done/running/pending/failed counts), or a carriage-return line on a
terminal's stderr; nothing when stderr is not a terminal.

Local mode: ``backend="local"`` (``remote``, ``Executor``) or
``DELEGATE_BACKEND=local`` in the environment runs each call in a fresh
local subprocess, with no cluster and NO SANDBOX (see ``delegate._local``).

A remote exception is re-raised as its own type, its remote traceback as its
cause, delegate's own frames hidden; ``DELEGATE_TRACEBACK=full`` shows them.

The job handling (job directory, sbatch, squeue, scancel, waiting) is the
Rust core (``delegate._core``); Python does the pickling only.

Exceptions (see ``delegate._errors`` for the hierarchy): ``DelegateError``
for any failure of delegate itself, with ``NoSuchJobError`` (unknown job id)
and ``SubmitError`` (the job could not be submitted); ``RemoteError`` and
its subclasses ``VersionMismatchError``, ``JobFailed`` and ``JobTimedOut``
when a remote call fails without an exception of its own to re-raise.
"""

from __future__ import annotations

import codecs
import concurrent.futures as cf
import functools
import operator
import sys
import threading
import time as _time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from delegate import _backends, _core
from delegate._errors import (
    DelegateError,
    JobFailed,
    JobTimedOut,
    NoSuchJobError,
    RemoteError,
    RemoteTraceback,
    SubmitError,
    VersionMismatchError,
)
from delegate._futures import DelegateFuture
from delegate._jobs import JobTable, jobs
from delegate._submission import (
    _RESOURCE_KEYS as _RESOURCE_KEYS,
)
from delegate._submission import (
    MapResources,
    Resources,
    _cancel_futures,
    _given_resources,
    _label,
    _map_resources,
    _repeats,
    _resources,
    _submit,
    _submit_many,
)
from delegate._tensorboard import tensorboard
from delegate._traceback import hide as _hide_frames
from delegate_sandbox import measure as _measure
from delegate_sandbox.measure import Comparison, Repeated, Stats

if TYPE_CHECKING:
    from typing_extensions import ParamSpec, Unpack

    from delegate._core import JobStatus

    _P = ParamSpec("_P")
else:
    # Python 3.9 has no ParamSpec: at run time a plain TypeVar stands in.
    _P = TypeVar("_P")
_R = TypeVar("_R")
#: Where calls run: on the cluster, or in local subprocesses (not sandboxed).
Backend = Literal["cluster", "local"]

__all__ = [
    "Comparison",
    "DelegateError",
    "DelegateFuture",
    "Executor",
    "Job",
    "JobFailed",
    "JobTable",
    "JobTimedOut",
    "MapResources",
    "NoSuchJobError",
    "RemoteError",
    "RemoteFunction",
    "RemoteTraceback",
    "Repeated",
    "Resources",
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
__version__ = _core.__version__


class RemoteFunction(Generic[_P, _R]):
    """A function that runs on the cluster: calling it waits for the remote
    value; ``submit`` returns a future at once; ``map`` runs many calls in one
    sbatch."""

    def __init__(
        self,
        fn: Callable[_P, _R],
        *,
        backend: Backend | None = None,
        repeat: int | None = None,
        warmup: int | None = None,
        **resources: Unpack[Resources],
    ) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._resources = resources
        self._backend = backend
        self._repeats = _repeats(repeat, warmup)
        _resources(resources)  # validate early
        if backend is not None:
            _backends.named(backend)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        __tracebackhide__ = _hide_frames()
        return self.submit(*args, **kwargs).result()

    def submit(self, *args: _P.args, **kwargs: _P.kwargs) -> DelegateFuture:
        if self._repeats is None:
            return _submit(self._fn, args, kwargs, self._resources, self._backend)
        # The body N+K times in one sandbox, on the same cores: the value
        # is a delegate.Repeated (values, durations, statistics).
        repeat, warmup = self._repeats
        call = (self._fn, args, kwargs, repeat, warmup)
        return _submit(_measure.repeated, call, {}, self._resources, self._backend, _label(self._fn))

    def map(self, *iterables: Iterable[Any], timeout: float | None = None) -> list[_R]:
        __tracebackhide__ = _hide_frames()
        res: Any = self._resources  # (a multi-node call is no map: Executor refuses nodes)
        with Executor(backend=self._backend, **res) as ex:
            return list(ex.map(self._fn, *iterables, timeout=timeout))

    def options(
        self, *, backend: Backend | None = None, **resources: Unpack[Resources]
    ) -> RemoteFunction[_P, _R]:
        merged: Any = {**self._resources, **resources}
        return RemoteFunction(
            self._fn,
            backend=backend if backend is not None else self._backend,
            **merged,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Inside the sandbox (where delegate is not installed) a reference to
        # the decorated function is the plain function.
        return operator.itemgetter(0), ((self._fn,),)


@overload
def remote(
    fn: Callable[_P, _R],
    *,
    backend: Backend | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
    **resources: Unpack[Resources],
) -> RemoteFunction[_P, _R]: ...
@overload
def remote(
    fn: None = None,
    *,
    backend: Backend | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
    **resources: Unpack[Resources],
) -> Callable[[Callable[_P, _R]], RemoteFunction[_P, _R]]: ...
def remote(
    fn: Callable[_P, _R] | None = None,
    *,
    backend: Backend | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
    **resources: Unpack[Resources],
) -> RemoteFunction[_P, _R] | Callable[[Callable[_P, _R]], RemoteFunction[_P, _R]]:
    """Decorator: ``@delegate.remote`` or ``@delegate.remote(cpus=2, gpus=1,
    mem="2G", time="5m", image="delegate-sandbox:latest", env={"K": "v"})``.
    ``backend="local"`` runs each call in a local subprocess instead (not
    sandboxed); the default is $DELEGATE_BACKEND, else the cluster.
    ``nodes=N`` (N > 1): the function runs once per node, each with
    ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set, and the
    call returns the list of the ranks' return values (rank order).
    ``files=["data", "helpers.py"]``: copied into each call's job directory
    before submission (the call sees ``/job/data``, ``/job/helpers.py``);
    the local backend leaves them where they are.
    ``repeat=N, warmup=K``: each call runs the body K times unmeasured and
    N times measured in one sandbox on the same cores and returns a
    ``delegate.Repeated`` (``values``, ``seconds``, ``stats``: min, median ±
    MAD, mean ± std, outliers, and a warning when the spread is too wide to
    trust).
    ``mix_classes=True``: the calls of one ``map`` (and the nodes of a
    ``nodes=N`` call) may run on nodes of different hardware classes; by
    default they keep to one class when the cluster has several."""
    res: Any = _given_resources(resources)
    if fn is None:
        return lambda f: RemoteFunction(f, backend=backend, repeat=repeat, warmup=warmup, **res)
    return RemoteFunction(fn, backend=backend, repeat=repeat, warmup=warmup, **res)


def compare(
    a: Callable[..., Any],
    b: Callable[..., Any],
    *args: Any,
    repeat: int = 10,
    warmup: int = 1,
    kwargs: Mapping[str, Any] | None = None,
    backend: Backend | None = None,
    **resources: Unpack[Resources],
) -> Comparison:
    """Times ``a(*args, **kwargs)`` against ``b(*args, **kwargs)``: both in
    one sandbox on the same cores, interleaved (ABAB...), ``warmup`` pairs
    unmeasured then ``repeat`` measured. Returns a ``delegate.Comparison``:
    ``ratio`` (a's time over b's, the geometric mean of the paired ratios),
    its 95% confidence interval ``ci``, both series' ``stats`` and a
    ``warning`` when the figures cannot be trusted. ``resources`` as for
    ``delegate.remote`` (``time="5m"``, ``cpus=2``, ...)."""
    __tracebackhide__ = _hide_frames()
    if isinstance(a, RemoteFunction):
        a = a._fn
    if isinstance(b, RemoteFunction):
        b = b._fn
    reps = _repeats(repeat, warmup)
    assert reps is not None
    call = (a, b, args, dict(kwargs or {}), reps[0], reps[1])
    label = "compare %s/%s" % (_label(a), _label(b))
    return _submit(_measure.compared, call, {}, _given_resources(resources), backend, label).result()


class Executor(cf.Executor):
    """A ``concurrent.futures.Executor`` running each call in its own sandbox
    on the cluster. ``map`` submits all its calls in one sbatch.
    ``backend="local"`` runs each call in a fresh local subprocess instead
    (NOT sandboxed; for trying a notebook without a cluster); the default is
    $DELEGATE_BACKEND, else ``cluster``. A ``map``'s calls keep to one
    hardware class of nodes unless ``mix_classes=True``."""

    def __init__(self, *, backend: Backend | None = None, **resources: Unpack[MapResources]) -> None:
        self._resources = _map_resources(resources, "Executor()")
        _resources(self._resources)
        self._backend = None if backend is None else _backends.named(backend).name
        self._futures: list[DelegateFuture] = []
        self._lock = threading.Lock()
        self._shutdown = False

    def _track(self, futs):
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._futures = [f for f in self._futures if not f.done()] + list(futs)
        return futs

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> DelegateFuture:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        (fut,) = self._track(_submit_many(fn, [(args, kwargs)], self._resources, self._backend))
        return fut

    def map(
        self,
        fn: Callable[..., _R],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[_R]:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if isinstance(fn, RemoteFunction):
            fn = fn._fn
        calls: list[tuple[Sequence[Any], Mapping[str, Any]]] = [(args, {}) for args in zip(*iterables)]
        end = None if timeout is None else _time.monotonic() + timeout
        futs = self._track(_submit_many(fn, calls, self._resources, self._backend)) if calls else []

        def results() -> Iterator[_R]:
            __tracebackhide__ = _hide_frames()
            why = None
            try:
                for i, f in enumerate(futs):
                    left = None if end is None else max(0.0, end - _time.monotonic())
                    try:
                        value = f.result(left)
                    except BaseException as e:
                        why = _map_stopped(i, f, e)
                        raise
                    yield value
            finally:
                _cancel_futures([f for f in futs if not f.done()], why)

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            futs = list(self._futures)
        if cancel_futures:
            _cancel_futures([f for f in futs if not f.done()])
        if wait:
            cf.wait(futs)


def _map_stopped(i: int, fut, exc: BaseException) -> str:
    """Why a map dropped its remaining calls, in the user's words: ``call 5
    of this map raised ZeroDivisionError``."""
    if isinstance(exc, cf.TimeoutError) and not fut.done():
        return "the map's timeout ran out at call %d" % i
    if not fut.done() or fut.cancelled() or fut.exception() is not exc:
        # Interrupted while waiting (Ctrl-C), not the call's own failure.
        return "the map was stopped at call %d (%s)" % (i, type(exc).__name__)
    words = fut._words_now() if hasattr(fut, "_words_now") else ""
    if not words or words in ("done", "pending") or words.startswith("running"):
        words = "raised " + type(exc).__name__
    return "call %d of this map %s" % (i, words)


def Job(job_id: str) -> DelegateFuture:  # noqa: N802 - reads like a class
    """Reattaches to a job by id (from any process): the same kind of future.
    Raises ``NoSuchJobError`` when the delegate root holds no such job, and
    ``ValueError`` when ``job_id`` is not a job id at all. A local job
    (``local-...``) is found only in the process that ran it."""
    return _backends.of_job(job_id).job(job_id)


def status(job_ids: Iterable[str]) -> list[JobStatus]:
    """The status dicts of the given jobs (one Slurm query): ``id``,
    ``slurm_id``, ``state`` (pending, running, completed, failed, timed-out,
    cancelled or lost), ``reason``, ``exit_code``, ``refused``,
    ``oom_killed``, ``host``, ``submitted``/``started``/``finished`` (Unix
    seconds) and ``elapsed`` (seconds); ``None`` where not known yet.
    Raises ``NoSuchJobError`` for an unknown job. Local jobs (``local-...``)
    are known only to the process that ran them."""
    ids = list(job_ids)
    by_id: dict[str, Any] = {}
    for backend, group in _backends.by_backend(ids, _backends.of_job):
        by_id.update(zip(group, backend.statuses(group)))
    return [by_id[i] for i in ids]


def cancel(job_ids: Iterable[str]) -> None:
    """Cancels the jobs, pending or running (one scancel). Raises
    ``NoSuchJobError`` for an unknown job."""
    for backend, group in _backends.by_backend(job_ids, _backends.of_job):
        backend.cancel(group)


def logs(job: str | DelegateFuture, follow: bool = False) -> None:
    """Prints a cluster job's output: its stdout to ``sys.stdout``, its
    stderr to ``sys.stderr`` (``job``: a job id or a future). With
    ``follow``, as it is written, until the job is over (a notebook's cell
    shows it live; interrupt the kernel to stop following, the job goes
    on). Raises ``NoSuchJobError`` for an unknown job."""
    job_id = job.job_id if isinstance(job, DelegateFuture) else job
    outs = {"stdout": sys.stdout, "stderr": sys.stderr}
    if not follow:
        for name, out in outs.items():
            data = _core.read_file(job_id, name)
            if data:
                out.write(data.decode("utf-8", "replace"))
                out.flush()
        return
    decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in outs}

    def sink(stream: str, data: bytes) -> None:
        text = decoders[stream].decode(data)
        if text:
            outs[stream].write(text)
            outs[stream].flush()

    _core.follow_output(job_id, sink)


def sbatch_count() -> int:
    """How many sbatch calls this process made (the core counts them)."""
    return _core.sbatch_count()
