"""Whether the Benchmark tab's chosen page can run now, said on its Run button (issue 44: Run
was enabled under the page's own "Run refuses" line): disabled, the reason as its tooltip, and
in a line under it where the page does not say it already; enabled again once it can run. The
reasons are the ones the job would be refused for when it starts (no server for the Run page,
arms that cannot be told apart, a server running while A/B or offline tuning would start their
own, no fleet to tune live); the rest (a bad field, a bad space) are still refused on Run, in
one line. The server's state lives in other tabs and is not told to this one: it is read again
each second while the tab is shown, and whenever the page, the arms or the tuning mode change."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QPushButton, QTabWidget, QWidget

from quantdeck.gui.bench.ab_page import ABPage
from quantdeck.gui.bench.run_page import NO_SERVER, RunPage
from quantdeck.gui.bench.tune_page import TunePage
from quantdeck.gui.labels import plain_label
from quantdeck.gui.live_tune import NO_FLEET
from quantdeck.gui.style import ERROR

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet

SERVER_RUNS = "stop the running server first: A/B and tuning start their own servers, one at a time"
NOT_A_RUN = "choose Run, A/B or Tune to measure"
RUN_TIP = "Run the chosen page's measurement"
RECHECK_MS = 1000  # the server's state, read again while the tab is shown


class GatedTab(Protocol):
    """What the gate reads of the Benchmark tab."""

    modes: QTabWidget
    run_page: RunPage
    ab_page: ABPage
    tune_page: TunePage
    run_button: QPushButton
    job: Any  # the job that runs (None: none)

    @property
    def live_mode(self) -> bool: ...

    def isVisible(self) -> bool: ...


class RunGate(QObject):
    """The Run button of ``tab`` enabled only where its page can run. ``target()`` gives the
    server's (url, model, api_key), ``server_running()`` whether the Launch tab's runs,
    ``fleet()`` the fleet the Fleet tab runs while it serves (None: none; the live mode tunes
    it)."""

    def __init__(
        self,
        tab: GatedTab,
        target: Callable[[], tuple[str | None, str | None, str | None]],
        server_running: Callable[[], bool],
        fleet: Callable[[], Fleet | None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.tab, self._target, self._server_running, self._fleet = (
            tab,
            target,
            server_running,
            fleet,
        )
        self.reason = ""  # why Run is off ("" where it can run)
        self.note = plain_label()  # the reason, where the page does not show it itself
        self.note.setWordWrap(True)
        self.note.setStyleSheet(f"color:{ERROR}")
        self.note.hide()
        self.timer = QTimer(self)
        self.timer.setInterval(RECHECK_MS)
        self.timer.timeout.connect(self._on_timer)
        self.timer.start()
        tab.modes.currentChanged.connect(self.refresh)
        tab.ab_page.checked.connect(self.refresh)  # the arms (and the tab shown again)
        tab.tune_page.tune_where.currentIndexChanged.connect(self.refresh)

    def why_not(self) -> tuple[str, bool]:
        """Why the chosen page cannot run now ("" where it can), and whether the page shows it
        itself."""
        tab = self.tab
        page = tab.modes.currentWidget()
        if page is tab.run_page:
            url, model, _ = self._target()
            return ("" if url and model else NO_SERVER), False
        if page is tab.ab_page:
            warning = tab.ab_page.arm_warning.text()
            if warning:
                return warning, True
        elif page is tab.tune_page and tab.live_mode:
            return ("" if self._fleet() is not None else NO_FLEET), True
        elif page is not tab.tune_page:
            return NOT_A_RUN, False
        return (SERVER_RUNS if self._server_running() else ""), False

    def refresh(self, *_: Any) -> None:
        """Run on or off as the chosen page can run now (nothing while a job runs: its own)."""
        if self.tab.job is not None:
            return
        why, on_page = self.why_not()
        self.reason = why
        button = self.tab.run_button
        button.setEnabled(not why)
        button.setToolTip(why or RUN_TIP)
        self.note.setText(why if not on_page else "")
        self.note.setVisible(bool(why) and not on_page)

    def _on_timer(self) -> None:
        if self.tab.isVisible():
            self.refresh()
