"""The fast tier's Python tests (tests/run.sh stage 2): the package's pure
parts and the harness's own logic, against the installed wheel and fake
inputs only; no cluster, no daemon, no fixture that builds one."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
