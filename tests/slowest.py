"""The slowest tests of a pytest JUnit XML report, one line each, for the
stage table tests/run.sh keeps (setup, call and teardown together).

    python tests/slowest.py REPORT.xml [N]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def slowest(report: str, n: int) -> list[tuple[float, str]]:
    cases = ET.parse(report).getroot().iter("testcase")
    timed = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in cases]
    return sorted(timed, reverse=True)[:n]


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        rows = slowest(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 8)
    except (OSError, ET.ParseError, ValueError) as e:
        print(f"slowest: cannot read {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    for secs, name in rows:
        print(f"{secs:6.0f}      {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
