"""build_cluster.sh's settings are decided by delegate-deploy's schema,
whichever way they come (cluster.toml, the environment, the command line):
issue 57, item 1 (`--workers` bypassed the schema's 1-999)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("workers", ["1000", "0", "two"])
def test_a_worker_count_on_the_command_line_is_the_schemas_to_check(workers):
    # (refused before anything is made: no image, no swarm, no directory)
    env = {**os.environ, "DELEGATE_STACK_NAME": "delegate-settings-test"}
    r = subprocess.run(
        [str(REPO / "build_cluster.sh"), "deploy", "--workers", workers],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode != 0, r.stdout + r.stderr
    want = f"DELEGATE_STACK_WORKERS (stack.workers in the settings file) must be a whole number from 1 to 999, not '{workers}'"
    assert want in r.stderr, r.stderr
