"""Where the Monitor's data comes from: the Launch tab's server (across its restarts), a fleet's
instance (across its promotions and undos, whatever URL it serves at) or an attached URL, each
with its own samples, markers, state and overlay; and the cue above the plots when the shown
source is stopped, starting, stale or no longer followed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.core.monitor.timeline import Timeline

# A live source whose newest sample is older than this is shown as stale.
STALE_S = 5.0


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


@dataclass
class MonitorSource:
    """Where the plotted data comes from: the Launch tab's server (across its restarts), a
    fleet's instance (across promotions: ``fleet`` is its fleet file) or an attached URL. Each
    keeps its own samples, markers, state and overlay (``instances``: a fleet's instances,
    name -> store, drawn while it is shown), so that following another never mixes or wipes
    them."""

    key: str
    label: str
    store: TimeSeriesStore
    timeline: Timeline = field(default_factory=Timeline)
    state: tuple[str, float] | None = None  # (the server's state, since when)
    fleet: str | None = None  # a fleet instance's fleet file (None: not a fleet's)
    instances: dict[str, TimeSeriesStore] = field(default_factory=dict)


SERVER_SOURCE = "server"  # the key of the Launch tab's server


def instance_key(fleet: str, name: str) -> str:
    """The source of instance ``name`` of the fleet in file ``fleet``: one key whatever URL
    it serves at (a promotion moves it to the candidate's port, an undo to another)."""
    return f"instance {name} of {fleet}"


def instance_label(fleet: str, name: str) -> str:
    """The instance in words: ``serve (behind the router)`` for the Launch tab's fleet of one
    (its file says so on its first line), else ``instance a of fleet NAME`` (its file's)."""
    from quantdeck.core.fleet.spec import is_fleet_of_one

    if fleet and is_fleet_of_one(Path(fleet)):
        return f"{name} (behind the router)"
    return f"instance {name} of fleet {Path(fleet).name or '?'}"


def source_cue(shown: MonitorSource, followed: MonitorSource, now: float) -> str:
    """The line above the plots for the ``shown`` source while ``followed`` is the one fed
    (empty: its samples come as they should)."""
    if shown.state is None:
        return ""
    state, since = shown.state
    last = shown.store.last_t
    if shown is not followed:
        return (
            f"■ {shown.label}: not followed since {clock(since)} ({state}); the plots "
            "hold what came until then"
        )
    if state in ("stopped", "crashed"):
        return f"■ {state} at {clock(since)}: no new samples; the plots hold what came until then"
    if state == "starting":
        return f"… starting since {clock(since)}: samples come once it is ready"
    if now - since > STALE_S and (last is None or now - last > STALE_S):
        ago = "" if last is None else f" since {clock(last)} ({now - last:.0f} s)"
        return f"⚠ no samples{ago}: the scrape is late or the server does not answer"
    return ""
