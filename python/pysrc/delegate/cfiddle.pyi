# Stubs of delegate.cfiddle (CFiddle itself ships no type information).
from collections.abc import Callable, Sequence
from typing import Any

from cfiddle.Runner import RunnerDelegateException  # type: ignore[import-untyped]

from delegate import VersionMismatchError

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

DEFAULT_MAX_BYTES: int

class DelegatedRunError(RunnerDelegateException):  # type: ignore[misc]
    job_id: str
    def __init__(self, message: str, job_id: str = "") -> None: ...

class RunTooLarge(DelegatedRunError): ...
class CFiddleVersionMismatch(VersionMismatchError, RunnerDelegateException): ...  # type: ignore[misc]

class Delegate:
    resources: dict[str, Any]
    invocations_per_job: int | None
    max_bytes: int
    machine_columns: bool
    repeats: tuple[int, int]
    job_ids: list[str]
    def __init__(
        self,
        *,
        cpus: int | None = None,
        mem: str | int | None = None,
        time: str | int | None = None,
        image: str | None = None,
        env: dict[str, str] | None = None,
        invocations_per_job: int | None = None,
        max_bytes: int | None = None,
        machine_columns: bool = False,
        mix_classes: bool | None = None,
        repeat: int | None = None,
        warmup: int | None = None,
    ) -> None: ...
    def execute(self, command: Sequence[str], runner: Any) -> None: ...
    def run(self, runner: Any) -> Any: ...

MACHINE_FIELDS: tuple[str, ...]

def last_job_ids() -> list[str]: ...
def enable(
    *,
    cpus: int | None = None,
    mem: str | int | None = None,
    time: str | int | None = None,
    image: str | None = None,
    env: dict[str, str] | None = None,
    invocations_per_job: int | None = None,
    max_bytes: int | None = None,
    machine_columns: bool | None = None,
    mix_classes: bool | None = None,
    repeat: int | None = None,
    warmup: int | None = None,
) -> Callable[[], Delegate]: ...
def disable() -> None: ...
