"""CFiddle experiments run on the cluster: a CFiddle ``RunnerDelegate``.

CFiddle (https://pypi.org/project/cfiddle/) compiles on the caller's side
and hands each ``run()`` to its ``RunnerDelegate_type``, which runs
``cfiddle-run --runner <pickle> --results <pickle>``. This one runs it in a
delegate sandbox on an exclusive node instead::

    import delegate.cfiddle
    from cfiddle import *

    delegate.cfiddle.enable(time="5m")          # every run() of this process
    exes = build(code(src), arg_map(OPTIMIZE=["-O0", "-O3"]))
    results = run(exes, "loop", arg_map(count=[1000, 10000]),
                  perf_counters=["PERF_COUNT_SW_TASK_CLOCK"])
    results.as_df()                             # the same table as locally

    with cfiddle_config(RunnerDelegate_type=delegate.cfiddle.Delegate):
        run(...)                                # one block only, default resources

How a run crosses over: the job directory is the only thing the sandbox
sees (mounted at ``/job``). The executables the run's invocations name (each
``.so`` CFiddle built, nothing else of the build directory) travel inside
the call's payload, at most ``max_bytes`` per job (default 64 MiB; past it,
:class:`RunTooLarge` before anything is submitted), and the sandbox writes
them under ``/job/cfiddle``. The runner pickle sent along is a copy of
CFiddle's own whose executables point there; the sandbox runs CFiddle's
runner on it in a child process (so a crash of the measured function is
reported, as locally) and sends back CFiddle's results pickle, whose results
are re-attached to the caller's own invocation objects: ``as_df()``,
``as_csv()`` and the rest see exactly what a local run gives.

A run of many invocations may be split (``invocations_per_job``) into
several calls of one submission (one sbatch; the map's allocations, one per
node, claim them one by one); the results come back as one list in the
original order.

CFiddle's version must be the same on both sides (both install
python/requirements-cfiddle.txt); a difference raises
:class:`CFiddleVersionMismatch`, a ``delegate.VersionMismatchError``.
Every error this module raises is also a CFiddle ``RunnerDelegateException``
(so CFiddle passes it through as it does its own); errors of CFiddle's
runner (a missing argument, an unknown perf counter) come back as CFiddle
raises them locally.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import pickle
import stat
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cfiddle.config as _config  # type: ignore[import-untyped]
from cfiddle.Builder import Executable  # type: ignore[import-untyped]
from cfiddle.Runner import RunnerDelegateException, SubprocessDelegate  # type: ignore[import-untyped]

import delegate
from delegate import _cfiddle_sandbox, _submission
from delegate._errors import DelegateError, VersionMismatchError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "DEFAULT_MAX_BYTES",
    "CFiddleVersionMismatch",
    "Delegate",
    "DelegatedRunError",
    "RunTooLarge",
    "disable",
    "enable",
    "last_job_ids",
]

#: Default bound on the bytes one job carries to the sandbox (executables
#: plus the runner pickle).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# The protocol's bound on a payload (delegate-protocol MAX_PAYLOAD_BYTES).
_PAYLOAD_BOUND = 256 * 1024 * 1024
# The job ids of the last delegated run of this process (last_job_ids()).
_last_job_ids: list[str] = []


class DelegatedRunError(RunnerDelegateException):
    """A delegated CFiddle run failed outside CFiddle: the job could not be
    submitted, ended without a result (refused, killed, timed out, lost), or
    CFiddle's runner crashed in the sandbox (a segfault in the measured
    function). ``job_id`` names the job (empty before submission); the
    delegate error, when there is one, is the ``__cause__``."""

    def __init__(self, message: str, job_id: str = ""):
        super().__init__(message)
        self.job_id = job_id


class RunTooLarge(DelegatedRunError):
    """The executables a job of the run needs exceed the bound on what one
    job may carry to the sandbox (``max_bytes``); nothing was submitted."""


class CFiddleVersionMismatch(VersionMismatchError, RunnerDelegateException):
    """CFiddle's version differs between the caller and the sandbox; the
    message names both (as ``delegate.VersionMismatchError`` does for
    Python and cloudpickle)."""


def _caller_version() -> str:
    return importlib.metadata.version("cfiddle")


def _human(n: int) -> str:
    return "%.1f MiB" % (n / (1024 * 1024)) if n >= 1024 * 1024 else "%d bytes" % n


def _read_bounded(path: str, left: int) -> bytes | None:
    """The file's bytes, or None when it is larger than ``left``. Only a
    regular file (an executable CFiddle built), read without following a
    last symlink into a device or FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DelegatedRunError("%s is not a regular file: CFiddle's executables are" % path)
        if st.st_size > left:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(left + 1)
        return None if len(data) > left else data
    finally:
        os.close(fd)


def _sandbox_config() -> dict:
    """CFiddle's configuration for the runner in the sandbox: the caller's,
    minus what only makes sense here (this delegate, notebook widgets)."""
    from cfiddle.config import noop_progress_bar  # type: ignore[import-untyped]
    from cfiddle.source import InstrumentedExecutable  # type: ignore[import-untyped]

    cfg = _config.peek_config()
    cfg["RunnerDelegate_type"] = SubprocessDelegate
    cfg["ProgressBar"] = noop_progress_bar
    cfg["Executable_type"] = InstrumentedExecutable
    cfg["CFIDDLE_BUILD_ROOT"] = _cfiddle_sandbox.ROOT + "/builds"
    return cfg


def _plain_executable(exe: Any, lib: str, build_dir: str) -> Executable:
    """A copy of ``exe`` as a plain CFiddle ``Executable`` (the notebook's
    subclass would make the sandbox import IPython) pointing into the
    sandbox."""
    plain = Executable.__new__(Executable)
    plain.__dict__.update(vars(exe))
    plain.lib, plain.build_dir = lib, build_dir
    return plain


class _Job:
    """One call of a run: some invocations, the files they need, the
    runner pickle for the sandbox."""

    def __init__(self, runner: Any, invocations: list, max_bytes: int, index: int, count: int):
        self.invocations = invocations
        self.files: dict[str, bytes] = {}
        where = "this run" if count == 1 else "job %d of %d of this run" % (index + 1, count)
        staged: dict[str, Executable] = {}
        sizes: list[tuple[int, str]] = []
        left = max_bytes
        copies = []
        for inv in invocations:
            lib = inv.executable.lib
            key = os.path.realpath(lib)
            if key not in staged:
                rel = "exe%d/%s" % (len(staged), os.path.basename(lib))
                try:
                    data = _read_bounded(lib, left)
                except OSError as e:
                    raise DelegatedRunError("cannot read the executable %s: %s" % (lib, e)) from None
                if data is None:
                    size = os.stat(lib).st_size
                    raise RunTooLarge(
                        "%s needs more than the %s a delegated CFiddle run may send to the sandbox per job: "
                        "%s is %s after %s of other executables (%s). Build fewer variants per run, split "
                        "the run (invocations_per_job=...) or raise the bound (max_bytes=..., at most %s)."
                        % (
                            where,
                            _human(max_bytes),
                            lib,
                            _human(size),
                            _human(max_bytes - left),
                            ", ".join("%s %s" % (p, _human(n)) for n, p in sorted(sizes, reverse=True)[:3])
                            or "none",
                            _human(_PAYLOAD_BOUND // 2),
                        )
                    )
                left -= len(data)
                sizes.append((len(data), lib))
                self.files[rel] = data
                d = "%s/%s" % (_cfiddle_sandbox.ROOT, os.path.dirname(rel))
                staged[key] = _plain_executable(inv.executable, "%s/%s" % (_cfiddle_sandbox.ROOT, rel), d)
            c = copy.copy(inv)
            c.executable = staged[key]
            copies.append(c)
        from cfiddle.config import noop_progress_bar

        there = copy.copy(runner)
        there._invocations = copies
        there._cmd_runner = SubprocessDelegate
        there._progress_bar = noop_progress_bar
        cloudpickle = _submission._cloudpickle()
        self.runner = cloudpickle.dumps(dict(config=_sandbox_config(), runner=there), protocol=4)
        if len(self.runner) > left:
            raise RunTooLarge(
                "%s needs more than the %s a delegated CFiddle run may send to the sandbox per job "
                "(the executables take %s, CFiddle's runner pickle %s); split the run "
                "(invocations_per_job=...) or raise max_bytes."
                % (where, _human(max_bytes), _human(max_bytes - left), _human(len(self.runner)))
            )


class Delegate:
    """A CFiddle ``RunnerDelegate`` that runs ``cfiddle-run`` in a delegate
    sandbox on an exclusive node. ``cfiddle_config(RunnerDelegate_type=
    delegate.cfiddle.Delegate)`` uses the default resources; :func:`enable`
    sets one with resources for the whole process.

    ``cpus``, ``gpus``, ``mem``, ``time``, ``image``, ``env``, ``files``,
    ``mix_classes``: a map's resource keywords (``delegate.MapResources``),
    as for ``delegate.remote`` (``time`` is each job's limit).
    ``invocations_per_job``: split a run into jobs of at most this many
    invocations (one submission; default: one job per run).
    ``max_bytes``: bound on what one job carries to the sandbox (default
    :data:`DEFAULT_MAX_BYTES`).
    ``machine_columns``: add the machine each measurement ran on to every
    row of the results (``machine_node``, ``machine_cpu_model``,
    ``machine_microcode``, ``machine_governor``, ``machine_boost``,
    ``machine_hardware_counters``: the call's fingerprint; None where the
    node cannot tell). Whatever this says, a run whose jobs ran on more than
    one hardware class warns (``UserWarning``) and lists them.
    ``repeat``, ``warmup``: run each job's invocations ``warmup`` times
    unmeasured, then ``repeat`` times, in one sandbox on the same cores; the
    table has ``repeat`` rows per measurement, told apart by the column
    ``repeat`` (0 to repeat-1), e.g. ``df.groupby(...)["..."].median()``.
    ``mix_classes``: let the jobs of one run (``invocations_per_job``) run
    on nodes of different hardware classes; by default they keep to one.
    """

    def __init__(
        self,
        *,
        invocations_per_job: int | None = None,
        max_bytes: int | None = None,
        machine_columns: bool = False,
        repeat: int | None = None,
        warmup: int | None = None,
        **resources: Unpack[delegate.MapResources],
    ) -> None:
        self.machine_columns = bool(machine_columns)
        self.repeats = _submission._repeats(repeat, warmup) or (1, 0)
        self.resources: dict[str, Any] = _submission._map_resources(resources, "Delegate()")
        _submission._resources(self.resources)  # TypeError/ValueError at once
        if invocations_per_job is not None and int(invocations_per_job) < 1:
            raise ValueError("invocations_per_job must be at least 1")
        self.invocations_per_job = None if invocations_per_job is None else int(invocations_per_job)
        self.max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else int(max_bytes)
        if not 0 < self.max_bytes <= _PAYLOAD_BOUND // 2:
            raise ValueError("max_bytes must be between 1 and %d" % (_PAYLOAD_BOUND // 2))
        #: The ids of the jobs of the last run (empty before one).
        self.job_ids: list[str] = []

    def execute(self, command: Sequence[str], runner: Any) -> None:
        """CFiddle's entry point: runs ``runner``'s invocations in the
        sandbox and writes the results pickle ``cfiddle-run`` would have
        written (the path after ``--results`` in ``command``)."""
        args = list(command)
        try:
            results_path = args[args.index("--results") + 1]
        except (ValueError, IndexError):
            raise DelegatedRunError("not a cfiddle-run command line: %r" % (args,)) from None
        out = self.run(runner)
        with open(results_path, "wb") as f:
            pickle.dump(out, f)

    def _jobs(self, runner: Any) -> list[_Job]:
        invocations = list(runner.get_invocations())
        n = self.invocations_per_job or max(1, len(invocations))
        chunks = [invocations[i : i + n] for i in range(0, len(invocations), n)] or [[]]
        return [_Job(runner, c, self.max_bytes, i, len(chunks)) for i, c in enumerate(chunks)]

    def run(self, runner: Any) -> Any:
        """The results list of ``runner`` (CFiddle's own type), or the
        CFiddle exception its runner reported (as ``cfiddle-run`` pickles
        it). Raises :class:`DelegatedRunError` and its subclasses."""
        jobs = self._jobs(runner)
        cloudpickle = _submission._cloudpickle()
        cloudpickle.register_pickle_by_value(_cfiddle_sandbox)
        version = _caller_version()
        calls: list[tuple[Sequence[Any], dict[str, Any]]] = [
            ((job.files, job.runner, version, *self.repeats), {}) for job in jobs
        ]
        try:
            futs = _submission._submit_many(_cfiddle_sandbox.run, calls, self.resources)
        except DelegateError as e:
            raise DelegatedRunError("the CFiddle run could not be submitted: %s" % e) from e
        self.job_ids = [f.job_id for f in futs]
        _last_job_ids[:] = self.job_ids
        try:
            answers = [self._answer(f) for f in futs]
        except BaseException:
            _submission._cancel_futures([f for f in futs if not f.done()])
            raise
        out = runner._result_list_factory()
        for job, (fut, answer) in zip(jobs, zip(futs, answers)):
            results = self._decode(fut.job_id, answer)
            if isinstance(results, BaseException):
                return results
            results = list(results)
            if len(results) != len(job.invocations):
                raise DelegatedRunError(
                    "delegate job %s returned %d results for %d invocations"
                    % (fut.job_id, len(results), len(job.invocations)),
                    fut.job_id,
                )
            for r, inv in zip(results, job.invocations):
                if hasattr(r, "invocation"):
                    r.invocation = inv  # the caller's own executable, paths and all
            if self.machine_columns:
                _add_machine(results, fut.fingerprint)
            out.extend(results)
        _warn_classes(futs)
        return out

    @staticmethod
    def _answer(fut: Any) -> tuple:
        try:
            answer = fut.result()
        except VersionMismatchError as e:
            raise CFiddleVersionMismatch(str(e), job_id=fut.job_id, kind="version-mismatch") from e
        except DelegateError as e:
            raise DelegatedRunError("delegate job %s: %s" % (fut.job_id, e), fut.job_id) from e
        if not isinstance(answer, tuple) or not answer:
            raise DelegatedRunError(
                "delegate job %s: unexpected answer %r" % (fut.job_id, answer), fut.job_id
            )
        if answer[0] == "version-mismatch":
            raise CFiddleVersionMismatch(
                "job %s: %s" % (fut.job_id, answer[1]), job_id=fut.job_id, kind="version-mismatch"
            )
        if answer[0] == "crashed":
            code, stdout, stderr = answer[1:4]
            raise DelegatedRunError(
                "delegate job %s: cfiddle-run failed in the sandbox (error code %s): %s %s"
                % (fut.job_id, code, stdout.strip(), stderr.strip()),
                fut.job_id,
            )
        return answer

    @staticmethod
    def _decode(job_id: str, answer: tuple) -> Any:
        try:
            return pickle.loads(answer[1])
        except Exception as e:  # noqa: BLE001
            raise DelegatedRunError(
                "delegate job %s: CFiddle's results could not be unpickled here: %s: %s"
                % (job_id, type(e).__name__, e),
                job_id,
            ) from None


#: The fingerprint fields ``machine_columns`` adds to each result row.
MACHINE_FIELDS = ("node", "cpu_model", "microcode", "governor", "boost", "hardware_counters")


def _add_machine(results: list, fingerprint: dict | None) -> None:
    """Adds ``machine_<field>`` to every measurement row of ``results``."""
    fp = fingerprint or {}
    cols = {"machine_" + k: fp.get(k) for k in MACHINE_FIELDS}
    for r in results:
        for row in getattr(r, "results", None) or []:
            if isinstance(row, dict):
                row.update(cols)


def _warn_classes(futs: list) -> None:
    """Warns when the jobs of one run ran on more than one hardware class:
    their figures should not be compared."""
    classes = sorted({str(fp["class"]) for fp in (f.fingerprint for f in futs) if fp and fp.get("class")})
    if len(classes) > 1:
        warnings.warn(
            "this CFiddle run's jobs ran on %d machine classes; compare only results of one: %s"
            % (len(classes), "; ".join(classes)),
            stacklevel=3,
        )


def last_job_ids() -> list[str]:
    """The delegate job ids of the last delegated ``run()`` of this process,
    in the order of its invocations (for ``delegate.Job``, the CLI, logs)."""
    return list(_last_job_ids)


def enable(
    *,
    invocations_per_job: int | None = None,
    max_bytes: int | None = None,
    machine_columns: bool | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
    **resources: Unpack[delegate.MapResources],
) -> Callable[[], Delegate]:
    """Makes every CFiddle ``run()`` of this process run on the cluster with
    these resources (see :class:`Delegate`). Returns the ``RunnerDelegate_type``
    it set (a factory of :class:`Delegate`)."""
    kw: dict[str, Any] = dict(
        invocations_per_job=invocations_per_job,
        max_bytes=max_bytes,
        machine_columns=machine_columns,
        repeat=repeat,
        warmup=warmup,
        **resources,
    )
    kw = {k: v for k, v in kw.items() if v is not None}
    Delegate(**kw)  # validate now, not at the first run()
    factory = functools.partial(Delegate, **kw)
    _set_everywhere(factory)
    return factory


def disable() -> None:
    """Makes CFiddle run locally again (its ``SubprocessDelegate``)."""
    _set_everywhere(SubprocessDelegate)


def _set_everywhere(value: Any) -> None:
    # Every level of CFiddle's configuration stack: the whole process, also
    # inside a cfiddle_config block that is open now.
    for cfg in _config.cfiddle_config_stack:
        cfg["RunnerDelegate_type"] = value
