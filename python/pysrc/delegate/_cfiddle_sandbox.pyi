# Stubs of the function delegate.cfiddle runs in the sandbox (private).
from typing import Any

ROOT: str
TAIL: int
BOOT: str

def installed_version() -> str | None: ...
def mismatch(caller: str, here: str | None) -> str | None: ...
def run(files: dict[str, bytes], runner: bytes, caller_version: str) -> tuple[Any, ...]: ...
