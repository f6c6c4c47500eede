"""Write tests/durations.txt, the parallel pass's schedule hint, from a JUnit XML report.

packaging/test.sh runs the tests that tolerate a neighbour on two workers, a module per
worker. Which module a free worker takes next is decided once, at the start: the longest
modules first, so that the pass ends with short ones and both workers finish together (the
longest-first rule). The lengths come from tests/durations.txt; a module missing there is
reckoned at 10 s per test that is not ``fast``. A stale table costs only time, never a result.

    .venv/bin/python -m pytest -m "not solo" --junitxml=/tmp/tests.xml
    .venv/bin/python packaging/test_durations.py /tmp/tests.xml > tests/durations.txt

The report's times are each test's setup, call and teardown (pytest's default), summed per
module.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter

HEADER = """\
# Seconds per test module in the parallel pass (packaging/test.sh), longest first: the
# order in which its workers take modules. Made by packaging/test_durations.py from a serial
# run's JUnit report; see there to remake it.
"""


def module_seconds(report: str) -> Counter[str]:
    """Seconds per module path (``tests/x/test_y.py``) in a JUnit report of pytest's."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if module is None:
            continue
        seconds["/".join(parts[: module + 1]) + ".py"] += float(case.get("time") or 0)
    return seconds


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: test_durations.py REPORT.xml > tests/durations.txt", file=sys.stderr)
        return 2
    sys.stdout.write(HEADER)
    for path, seconds in module_seconds(argv[0]).most_common():
        sys.stdout.write(f"{seconds:7.1f} {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
