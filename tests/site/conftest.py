"""The test site (tests/site/site.sh): a Debian 13 cluster with its own
Slurm 24.11, delegate's packages installed into it. Up once for the session,
down at its end (DELEGATE_SITE_KEEP=1 keeps it for a look by hand)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sitelib import Shell

REPO = Path(__file__).resolve().parent.parent.parent
SITE = REPO / "tests/site/site.sh"
# (testlib: the helpers every suite shares)
sys.path.insert(0, str(REPO / "tests"))


@pytest.fixture(scope="session")
def site():
    r = subprocess.run([str(SITE), "up"], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"tests/site/site.sh up failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    yield
    if os.environ.get("DELEGATE_SITE_KEEP") != "1":
        subprocess.run([str(SITE), "down"], capture_output=True, timeout=300)


@pytest.fixture
def root(site) -> Shell:
    return Shell("root")


@pytest.fixture
def alice(site) -> Shell:
    """A student of the course."""
    return Shell("alice")


@pytest.fixture
def rita(site) -> Shell:
    """A researcher: plain Slurm, in the general partition."""
    return Shell("rita")


@pytest.fixture
def ada(site) -> Shell:
    """A cluster admin (group delegate-admin)."""
    return Shell("ada")
