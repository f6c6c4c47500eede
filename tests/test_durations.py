"""The parallel pass's schedule hint: tests/durations.txt names modules that exist, and
packaging/test_durations.py makes a table from a real pytest report that the conftest reads
back as it was written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT, module_seconds


def test_the_table_names_only_modules_that_exist() -> None:
    table = module_seconds(ROOT / "tests" / "durations.txt")
    assert table, "tests/durations.txt is empty"
    missing = sorted(path for path in table if not (ROOT / path).is_file())
    assert not missing, f"remake tests/durations.txt (packaging/test_durations.py): {missing}"


def test_a_report_becomes_a_table_of_module_seconds_longest_first(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(
        "import time\ndef test_one(): time.sleep(0.3)\ndef test_two(): time.sleep(0.3)\n"
    )
    (tmp_path / "test_quick.py").write_text("def test_one(): pass\n")
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         f"--junitxml={report}", str(tmp_path)],
        cwd=tmp_path, check=True, capture_output=True,
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "test_durations.py"), str(report)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    table = tmp_path / "durations.txt"
    table.write_text(out)
    seconds = module_seconds(table)
    assert list(seconds) == ["test_slow.py", "test_quick.py"]  # longest first
    assert seconds["test_slow.py"] >= 0.6
    assert seconds["test_quick.py"] < 0.3


def test_an_absent_table_is_empty(tmp_path: Path) -> None:
    assert module_seconds(tmp_path / "none.txt") == {}
