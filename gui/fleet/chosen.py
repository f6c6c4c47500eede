"""The instance Monitor, Logs and Playground follow (the Fleet tab's Open in Monitor): its log
at once, its events as they come, its URL while it serves, wherever a promotion moves it; and
who it is (its fleet file and name), so that the Monitor keeps one source for it across URLs,
with its live trials' steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from quantdeck.core.events import Event, FactEvent, LogEvent, StateEvent, TrialEvent
from quantdeck.core.fleet.roles import TRIAL_CANDIDATE

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet
    from quantdeck.core.fleet.rows import FleetRows

LOG_REPLAY = 500  # the chosen instance's last log lines, shown in Logs when it is chosen


class ChosenInstance(QObject):
    """The instance of ``rows()`` (of ``fleet()``, None when none runs) that the other tabs
    follow: ``attach(url, key, show)`` points Monitor and Playground at it, again when its URL
    changes, right after ``followed(url, fleet file, name)`` says who serves there;
    ``instance_event`` carries its own events (its log, its states) to Logs; ``trial_step``
    every instance's live trial steps (for its Monitor source's markers); ``state(fleet file,
    name, event)`` its states (its start, a crash, a restart: the Monitor's cue and alerts
    follow them on its source; not while a trial swaps its servers, whose own steps say
    what serves); ``say`` tells why it is not attached yet."""

    # url, API key ("" for none), whether to show the Monitor
    attach = Signal(str, str, bool)
    followed = Signal(str, str, str)  # url, the fleet file, the instance's name
    instance_event = Signal(object)
    trial_step = Signal(str, str, object)  # the fleet file, an instance, its TrialEvent
    state = Signal(str, str, object)  # the fleet file, the instance, its StateEvent

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
        self._show = False  # the Monitor comes to the front when it first serves

    def forget(self) -> None:
        """Follow no instance (another fleet starts: the operator chooses again)."""
        self.name, self._url = None, None

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
        self.name, self._url, self._show = row.name, None, show
        self.instance_event.emit(FactEvent("fleet instance", row.name))  # a mark in Logs
        fleet = self._fleet()
        server = fleet.servers.get(row.name) if fleet is not None else None
        for line in list(server.log_tail)[-LOG_REPLAY:] if server is not None else []:
            self.instance_event.emit(LogEvent(line))
        if row.serving:
            self._url = row.url
            self._followed(row.url)
            self.attach.emit(row.url, row.api_key or "", show)
        else:
            self._say(
                f"{row.name} is {row.state}: its log is in the Logs tab; Monitor and "
                "Playground follow it once it serves"
            )
            self._state(StateEvent(row.state))

    def follow_url(self) -> None:
        """The chosen instance serves at last (chosen while it started or was down), or at
        another URL (a promotion gives it the candidate's, an undo the one before): Monitor
        and Playground follow it there. (A replay's rows serve nothing: no fleet runs.)"""
        rows = self._rows()
        if rows is None or self.name is None or self.name not in rows or self._fleet() is None:
            return
        row = rows.row(self.name)
        if row.serving and row.url != self._url:
            show, self._show = self._show and self._url is None, False
            if self._url is None:  # "… follow it once it serves": it does
                self._say("")
            self._url = row.url
            self._followed(row.url)
            self.attach.emit(row.url, row.api_key or "", show)

    def _fleet_file(self) -> str | None:
        fleet = self._fleet()
        return str(fleet.spec.path) if fleet is not None else None

    def _state(self, ev: StateEvent) -> None:
        path, rows = self._fleet_file(), self._rows()
        if path is None or self.name is None or rows is None:
            return
        if any(r.role == TRIAL_CANDIDATE for r in rows.rows):
            return  # a trial, its promotion or undo: servers swap, the instance goes on
        self.state.emit(path, self.name, ev)

    def _followed(self, url: str) -> None:
        """Who serves at ``url``: the chosen instance of the running fleet (a replay's rows
        are no fleet: nothing said, its URL is a plain one)."""
        path = self._fleet_file()
        if path is not None and self.name is not None:
            self.followed.emit(url, path, self.name)

    def on_event(self, name: str, ev: Event) -> None:
        """Instance ``name``'s event: on to Logs where it is the one followed; a live trial's
        step, of any instance, to ``trial_step``."""
        if isinstance(ev, TrialEvent):
            path = self._fleet_file()
            if path is not None:
                self.trial_step.emit(path, name, ev)
        if name == self.name:
            self.instance_event.emit(ev)
            if isinstance(ev, StateEvent):
                self._state(ev)
