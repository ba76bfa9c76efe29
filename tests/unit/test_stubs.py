"""The package's typing: the stubs of the Rust extension (delegate/_core.pyi)
and of the public API (delegate/__init__.pyi) match the installed package
(mypy's stubtest: every function with its parameters, every exception and
attribute), and the wheel ships them with its py.typed marker. Needs no Slurm job, only the installed wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("module", ["delegate._core", "delegate"])
def test_stubs_match_the_package(tmp_path, module):
    """delegate/_core.pyi against the extension; delegate/__init__.pyi (the
    public API: everything in __all__) against the package."""
    pytest.importorskip("mypy.stubtest", reason="mypy is pinned in tests/requirements.txt")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", module, "--mypy-config-file", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # its cache, and never the source tree instead of the installed package
    )
    assert r.returncode == 0, f"stubtest: the stubs of {module} and the code differ\n{r.stdout}\n{r.stderr}"


def test_wheel_ships_stubs_and_py_typed():
    import delegate

    pkg = Path(delegate.__file__).parent
    assert (pkg / "_core.pyi").is_file()
    assert (pkg / "__init__.pyi").is_file()
    assert (pkg / "py.typed").is_file()


def test_every_public_exception_is_exported_and_documented():
    import delegate
    from delegate import _core

    for name in ("DelegateError", "NoSuchJobError", "SubmitError"):
        assert getattr(delegate, name) is getattr(_core, name)
    errors = [
        obj
        for obj in vars(delegate).values()
        if isinstance(obj, type) and issubclass(obj, BaseException) and not obj.__name__.startswith("_")
    ]
    assert {e.__name__ for e in errors} <= set(delegate.__all__)
    assert {"NoSuchJobError", "SubmitError", "JobFailed", "JobTimedOut"} <= {e.__name__ for e in errors}
    for e in errors:
        assert (e.__doc__ or "").strip(), f"{e.__name__} has no docstring"
    assert issubclass(delegate.NoSuchJobError, delegate.DelegateError)
    assert issubclass(delegate.SubmitError, delegate.DelegateError)


def test_extension_exceptions_pickle_round_trip():
    """A caller can pickle a NoSuchJobError (e.g. across a process pool): the
    extension's exceptions name their real module, delegate._core."""
    import pickle

    import delegate

    for cls in (delegate.DelegateError, delegate.NoSuchJobError, delegate.SubmitError):
        assert cls.__module__ == "delegate._core"
        back = pickle.loads(pickle.dumps(cls("no job abc")))
        assert type(back) is cls and str(back) == "no job abc"


def test_resource_keywords_agree_everywhere():
    """One list of resource keywords (delegate._RESOURCE_KEYS): remote(),
    Executor(), their stubs and the extension's submit_python take exactly
    these (Executor has no ``nodes``: a map's calls are one node each)."""
    import ast
    import inspect

    import delegate
    from delegate import _core

    keys = set(delegate._RESOURCE_KEYS)
    extra = {"fn", "self", "backend", "repeat", "warmup"}

    def kwargs(fn):
        return set(inspect.signature(fn).parameters) - extra

    assert kwargs(delegate.remote) == keys
    assert kwargs(delegate.Executor.__init__) == keys - {"nodes"}
    core = set(inspect.signature(_core.submit_python).parameters)
    assert core - {"payloads", "python_version", "cloudpickle_version"} == keys

    pkg = Path(delegate.__file__).parent
    tree = ast.parse((pkg / "__init__.pyi").read_text())
    stubs = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("remote", "__init__"):
            names = {a.arg for a in node.args.args + node.args.kwonlyargs} - extra
            if names & keys:
                stubs.setdefault(node.name, []).append(names)
    assert keys in stubs["remote"]
    assert keys - {"nodes"} in stubs["__init__"]
