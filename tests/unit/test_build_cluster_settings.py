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


@pytest.mark.parametrize(
    "setting,want",
    [
        (
            {"DELEGATE_STACK_NAME": "my_stack"},
            "DELEGATE_STACK_NAME (stack.name in the settings file) must be",
        ),
        (
            {"DELEGATE_STACK_STAGING": "/run/a:b"},
            "DELEGATE_STACK_STAGING (stack.staging in the settings file) must be",
        ),
        (
            {"DELEGATE_ELASTIC_MIN": "3", "DELEGATE_ELASTIC_MAX": "2"},
            "DELEGATE_ELASTIC_MIN (3, elastic.min) is above DELEGATE_ELASTIC_MAX (2, elastic.max)",
        ),
    ],
)
def test_the_stacks_own_settings_are_the_schemas_to_check(setting, want):
    # (build_cluster.sh re-checked these with rules of its own)
    r = subprocess.run(
        [str(REPO / "build_cluster.sh"), "status"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **setting},
    )
    assert r.returncode != 0 and want in r.stderr, r.stderr
