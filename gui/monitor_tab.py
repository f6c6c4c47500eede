"""The Monitor tab: its pages (Plots, Alerts, KV cache, Trace), each built on first use, after
the window's first paint (pyqtgraph takes most of the start-up time), fed by the server
controller (cut out of the main window, issue 44), and told by the Fleet tab which instance it
follows: one source per fleet instance, across its promotions and undos, with its live trials'
markers and its fleet's instances overlaid (issue 44)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from quantdeck.core.events import Event, MetricsEvent, StateEvent
from quantdeck.gui.server_control import QtServerController

if TYPE_CHECKING:
    from quantdeck.gui.fleet import FleetView


class MonitorTab(QWidget):
    """The pages of the Monitor tab. ``alert(line)``: an alert raised or cleared;
    ``alerts_changed``: the alert log changed (the window's badges); ``open_requested``: Open
    recording…"""

    alert = Signal(str)
    alerts_changed = Signal()
    open_requested = Signal()

    def __init__(self, controller: QtServerController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self._panel: Any = None  # the plots (gui/monitor/panel.py)
        self._kv: Any = None  # the KV view (gui/monitor/kv.py), a page beside the plots
        self._profile: Any = None  # the Trace page (gui/monitor/profile.py)
        self.alerts_view: Any = None  # the Alerts page (gui/monitor/alerts.py), with the plots
        self._fleet: FleetView | None = None  # the Fleet tab, once followed
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.pages = QTabWidget()
        self.pages.setDocumentMode(True)
        lay.addWidget(self.pages)
        controller.event.connect(self.on_server_event)  # the tab subscribes itself
        controller.metrics.connect(self._on_metrics)
        controller.kv.connect(lambda ev: self.kv.add_event(ev))

    @property
    def panel(self) -> Any:
        """The plots' page (built on first use), with the Alerts page."""
        if self._panel is None:
            from quantdeck.gui.monitor import AlertsView, MonitorPanel

            self._panel = MonitorPanel()
            self._panel.follow(self.controller)
            self._panel.set_source_state(self.controller.state)
            self.pages.addTab(self._panel, "Plots")
            self._panel.alert.connect(self.alert)
            self.alerts_view = AlertsView(self._panel)
            self.pages.addTab(self.alerts_view, "Alerts")
            self._panel.alerts_changed.connect(self._on_alerts_changed)
            self._panel.open_button.clicked.connect(self.open_requested)
            self._panel.slo_changed.connect(self.controller.set_slo)
        return self._panel

    @property
    def kv(self) -> Any:
        """The KV view, the second page (built on first use, after the plots)."""
        if self._kv is None:
            self.panel  # noqa: B018 (the plots' page first)
            from quantdeck.gui.monitor import KvView

            self._kv = KvView()
            self.pages.addTab(self._kv, "KV cache")
        return self._kv

    @property
    def profile(self) -> Any:
        """The Trace page (vLLM's profiler; built on first use, after the KV view)."""
        if self._profile is None:
            self.kv  # noqa: B018 (the pages in order)
            from quantdeck.gui.monitor import ProfilePanel

            self._profile = ProfilePanel(self.controller)
            self.pages.addTab(self._profile, "Trace")
        return self._profile

    def follow_fleet(self, fleet: FleetView) -> None:
        """Follow the Fleet tab (it subscribes itself: the window does not relay): the instance
        chosen there is a source of its own, keyed by its fleet file and name (a promotion
        or an undo moves it to another URL, not to another source), marked where its live
        trials start, are promoted, rolled back or undone; its fleet's instances overlaid on
        it. A replay in the Fleet tab leaves the plots alone."""
        self._fleet = fleet
        chosen = fleet.chosen_instance
        chosen.followed.connect(self._on_instance_followed)
        chosen.trial_step.connect(self._on_trial_step)
        chosen.state.connect(self._on_instance_state)
        fleet.instances_changed.connect(self._on_fleet_instances_changed)

    def _on_instance_followed(self, url: str, fleet_file: str, name: str) -> None:
        panel = self.panel
        panel.expect_instance(url, fleet_file, name)  # the attach to come is the instance
        if self._fleet is not None:
            panel.set_instances(self._fleet.series, fleet=fleet_file)

    def _on_instance_state(self, fleet_file: str, name: str, ev: StateEvent) -> None:
        """The chosen instance's state: on its source's cue (a crash ends its alerts, as a
        server's does), and, while the Monitor follows no server (the Launch tab's, or an
        instance it is attached to), its source shown: the instance starting, not the last
        server's "stopped"; it is attached to once it serves."""
        controller = self.controller
        idle = controller.attached is None and (
            controller.server is None or not controller.server.running
        )
        self.panel.instance_state(fleet_file, name, ev, follow=idle)

    def _on_trial_step(self, fleet_file: str, name: str, ev: Event) -> None:
        if self._panel is not None:  # (no plots yet: no source of it either)
            self._panel.add_instance_event(fleet_file, name, ev)

    def _on_fleet_instances_changed(self, stores: Any) -> None:
        """The Fleet tab shows another fleet, or starts its own again: new stores for the
        sources of that fleet's instances."""
        fleet = self._fleet
        if self._panel is None or fleet is None or fleet.spec is None or fleet.replayed:
            return
        self._panel.set_instances(stores, fleet=str(fleet.spec.path))

    def on_server_event(self, ev: Event) -> None:
        """A server event: the plots built now follow the controller from the next event (this
        one given to them); a start clears the KV view and names its model."""
        if self._panel is None:
            self.panel.add_server_event(ev)
        if not isinstance(ev, StateEvent):
            return
        if ev.state == "attached":  # the Monitor follows it as a source of its own
            self.kv.clear()
        elif ev.state == "starting":  # the plots go on: the timeline's marker shows the restart
            self.kv.clear()
            server = self.controller.server
            self.kv.set_model(server.cfg.model.model if server is not None else None)
            if server is not None:  # an engine option: the page asks for it only while off
                flag = server.cfg.extra_args.get("kv-cache-metrics")
                self.kv.kv_cache_metrics = flag not in (None, False, "false")

    def _on_metrics(self, ev: MetricsEvent) -> None:
        self.kv.add_metrics(ev)

    def _on_alerts_changed(self) -> None:
        unseen = self.panel.alerts.unacknowledged
        page = self.pages.indexOf(self.alerts_view)
        self.pages.setTabText(page, f"Alerts ({unseen})" if unseen else "Alerts")
        self.alerts_changed.emit()

    def shutdown(self) -> None:
        if self._panel is not None:
            self._panel.timer.stop()
        if self._kv is not None:
            self._kv.shutdown()
        if self._profile is not None:
            self._profile.shutdown()
