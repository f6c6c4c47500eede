"""The instance Monitor, Logs and Playground follow (the Fleet tab's Open in Monitor): its log
at once, its events as they come, its URL while it serves, wherever a promotion moves it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from quantdeck.core.events import Event, FactEvent, LogEvent

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet
    from quantdeck.core.fleet.rows import FleetRows

LOG_REPLAY = 500  # the chosen instance's last log lines, shown in Logs when it is chosen


class ChosenInstance(QObject):
    """The instance of ``rows()`` (of ``fleet()``, None when none runs) that the other tabs
    follow: ``attach(url, key, show)`` points Monitor and Playground at it, again when its URL
    changes; ``instance_event`` carries its own events (its log, its states) to Logs; ``say``
    tells why it is not attached yet."""

    # url, API key ("" for none), whether to show the Monitor
    attach = Signal(str, str, bool)
    instance_event = Signal(object)

    def __init__(
        self,
        rows: Callable[[], FleetRows | None],
        fleet: Callable[[], Fleet | None],
        say: Callable[[str], None],
        parent: QObject,
    ) -> None:
        super().__init__(parent)
        self._rows, self._fleet, self._say = rows, fleet, say
        self.name: str | None = None  # the instance followed
        self._url: str | None = None  # the URL the tabs were pointed at (None: not yet)

    def choose(self, name: str, show: bool = True) -> None:
        """Follow instance ``name``: its recent log lines go to Logs at once, then its events
        as they come; Monitor and Playground attach to it when it serves (a crashed one: its
        log is what there is to see), and follow it when its URL changes (a promotion).
        ``show``: the window shows the Monitor."""
        rows = self._rows()
        if rows is None or name not in rows:
            return
        row = rows.row(name)
        if row.is_router:
            return
        self.name, self._url = row.name, None
        self.instance_event.emit(FactEvent("fleet instance", row.name))  # a mark in Logs
        fleet = self._fleet()
        server = fleet.servers.get(row.name) if fleet is not None else None
        for line in list(server.log_tail)[-LOG_REPLAY:] if server is not None else []:
            self.instance_event.emit(LogEvent(line))
        if row.serving:
            self._url = row.url
            self.attach.emit(row.url, row.api_key or "", show)
        else:
            self._say(
                f"{row.name} is {row.state}: its log is in the Logs tab; Monitor and "
                "Playground follow it once it serves"
            )

    def follow_url(self) -> None:
        """The chosen instance serves at another URL (a promotion gives it the candidate's,
        an undo the one before): Monitor and Playground follow it there."""
        rows = self._rows()
        if rows is None or self.name is None or self.name not in rows:
            return
        row = rows.row(self.name)
        if row.serving and self._url is not None and row.url != self._url:
            self._url = row.url
            self.attach.emit(row.url, row.api_key or "", False)

    def on_event(self, name: str, ev: Event) -> None:
        """Instance ``name``'s event: on to Logs where it is the one followed."""
        if name == self.name:
            self.instance_event.emit(ev)
