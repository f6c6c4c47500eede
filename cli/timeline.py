"""``quantdeck timeline RECORDING...``: the Monitor's "Compare spans" from recordings.

The recordings (``serve --record``, ``monitor --record``, ``fleet up --record``) are read in
turn as one history; their markers (launches, restarts, knob changes with their diff, fleet
switches, benchmark runs) make its timeline. Two spans of it, in seconds since the first
sample (``--before A..B --after C..D``; by default the spans either side of the latest marker),
are compared: throughput, TTFT/ITL percentiles, KV use, prefix-cache hits, and the change
between them. ``--report DIR`` writes it as the HTML report the Monitor's Export writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantdeck.cli._common import AddCommand, print_json
from quantdeck.core.errors import ConfigError


def load_comparison(
    files: list[str], before: str | None = None, after: str | None = None
) -> tuple[Any, Any]:
    """(timeline, comparison) of recordings read in turn; the spans as ``A..B`` texts or,
    both None, the spans either side of the latest marker."""
    from quantdeck.core.monitor import (
        compare_spans,
        default_spans,
        read_recording,
        store_of,
        timeline_of,
    )
    from quantdeck.core.monitor.timeline import parse_span

    recs = [read_recording(f) for f in files]
    recs.sort(key=lambda r: r.header.when or 0.0)
    store = store_of(recs)
    timeline = timeline_of(recs)
    first, last = store.first_t, store.last_t
    if first is None or last is None:
        raise ConfigError(f"{', '.join(files)}: no metrics samples to compare")
    if (before is None) != (after is None):
        raise ConfigError("give both --before and --after, or neither")
    if before is not None and after is not None:
        spans = parse_span(before, first, last), parse_span(after, first, last)
    else:
        spans = default_spans(store, timeline)
    return timeline, compare_spans(store, *spans, timeline)


def cmd_timeline(ns: argparse.Namespace) -> int:
    from quantdeck.core.monitor.timeline import describe

    timeline, cmp = load_comparison(ns.recordings, ns.before, ns.after)
    if ns.report:
        from quantdeck.gui.report import write_report  # the Monitor's Export: same page

        print(write_report([], Path(ns.report), comparison=cmp, markers=timeline.markers))
    if ns.json:
        print_json(
            {**cmp.to_json(), "timeline": [m.to_json() for m in timeline.markers]},
        )
        return 0
    if timeline.markers:
        print("markers:")
        for m in timeline.markers:
            print(
                f"  {m.t - cmp.origin:>8.0f} s  "
                + describe(m).split("  ", 1)[1].replace("\n", "\n" + " " * 14)
            )
    print(cmp.format())
    return 0


def register(add: AddCommand) -> None:
    sp = add(
        "timeline",
        cmd_timeline,
        "compare two spans of recordings (throughput, TTFT/ITL, KV use, prefix hits) and the "
        "launches, knob changes, fleet switches and benchmark runs between them",
    )
    sp.add_argument(
        "recordings", nargs="+", metavar="RECORDING", help="recordings, read in turn as one"
    )
    sp.add_argument(
        "--before",
        metavar="A..B",
        help="seconds since the first sample (default: up to the latest marker)",
    )
    sp.add_argument(
        "--after", metavar="C..D", help="seconds since the first sample (default: from it on)"
    )
    sp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    sp.add_argument("--report", metavar="DIR", help="also write it as an HTML report there")
