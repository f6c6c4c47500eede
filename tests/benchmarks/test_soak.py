"""Seventy seconds of benchmarks/soak.py: the panel monitoring the loaded demo server keeps its
thread count and its memory.

The hour's goal (RSS growth <= 5 % after the first 5 minutes) is judged by the script itself
(``python benchmarks/soak.py --duration 3600``). Here the panel warms up for 30 s and is then
judged over 40 s: no thread more at any sample than at the end of the warm-up, and RSS
growth within :data:`RSS_BOUND_PCT`.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.server, pytest.mark.slow]

# Why 3 %: over the 40 s judged the panel draws 400 frames and takes 80 samples, and this
# process (pytest, the session server's supervisor, the panel) holds about 190 MiB, so 3 % is
# some 5.6 MiB: a leak of 15 KiB a frame (a curve's path kept) or 72 KiB a sample fails it,
# while what the process settled by after a 60 s warm-up (+0.24 %, 0.5 MiB, on 2026-12-03) is
# twelve times below it. A leak slow enough to pass here but break the hour's 5 % (about
# 1.5 KiB a sample) is what the hour of benchmarks/soak.py is for.
RSS_BOUND_PCT = 3.0
WARMUP_S = 30.0
DURATION_S = 70.0  # 40 s judged (it was 60: the suite's 20 minutes are tight)
EVERY_S = 5.0


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_panel_keeps_threads_and_memory_over_seventy_seconds(qtbot, demo_server) -> None:
    soak = _soak_module()
    lines: list[str] = []
    result = soak.soak(
        demo_server.url,
        demo_server.served_name,
        DURATION_S,
        every=EVERY_S,
        warmup=WARMUP_S,
        probe=False,
        out=lines.append,
    )
    report = "\n".join(lines + result.summary())
    print(report)
    after = result.after_warmup()
    assert len(after) >= int((DURATION_S - WARMUP_S) / EVERY_S), report  # a sample every 5 s
    assert max(s[2] for s in after) <= after[0][2], report  # no thread growth
    assert result.rss_growth_pct <= RSS_BOUND_PCT, report
    assert result.sent > 0 and result.completed + result.failed == result.sent, report
    assert result.failed == 0, report
