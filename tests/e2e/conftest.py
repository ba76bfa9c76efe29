"""Fixtures for the end-to-end tests: a real Slurm (munged, slurmctld, slurmd)
and a real Docker engine on this machine, started by `build_cluster.sh --local`
(tests/run.sh runs it first). Nothing here is mocked: each test submits real
jobs through the installed `delegate` CLI as an ordinary (non-root) user.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import testlib

REPO = Path(__file__).resolve().parents[2]
DELEGATE = shutil.which("delegate") or "/usr/local/bin/delegate"
RUNNER = "/usr/local/bin/sandbox-runner"
IMAGE = os.environ.get("DELEGATE_SANDBOX_IMAGE", "delegate-sandbox:latest")


def sh(*args, check=True, timeout=120, **kw):
    return subprocess.run(list(args), check=check, timeout=timeout, capture_output=True, text=True, **kw)


def _daemon_problem() -> str | None:
    """Why the cluster cannot run jobs, or None when it can."""
    return testlib.cluster_problem(testlib.DAEMON_CHECKS, (DELEGATE, RUNNER))


@pytest.fixture(scope="session", autouse=True)
def cluster():
    yield from testlib.local_cluster(REPO, _daemon_problem)


@pytest.fixture(autouse=True)
def node_in_service(cluster):
    """Each test leaves the node in service (testlib.node_guard)."""
    yield from testlib.node_guard()


class User:
    """A student: runs the real CLI as their own uid."""

    def __init__(self, name: str):
        self.name = name
        pw = pwd.getpwnam(name)
        self.uid, self.gid, self.home = pw.pw_uid, pw.pw_gid, Path(pw.pw_dir)
        self.root = self.home / ".delegate" / "jobs"

    def run(self, *args, check=False, timeout=180, text=True, input=None, env_extra=None):
        """The CLI as the student; `env_extra` adds client settings
        (DELEGATE_ROOT, DELEGATE_CALLS_PER_ALLOCATION, ...)."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            **(env_extra or {}),
        }
        return subprocess.run(
            self.argv(DELEGATE, *args),
            capture_output=True,
            text=text,
            timeout=timeout,
            check=check,
            env=env,
            input=input,
            cwd="/",
        )

    def argv(self, *cmd) -> list[str]:
        """CMD as this student (testlib.as_user_argv)."""
        return testlib.as_user_argv(self.name, *cmd)

    def env(self, extra=None) -> dict:
        """What the student's shell has: a plain PATH, their HOME."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            **(extra or {}),
        }

    def as_user(self, *cmd, check=True, timeout=60, input=None, env_extra=None, in_home=False):
        """CMD as the student, its output captured; with env_extra or
        in_home, in the student's own environment (env) and home."""
        plain = env_extra is not None or in_home
        return subprocess.run(
            self.argv(*cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
            env=self.env(env_extra) if plain else None,
            cwd=str(self.home) if in_home else "/",
        )

    def popen(self, *cmd, **kw) -> subprocess.Popen:
        """CMD as the student in the background (Popen's options in kw)."""
        return subprocess.Popen(self.argv(*cmd), **kw)

    def held(self):
        """A held job of `true` (it waits until released): its id, its job
        directory, and a time just before it was submitted."""
        t0 = time.time() - 1
        job = self.submit("true", opts=("--hold",))
        return job, self.job_dir(job), t0

    def submit(self, *cmd, opts=()):
        r = self.run("submit", *opts, "--", *cmd)
        assert r.returncode == 0, f"submit failed: {r.stderr}"
        job = r.stdout.strip().splitlines()[-1]
        assert job, r.stdout
        return job

    def status(self, job: str) -> dict:
        r = self.run("status", "--json", job)
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        if isinstance(data, list):
            (data,) = [d for d in data if d["id"] == job]
        return data

    def wait(self, job: str, timeout: float = 120) -> dict:
        r = self.run("wait", "--json", "--timeout", f"{int(timeout)}s", job, timeout=timeout + 30)
        assert r.stdout, f"wait printed nothing: rc={r.returncode} {r.stderr}"
        return self.status(job)

    def wait_for_state(self, job: str, states, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(job)
            if st["state"] in states or time.monotonic() > deadline:
                return st
            time.sleep(0.2)

    def wait_started(self, job: str, timeout: float = 180) -> None:
        """Until the runner has recorded the container's start."""
        deadline = time.monotonic() + timeout
        while not (self.job_dir(job) / "started").exists():
            assert time.monotonic() < deadline, f"{job} did not start: {self.status(job)}"
            time.sleep(0.1)

    def job_dir(self, job: str) -> Path:
        return self.root / job


@pytest.fixture
def alice():
    return User("delegate-alice")


@pytest.fixture
def bob():
    return User("delegate-bob")


@pytest.fixture
def world_readable_tmp():
    """A fresh directory the students can reach (pytest's own is root's
    alone), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="delegate-e2e-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


containers_with_label = testlib.containers_with_label


def container_creates_since(since: float, label: str) -> list[str]:
    """Container create events for containers with `label` (`key` or
    `key=value`) since `since` (epoch secs): proves that no container was
    ever created, not just that none is left."""
    r = sh(
        "docker",
        "events",
        "--since",
        f"{since:.0f}",
        "--until",
        f"{time.time() + 1:.0f}",
        "--filter",
        "type=container",
        "--filter",
        "event=create",
        "--filter",
        f"label={label}",
        "--format",
        "{{.ID}}",
    )
    return r.stdout.split()


def containers_created_since(job: str, since: float) -> list[str]:
    """Container create events for a job's label since `since`."""
    return container_creates_since(since, f"delegate.job={job}")


record_started = testlib.record_started
