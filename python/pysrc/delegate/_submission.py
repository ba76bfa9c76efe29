"""How a call becomes a submission: its resource keywords checked, the
function and its arguments pickled into a payload (the user's own module
by value), a label for the live line, and the payloads handed to a backend
(``delegate._backends``). The public API (``delegate``) and CFiddle's
``Delegate`` submit through here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import delegate_sandbox as _fmt
from delegate import _backends
from delegate._futures import DelegateFuture


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
    versions = (_fmt.python_version(), cloudpickle.__version__)
    return _backends.named(backend).submit(payloads, label, _resources(res), versions)


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


def _cancel_futures(futs, reason: str | None = None) -> None:
    """Cancels many futures: the cluster's with one scancel, local ones one
    by one; ``reason``, when given, says why in the user's words."""
    for backend, group in _backends.by_backend(futs, _backends.of_future):
        backend.cancel_futures(group, reason)
