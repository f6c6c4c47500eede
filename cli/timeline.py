"""``quantdeck timeline RECORDING...``: the Monitor's "Compare spans" from recordings.

The recordings (``serve --record``, ``monitor --record``, ``fleet up --record``) are read in
turn as one history (a fleet's: one per instance, each compared on its own; ``--instance
NAME`` picks one); their markers (launches, restarts, knob changes with their diff, fleet
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


def load_histories(files: list[str]) -> dict[str | None, list[Any]]:
    """The recordings read in turn (in the order they were made), as histories to compare:
    a server's (key None) and one per instance of a fleet's (core.monitor.histories)."""
    from quantdeck.core.monitor import histories, read_recording

    recs = [read_recording(f) for f in files]
    recs.sort(key=lambda r: r.header.when or 0.0)
    return histories(recs)


def _samples(recs: list[Any]) -> bool:
    from quantdeck.core.events import MetricsEvent

    return any(r.of(MetricsEvent) for r in recs)


def pick_history(
    files: list[str], groups: dict[str | None, list[Any]], instance: str | None
) -> list[Any]:
    """The one history to compare: the instance named, else the only one with samples; one
    line naming the instances when a fleet's recording holds several."""
    named = sorted(n for n in groups if n is not None)
    if instance is not None:
        if instance not in groups:
            held = f"its instances: {', '.join(named)}" if named else "no fleet instances"
            raise ConfigError(f"{', '.join(files)}: no instance '{instance}' ({held})")
        return groups[instance]
    sampled = [n for n, recs in groups.items() if _samples(recs)]
    if len(sampled) > 1:
        raise ConfigError(
            f"{', '.join(files)}: a fleet recording of instances {', '.join(map(str, sampled))}"
            ": compare one at a time (quantdeck timeline --instance NAME)"
        )
    return groups[sampled[0] if sampled else next(iter(groups))]


def compare_history(
    files: list[str], recs: list[Any], before: str | None = None, after: str | None = None
) -> tuple[Any, Any]:
    """(timeline, comparison) of one history; the spans as ``A..B`` texts or, both None, the
    spans either side of the latest marker."""
    from quantdeck.core.monitor import compare_spans, default_spans, store_of, timeline_of
    from quantdeck.core.monitor.timeline import parse_span

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


def load_comparison(
    files: list[str],
    before: str | None = None,
    after: str | None = None,
    instance: str | None = None,
) -> tuple[Any, Any]:
    """(timeline, comparison) of recordings read in turn: a server's, or one instance of a
    fleet's (``instance``; it may be left out when only one has samples)."""
    recs = pick_history(files, load_histories(files), instance)
    return compare_history(files, recs, before, after)


def _print(timeline: Any, cmp: Any) -> None:
    from quantdeck.core.monitor.timeline import describe

    if timeline.markers:
        print("markers:")
        for m in timeline.markers:
            print(
                f"  {m.t - cmp.origin:>8.0f} s  "
                + describe(m).split("  ", 1)[1].replace("\n", "\n" + " " * 14)
            )
    print(cmp.format())


def cmd_timeline(ns: argparse.Namespace) -> int:
    files: list[str] = ns.recordings
    groups = load_histories(files)
    fleet = any(name is not None for name in groups)
    if not fleet or ns.instance is not None or ns.report:
        timeline, cmp = compare_history(
            files, pick_history(files, groups, ns.instance), ns.before, ns.after
        )
        if ns.report:
            from quantdeck.gui.report import write_report  # the Monitor's Export: same page

            print(write_report([], Path(ns.report), comparison=cmp, markers=timeline.markers))
        if ns.json:
            print_json({**cmp.to_json(), "timeline": [m.to_json() for m in timeline.markers]})
        else:
            _print(timeline, cmp)
        return 0
    # a fleet's recording: each instance with samples (and a server's, given beside it),
    # compared on its own
    compared = [
        (name, *compare_history([f"{', '.join(files)}: {_label(name)}"], recs, ns.before, ns.after))
        for name, recs in groups.items()
        if _samples(recs)
    ]
    if not compared:
        raise ConfigError(f"{', '.join(files)}: no metrics samples to compare")
    if ns.json:
        rows = [
            {"instance": name, **cmp.to_json(), "timeline": [m.to_json() for m in tl.markers]}
            for name, tl, cmp in compared
        ]
        print_json({"instances": rows})
        return 0
    for i, (name, tl, cmp) in enumerate(compared):
        print(f"{'' if i == 0 else chr(10)}{_label(name)}:")
        _print(tl, cmp)
    return 0


def _label(name: str | None) -> str:
    return "the server" if name is None else f"instance {name}"


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
    sp.add_argument(
        "--instance",
        metavar="NAME",
        help="of a fleet's recording (fleet up --record), this instance only (default: each "
        "instance, compared on its own)",
    )
    sp.add_argument(
        "--json",
        action="store_true",
        help='print the comparison as JSON (a fleet\'s: {"instances": [...]}, one per instance)',
    )
    sp.add_argument("--report", metavar="DIR", help="also write it as an HTML report there")
