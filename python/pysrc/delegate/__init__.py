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
import os
import sys
import threading
import time as _time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, overload

import delegate_sandbox as _fmt
from delegate import _core, _local
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
from delegate._futures import DelegateFuture, attach, attach_many, mark_cancelled
from delegate._jobs import JobTable, jobs
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


class MapResources(TypedDict, total=False):
    """What each call of a map asks for (``Executor``, CFiddle's
    ``Delegate``): the resource keywords, defined here once."""

    #: Cores, and GPUs (Slurm GRES), up to the site policy's maxima.
    cpus: int
    gpus: int
    #: Memory (``"2G"``, or bytes) and time limit (``"5m"``, or seconds).
    mem: str | int
    time: str | int
    #: The sandbox image, and the call's environment variables.
    image: str
    env: Mapping[str, str]
    #: Files and directories copied into the job directory (``/job/NAME``).
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    #: Let a map's calls spread over nodes of different hardware classes.
    mix_classes: bool
    #: Times a call runs again, on another node, when its node is lost
    #: mid-call (default 2, or the site's ``max_retries`` when lower; 0: it
    #: ends ``lost``). A call that raised, failed, ran out of time or was
    #: cancelled never runs again.
    retries: int


class Resources(MapResources, total=False):
    """The resource keywords of ``remote()`` and ``compare()``: a map's,
    and ``nodes`` (a multi-node call, one sandbox per node)."""

    nodes: int


#: The resource keywords (tests/unit/test_typing.py checks that the
#: extension's submit_python takes exactly these).
_RESOURCE_KEYS = tuple(Resources.__annotations__)


def _given_resources(res: Mapping[str, Any]) -> dict[str, Any]:
    """The resource keywords that were given (not None), ``files`` made a
    list; an unknown keyword is a TypeError."""
    for k in res:
        if k not in _RESOURCE_KEYS:
            raise TypeError("unknown resource %r (expected one of %s)" % (k, ", ".join(_RESOURCE_KEYS)))
    out = {k: v for k, v in res.items() if v is not None}
    if "files" in out:
        out["files"] = _files_list(out["files"])
    return out


#: The environment variable choosing the backend when none is given:
#: ``cluster`` (the default) or ``local``.
BACKEND_ENV = "DELEGATE_BACKEND"
_BACKENDS = ("cluster", "local")


def _backend(backend: str | None) -> str:
    """The backend of a submission: the one given, else $DELEGATE_BACKEND
    (read at each submission), else ``cluster``."""
    b = backend if backend is not None else (os.environ.get(BACKEND_ENV, "").strip() or "cluster")
    if b not in _BACKENDS:
        raise ValueError("unknown backend %r (expected %s)" % (b, " or ".join(_BACKENDS)))
    return b


def _cloudpickle() -> Any:
    import cloudpickle  # type: ignore[import-untyped]

    return cloudpickle


def _register_local_module(fn, cloudpickle) -> None:
    """Pickle by value the module of ``fn`` when it is the user's own file
    (not installed, not the standard library): the sandbox cannot import it."""
    modname = getattr(fn, "__module__", None)
    if not modname or modname == "__main__":
        return
    mod = sys.modules.get(modname)
    path = getattr(mod, "__file__", None)
    if mod is None or not path or "." in modname:
        return
    path = os.path.realpath(path)
    import sysconfig

    installed = {
        os.path.realpath(p)
        for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))
        if p
    }
    installed |= {os.path.realpath(p) for p in sys.path if "site-packages" in p or "dist-packages" in p}
    if any(path.startswith(d + os.sep) for d in installed):
        return
    try:
        cloudpickle.register_pickle_by_value(mod)
    except Exception:  # noqa: BLE001
        pass


def _payload(fn, args, kwargs) -> bytes:
    cloudpickle = _cloudpickle()
    _register_local_module(fn, cloudpickle)
    body = cloudpickle.dumps((fn, tuple(args), dict(kwargs)), protocol=4)
    return _fmt.encode_payload(body, _fmt.python_version(), cloudpickle.__version__, _label(fn, args))


def _label(fn, args: Sequence[Any] = ()) -> str:
    """What a call is named by (``delegate list`` and ``delegate.jobs()``
    add the ``()``; the live line): the function's name; for the batch of
    tasks Dask's local scheduler hands an executor, the tasks' names."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if name == "batch_execute_tasks" and getattr(fn, "__module__", None) == "dask.local":
        return _dask_label(args) or name
    return name


def _dask_label(args: Sequence[Any]) -> str | None:
    """``inc`` for dask.local's batch_execute_tasks([(key, ...), ...]): the
    names of the tasks (Dask's key_split: ``inc`` of ``'inc-3f2a...'``),
    each once, at most four."""
    try:
        from dask.utils import key_split  # type: ignore[import-untyped]

        names = list(dict.fromkeys(key_split(task[0]) for task in args[0]))
    except Exception:  # noqa: BLE001 (another Dask's shape: the plain name)
        return None
    if not names:
        return None
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def _map_resources(res: Mapping[str, Any], who: str) -> dict[str, Any]:
    """A map's resource keywords given (no ``nodes``: each call of a map
    runs on one node)."""
    if "nodes" in res:
        raise TypeError("%s takes no nodes: each call of a map runs on one node" % who)
    return _given_resources(res)


def _resources(res: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in res.items():
        if k not in _RESOURCE_KEYS:
            raise TypeError("unknown resource %r (expected one of %s)" % (k, ", ".join(_RESOURCE_KEYS)))
        if v is None:
            continue
        if k in ("mem", "time") and not isinstance(v, str):
            v = str(int(v))  # bytes / seconds
        if k == "env":
            v = {str(a): str(b) for a, b in dict(v).items()}
        if k == "mix_classes":
            v = bool(v)
        if k == "retries":
            v = int(v)
        if k == "files":
            if isinstance(v, (str, bytes, os.PathLike)):
                v = [v]
            # relative to where the call is made; bytes paths as the OS decodes them
            v = [os.path.abspath(os.fsdecode(p)) for p in v]
        out[k] = v
    return out


def _files_list(files: Any) -> Any:
    """``files=`` kept as a list (a generator would be used up by the first
    submission); one path stays as it is."""
    if files is None or isinstance(files, (str, bytes, os.PathLike)):
        return files
    return list(files)


def _submit_many(
    fn: Callable[..., Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    res: Mapping[str, Any],
    backend: str | None = None,
    label: str | None = None,
) -> list[DelegateFuture]:
    """Submits every (args, kwargs) of ``calls`` in one sbatch (or runs each
    in a local subprocess); returns futures, under one live line (``label``,
    default the function's name)."""
    cloudpickle = _cloudpickle()
    payloads = [_payload(fn, a, k) for a, k in calls]
    label = label or _label(fn, calls[0][0] if len(calls) == 1 else ())
    if _backend(backend) == "local":
        if int(res.get("nodes") or 1) > 1:
            raise ValueError("nodes > 1 needs the cluster (the local backend runs one process per call)")
        return _local.submit(payloads, label, _resources(res))
    if int(res.get("nodes") or 1) > 1 and len(payloads) > 1:
        raise ValueError("a multi-node call (nodes > 1) is submitted alone: no map or Executor")
    ids = _core.submit_python(payloads, _fmt.python_version(), cloudpickle.__version__, **_resources(res))
    return attach_many(ids, label)


def _submit(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    res: Mapping[str, Any],
    backend: str | None = None,
    label: str | None = None,
) -> DelegateFuture:
    (fut,) = _submit_many(fn, [(args, kwargs)], res, backend, label)
    return fut


def _repeats(repeat, warmup) -> tuple[int, int] | None:
    """``repeat``/``warmup`` checked: None when not repeating."""
    if repeat is None:
        if warmup:
            raise ValueError("warmup= needs repeat=")
        return None
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= 100_000:
        raise ValueError("repeat= must be a whole number from 1 to 100000, not %r" % (repeat,))
    warmup = 0 if warmup is None else warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= 100_000:
        raise ValueError("warmup= must be a whole number from 0 to 100000, not %r" % (warmup,))
    return repeat, warmup


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
            _backend(backend)

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
        self._backend = None if backend is None else _backend(backend)
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


def _cancel_futures(futs, reason: str | None = None) -> None:
    """Cancels many futures with one scancel (local ones one by one);
    ``reason``, when given, says why in the user's words."""
    local = [f for f in futs if isinstance(f, _local.LocalFuture)]
    futs = [f for f in futs if not isinstance(f, _local.LocalFuture)]
    for f in local:
        if f.cancel() and reason:
            f._words = "cancelled: " + reason
            f._changed()
    if not futs:
        return
    _core.cancel([f.job_id for f in futs], reason)
    for f in futs:
        mark_cancelled(f, reason)


def Job(job_id: str) -> DelegateFuture:  # noqa: N802 - reads like a class
    """Reattaches to a job by id (from any process): the same kind of future.
    Raises ``NoSuchJobError`` when the delegate root holds no such job, and
    ``ValueError`` when ``job_id`` is not a job id at all. A local job
    (``local-...``) is found only in the process that ran it."""
    if job_id.startswith("local-"):
        return _local.job(job_id)
    _core.status([job_id])  # validates the id and that the job exists
    return attach(job_id, job_id)


def status(job_ids: Iterable[str]) -> list[JobStatus]:
    """The status dicts of the given jobs (one Slurm query): ``id``,
    ``slurm_id``, ``state`` (pending, running, completed, failed, timed-out,
    cancelled or lost), ``reason``, ``exit_code``, ``refused``,
    ``oom_killed``, ``host``, ``submitted``/``started``/``finished`` (Unix
    seconds) and ``elapsed`` (seconds); ``None`` where not known yet.
    Raises ``NoSuchJobError`` for an unknown job. Local jobs (``local-...``)
    are known only to the process that ran them."""
    ids = list(job_ids)
    remote_ids = [i for i in ids if not i.startswith("local-")]
    cluster = _core.status(remote_ids) if remote_ids else []
    by_id = {st["id"]: st for st in cluster}
    return [_local.job(i).status if i.startswith("local-") else by_id[i] for i in ids]  # type: ignore[misc]


def cancel(job_ids: Iterable[str]) -> None:
    """Cancels the jobs, pending or running (one scancel). Raises
    ``NoSuchJobError`` for an unknown job."""
    ids = list(job_ids)
    for f in [_local.job(i) for i in ids if i.startswith("local-")]:
        f.cancel()
    cluster = [i for i in ids if not i.startswith("local-")]
    if cluster:
        _core.cancel(cluster)


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
