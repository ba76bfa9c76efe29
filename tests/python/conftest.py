"""Fixtures for the Python package's tests: the real local cluster (brought
up by `build_cluster.sh --local`; tests/run.sh runs it first), and a student
who runs Python scripts using the installed `delegate` package.

The tests run as root (they inspect Docker), but jobs must be submitted by an
ordinary user (the runner refuses uid 0): each test writes a small script and
runs it as `delegate-alice` with this interpreter (the test venv, which must
be readable by that user: tests/run.sh puts it under /var/lib/delegate).
Scripts print one line `RESULT: <json>` that the test reads.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import testlib

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def _problem() -> str | None:
    checks = testlib.DAEMON_CHECKS[:2]
    return testlib.cluster_problem(checks, ("/usr/local/bin/sandbox-runner",))


def _package_problem() -> str | None:
    r = subprocess.run([PYTHON, "-c", "import delegate"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"the delegate package is not installed in {PYTHON}: {r.stderr.strip()}"
    return None


@pytest.fixture(scope="session", autouse=True)
def cluster():
    yield from testlib.local_cluster(REPO, _problem, _package_problem)


@pytest.fixture(autouse=True)
def node_in_service(cluster):
    """Each test leaves the node in service (testlib.node_guard)."""
    yield from testlib.node_guard()


class Student:
    """Runs Python scripts as an ordinary user with the test interpreter."""

    def __init__(self, name: str):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.home = name, pw.pw_uid, Path(pw.pw_dir)
        self.root = self.home / ".delegate" / "jobs"
        self.scripts = Path(tempfile.mkdtemp(prefix="delegate-pytest-"))
        os.chmod(self.scripts, 0o755)

    def env(self) -> dict:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "DELEGATE_POLL_INTERVAL": "1",
        }

    def argv(self, *cmd) -> list[str]:
        """CMD as this student (testlib.as_user_argv)."""
        return testlib.as_user_argv(self.name, *cmd)

    def run(self, code: str, timeout: float = 300, name: str = "script") -> subprocess.CompletedProcess:
        path = self.scripts / f"{name}.py"
        path.write_text(textwrap.dedent(code))
        os.chmod(path, 0o644)
        return subprocess.run(
            self.argv(PYTHON, path),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            cwd="/",
        )

    def result(self, code: str, timeout: float = 300, name: str = "script"):
        """Runs `code` and returns (the RESULT json, the completed process)."""
        r = self.run(code, timeout, name)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT: ")]
        assert r.returncode == 0 and lines, (
            f"script failed (rc={r.returncode})\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}"
        )
        return json.loads(lines[-1][len("RESULT: ") :]), r

    def cleanup(self):
        shutil.rmtree(self.scripts, ignore_errors=True)


@pytest.fixture
def alice():
    s = Student("delegate-alice")
    yield s
    s.cleanup()


@pytest.fixture
def bob():
    """Another student (tests of what one student cannot see of another's)."""
    s = Student("delegate-bob")
    yield s
    s.cleanup()


containers_with_label = testlib.containers_with_label
