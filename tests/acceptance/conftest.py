"""The acceptance suite reuses the stack tests' helpers (tests/cluster)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_sessionstart(session):
    from stacklib import require_root

    require_root()
