"""A recording in a window of its own (``quantdeck replay FILE``, and Open recording… in the
panel), or saved as a PNG. A fleet's recording (``quantdeck fleet up --record``) shows each
instance as a source of its own, its markers and live trials on it, the fleet's instances
overlaid.

With ``--png OUT`` it renders off screen (no display needed), saves the plots and exits; the
GPU validation's screenshots in docs/ are made this way from the H200 recordings.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from quantdeck.core.events import (
    FactEvent,
    InstanceEvent,
    KvEvent,
    LogEvent,
    MetricsEvent,
    StateEvent,
    TrialEvent,
)
from quantdeck.core.monitor import Recording, read_recording, timeline_of
from quantdeck.core.monitor.timeline import histories
from quantdeck.gui.labels import counted, plain_label
from quantdeck.gui.logs import LogsPanel
from quantdeck.gui.monitor.charts import WINDOWS
from quantdeck.gui.monitor.kv import KvView
from quantdeck.gui.monitor.panel import MonitorPanel
from quantdeck.gui.monitor.sources import SERVER_SOURCE, instance_key


def is_fleet_recording(rec: Recording) -> bool:
    """A recording of ``quantdeck fleet up --record``: its header says so."""
    return rec.header.source == "fleet"


def samples(rec: Recording) -> list[MetricsEvent]:
    """The recording's metrics: a server's own, or a fleet's instances'."""
    inner = [e.event if isinstance(e, InstanceEvent) else e for e in rec.events]
    return [e for e in inner if isinstance(e, MetricsEvent)]


def _window_for(rec: Recording) -> str:
    ts = [e.t for e in samples(rec)]
    span = (max(ts) - min(ts)) if ts else 0.0
    for name, seconds in WINDOWS.items():
        if span <= seconds:
            return name
    return list(WINDOWS)[-1]


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "?"


def replay_view(rec: Recording, title: str) -> tuple[Any, Any]:
    """The window: a heading (plain text: a recording's title is data, never markup) over a
    Monitor panel fed the recording's metrics. Returns (window, panel)."""
    window = ReplayWindow(rec, title)
    return window, window.panel


class ReplayWindow(QWidget):
    """A recording, read-only and apart from the live Monitor: its own store, layout (its own
    GPUs or none), markers and clock; no alerts; the plots, the KV cache (when the recording
    has KV events) and its lifecycle events, each a page."""

    def __init__(self, rec: Recording, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.recording = rec
        metrics = samples(rec)
        ts = [e.t for e in metrics]
        note = rec.header.note
        # the samples' span and clock, and the events' where they reach further (a server's
        # start before its first sample): one range per number, never one for the other
        span = max(ts) - min(ts) if ts else 0.0
        events = f" · events over {rec.duration_s:.0f} s" if rec.duration_s - span >= 1.0 else ""
        self.heading = plain_label(
            f"{title} · replay (read-only) · "
            + (
                f"{span:.0f} s of samples, {_clock(min(ts))} to {_clock(max(ts))}"
                if ts
                else "no samples"
            )
            + f" · {counted(len(metrics), 'sample')}"
            + events
            + (f" · {note}" if note else "")
        )
        font = self.heading.font()
        font.setBold(True)
        self.heading.setFont(font)
        self.pages = QTabWidget()
        self.pages.setDocumentMode(True)
        self.panel = MonitorPanel(live=False)
        self.pages.addTab(self.panel, "Plots")
        if is_fleet_recording(rec):
            self._replay_fleet(rec)
        else:
            for ev in metrics:
                self.panel.add_event(ev)
            for marker in timeline_of([rec]).markers:  # its markers, or its launch (header)
                self.panel.timeline.add(marker)
        self.panel.window_box.setCurrentText(_window_for(rec))
        self.kv: Any = None
        if rec.of(KvEvent):
            self.kv = KvView()
            model = rec.header.model
            self.kv.set_model(model if model and Path(model).is_dir() else None)
            for kv_ev in rec.events:
                if isinstance(kv_ev, MetricsEvent):
                    self.kv.add_metrics(kv_ev)
                elif isinstance(kv_ev, KvEvent):
                    self.kv.add_event(kv_ev)
            self.pages.addTab(self.kv, "KV cache")
        self.events = LogsPanel()
        for log_ev in rec.events:
            inner = log_ev.event if isinstance(log_ev, InstanceEvent) else log_ev
            if isinstance(inner, StateEvent | FactEvent | LogEvent):
                self.events.add_event(log_ev)  # a fleet's: named by its instance
        self.pages.addTab(self.events, "Events")
        lay = QVBoxLayout(self)
        lay.addWidget(self.heading)
        lay.addWidget(self.pages, 1)

    def _replay_fleet(self, rec: Recording) -> None:
        """Each instance of a fleet's recording a source of its own (the first one shown):
        its metrics, its markers (launches, the fleet's switches, its live trials' steps as
        the live Monitor marks them) and the fleet's instances overlaid on each."""
        from quantdeck.core.fleet.roles import ROUTER
        from quantdeck.core.fleet.trial import CANDIDATE

        panel = self.panel
        fleet = rec.header.file
        stores = {}
        for name, history in histories([rec]).items():
            if name is None or name == ROUTER or CANDIDATE in name:
                continue  # the fleet's own events; the router; a trial's candidate
            src = panel.follow_instance(fleet, name)
            for part in history:
                for ev in part.of(MetricsEvent):
                    panel.add_event(ev)
            timeline = timeline_of(history)
            for marker in timeline.markers:
                if marker.what != "trial":  # its decision: the promotion or rollback marks it
                    src.timeline.add(marker)
            for part in history:
                for step in part.of(TrialEvent):
                    panel.add_instance_event(fleet, name, step)
            stores[name] = src.store
        panel.set_instances(stores, fleet=fleet)
        if stores:  # the first instance shown; no server of its own to show
            first = instance_key(fleet, next(iter(stores)))
            panel.source_box.setCurrentIndex(panel.source_box.findData(first))
            panel.drop_source(SERVER_SOURCE)

    def refresh(self) -> None:
        self.panel.refresh(force=True)
        if self.kv is not None:
            self.kv.refresh()

    def closeEvent(self, ev: Any) -> None:
        self.panel.timer.stop()
        if self.kv is not None:
            self.kv.shutdown()
        super().closeEvent(ev)


def main(
    path: str, png: str | None = None, size: tuple[int, int] = (1400, 900), title: str | None = None
) -> int:
    rec = read_recording(path)  # one-line errors before Qt starts
    if png and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    title = title or rec.header.title or rec.header.model or Path(path).name
    box, panel = replay_view(rec, str(title))
    box.setWindowTitle(f"Quantdeck replay: {Path(path).name}")
    box.resize(*size)
    if png:
        box.show()
        app.processEvents()
        box.refresh()
        app.processEvents()
        box.grab().save(png)
        box.close()
        return 0
    box.show()
    return int(app.exec())
