"""The package's typing: the pure-Python modules are typed inline (mypy
checks them as the installed package, and a user's typed code against
them), the Rust extension has the one stub file (delegate/_core.pyi),
which mypy's stubtest checks against the extension, and the wheel ships
them with the py.typed markers. Needs no Slurm job, only the installed
wheel."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MYPY = [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "/dev/null"]


def mypy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """mypy on ARGS from a scratch directory (never the source tree in place
    of the installed package)."""
    pytest.importorskip("mypy", reason="mypy is pinned in tests/requirements.txt")
    return subprocess.run([*MYPY, *args], capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_the_extensions_stub_matches_it(tmp_path):
    """delegate/_core.pyi against the extension (every function with its
    parameters, every exception and attribute)."""
    pytest.importorskip("mypy.stubtest", reason="mypy is pinned in tests/requirements.txt")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "delegate._core", "--mypy-config-file", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, f"stubtest: delegate/_core.pyi and the extension differ\n{r.stdout}\n{r.stderr}"


def test_the_package_type_checks_as_installed(tmp_path):
    r = mypy(tmp_path, "-p", "delegate", "-p", "delegate_sandbox")
    assert r.returncode == 0, f"mypy finds errors in the installed package\n{r.stdout}\n{r.stderr}"


def test_a_users_typed_code_is_checked_against_the_inline_types(tmp_path):
    """What a student's editor or mypy sees: a remote function keeps its
    signature and return type; an unknown resource keyword, ``nodes`` for a
    map and a wrong argument type are errors; the resource keywords are one
    TypedDict."""
    (tmp_path / "student.py").write_text(
        textwrap.dedent(
            """\
            import delegate

            @delegate.remote(cpus=2, time="5m")
            def square(x: int) -> int:
                return x * x

            y: int = square(3)
            fut: delegate.DelegateFuture = square.submit(4)
            many: list[int] = square.map([1, 2, 3])
            with delegate.Executor(time="1m", mix_classes=True) as ex:
                it = ex.map(square, [1, 2])
            res: delegate.Resources = {"cpus": 2, "nodes": 2}
            square("three")
            delegate.remote(cpuz=2)
            delegate.Executor(nodes=2)
            s: str = square(2)
            """
        )
    )
    r = mypy(tmp_path, "student.py")
    errors = [ln for ln in r.stdout.splitlines() if ": error:" in ln]
    assert [e.split(":")[1] for e in errors] == ["13", "14", "15", "16"], r.stdout
    assert 'incompatible type "str"; expected "int"' in errors[0], errors
    assert 'Unexpected keyword argument "cpuz"' in errors[1], errors
    assert 'Unexpected keyword argument "nodes" for "Executor"' in errors[2], errors
    assert 'expression has type "int", variable has type "str"' in errors[3], errors


def test_the_wheel_ships_one_stub_and_its_markers():
    import delegate
    import delegate_sandbox

    pkg = Path(delegate.__file__).parent
    assert sorted(p.name for p in pkg.glob("*.pyi")) == ["_core.pyi"]
    assert (pkg / "py.typed").is_file()
    assert (Path(delegate_sandbox.__file__).parent / "py.typed").is_file()


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
    """One definition of the resource keywords (delegate.Resources, a
    TypedDict; a map's, delegate.MapResources, all but ``nodes``):
    remote(), compare(), Executor() and CFiddle's Delegate take them as
    ``**resources`` of those types, and the extension's submit_python takes
    exactly these."""
    import inspect

    import delegate
    import delegate.cfiddle
    from delegate import _core

    keys = set(delegate.Resources.__annotations__)
    assert keys == set(delegate._RESOURCE_KEYS)
    assert set(delegate.MapResources.__annotations__) == keys - {"nodes"}
    core = set(inspect.signature(_core.submit_python).parameters)
    assert core - {"payloads", "python_version", "cloudpickle_version"} == keys
    for fn, typed in (
        (delegate.remote, "Resources"),
        (delegate.compare, "Resources"),
        (delegate.RemoteFunction.__init__, "Resources"),
        (delegate.Executor.__init__, "MapResources"),
        (delegate.cfiddle.Delegate.__init__, "MapResources"),
        (delegate.cfiddle.enable, "MapResources"),
    ):
        params = inspect.signature(fn).parameters
        assert not keys & set(params), f"{fn.__qualname__} lists resource keywords itself"
        assert str(params["resources"].annotation) == f"Unpack[{typed}]" or str(
            params["resources"].annotation
        ).endswith(f"Unpack[delegate.{typed}]"), (fn, params["resources"].annotation)
    with pytest.raises(TypeError, match="unknown resource 'cpuz'"):
        delegate.remote(cpuz=2)
    with pytest.raises(TypeError, match="Executor\\(\\) takes no nodes"):
        delegate.Executor(nodes=2)
