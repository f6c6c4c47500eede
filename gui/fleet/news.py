"""The Fleet tab's news: the fleet's events (states, restarts, routes, fallback) as lines, each
with its time."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QPlainTextEdit, QWidget

from quantdeck.core.events import (
    AdviceEvent,
    FallbackEvent,
    InstanceEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
)

MAX_EVENT_LINES = 2000


class FleetNews(QPlainTextEdit):
    """The fleet's news, a line per event that has one (:func:`~quantdeck.core.fleet.rows.
    event_line`), the last :data:`MAX_EVENT_LINES` of them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(MAX_EVENT_LINES)
        self.setPlaceholderText("the fleet's events: states, restarts, routes, fallback")

    def add(self, event: InstanceEvent, recorded: bool = False) -> str | None:
        """``event``'s line, with the time now (``recorded``: the time it was recorded).
        Returns what an operator must not miss: a fallback, a restart, advice, a failed
        route, an instance crashed, hung or degraded (None: nothing of the kind)."""
        from quantdeck.core.fleet.rows import event_line

        ev = event.event
        t = getattr(ev, "t", None) if recorded else None
        stamp = time.localtime(t if isinstance(t, int | float) else None)
        line = event_line(event)
        alarm = None
        if line is not None:
            self.appendPlainText(f"{time.strftime('%H:%M:%S', stamp)}  {line}")
            failed_route = isinstance(ev, RouteEvent) and not ev.ok
            if isinstance(ev, FallbackEvent | RestartEvent | AdviceEvent) or failed_route:
                alarm = line
        if isinstance(ev, StateEvent) and ev.state in ("crashed", "hung", "degraded"):
            alarm = f"{event.instance} {ev.state}: {ev.reason or 'no reason given'}"
        return alarm
