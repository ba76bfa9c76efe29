"""Where calls run, behind one interface: the cluster (the Rust core: job
directories, one sbatch per submission, Slurm) and this machine (one
subprocess per call, ``delegate._local``, for trying a notebook without a
cluster). The public API picks a backend by name (``backend=`` or
``$DELEGATE_BACKEND``, read at each submission) or by job id (a local
job's id starts ``local-``) and never asks which one it has."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from delegate import _core, _local
from delegate._futures import DelegateFuture, attach, attach_many, mark_cancelled

#: The environment variable choosing the backend when none is given:
#: ``cluster`` (the default) or ``local``.
BACKEND_ENV = "DELEGATE_BACKEND"
LOCAL_PREFIX = "local-"


class Cluster:
    """Calls as Slurm jobs on the course's cluster."""

    name = "cluster"

    def submit(
        self, payloads: list[bytes], label: str, res: dict[str, Any], versions: tuple[str, str]
    ) -> list:
        if int(res.get("nodes") or 1) > 1 and len(payloads) > 1:
            raise ValueError("a multi-node call (nodes > 1) is submitted alone: no map or Executor")
        python, cloudpickle = versions
        ids = _core.submit_python(payloads, python, cloudpickle, **res)
        return attach_many(ids, label)

    def job(self, job_id: str) -> DelegateFuture:
        _core.status([job_id])  # validates the id and that the job exists
        return attach(job_id, job_id)

    def statuses(self, ids: Sequence[str]) -> list:
        return list(_core.status(list(ids))) if ids else []

    def cancel(self, ids: Sequence[str]) -> None:
        if ids:
            _core.cancel(list(ids))

    def cancel_futures(self, futs: Sequence[Any], reason: str | None) -> None:
        """One scancel for them all."""
        if not futs:
            return
        _core.cancel([f.job_id for f in futs], reason)
        for f in futs:
            mark_cancelled(f, reason)

    def recent(self, limit: int) -> list[Any]:
        return [dict(r) for r in _core.jobs(limit)] if limit else []


class Local:
    """Calls as subprocesses of this process (they live as long as it)."""

    name = "local"

    def submit(
        self, payloads: list[bytes], label: str, res: dict[str, Any], versions: tuple[str, str]
    ) -> list:
        if int(res.get("nodes") or 1) > 1:
            raise ValueError("nodes > 1 needs the cluster (the local backend runs one process per call)")
        return _local.submit(payloads, label, res)

    def job(self, job_id: str) -> DelegateFuture:
        return _local.job(job_id)

    def statuses(self, ids: Sequence[str]) -> list:
        return [_local.job(i).status for i in ids]

    def cancel(self, ids: Sequence[str]) -> None:
        for i in ids:
            _local.job(i).cancel()

    def cancel_futures(self, futs: Sequence[Any], reason: str | None) -> None:
        for f in futs:
            if f.cancel() and reason:
                f._words = "cancelled: " + reason
                f._changed()

    def recent(self, limit: int) -> list[Any]:
        return _local.statuses(limit)


CLUSTER = Cluster()
LOCAL = Local()
_BY_NAME = {b.name: b for b in (CLUSTER, LOCAL)}


def named(backend: str | None) -> Cluster | Local:
    """The backend of a submission: the one given, else $DELEGATE_BACKEND,
    else the cluster."""
    b = backend if backend is not None else (os.environ.get(BACKEND_ENV, "").strip() or "cluster")
    if b not in _BY_NAME:
        raise ValueError("unknown backend %r (expected %s)" % (b, " or ".join(_BY_NAME)))
    return _BY_NAME[b]


def of_job(job_id: str) -> Cluster | Local:
    """The backend that ran ``job_id``."""
    return LOCAL if job_id.startswith(LOCAL_PREFIX) else CLUSTER


def of_future(fut: Any) -> Cluster | Local:
    return LOCAL if isinstance(fut, _local.LocalFuture) else CLUSTER


def by_backend(items: Iterable[Any], key) -> list[tuple[Cluster | Local, list[Any]]]:
    """``items`` grouped by their backend (``key`` finds it), in the order
    the backends first appear."""
    groups: dict[str, tuple[Cluster | Local, list[Any]]] = {}
    for item in items:
        b = key(item)
        groups.setdefault(b.name, (b, []))[1].append(item)
    return list(groups.values())
