"""The window's status bar: what serves (the deployment model's line), the URL clients use, the
alerts not yet acknowledged, the device's readings and a progress bar for the window's own jobs
(cut out of the main window, issue 44)."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from quantdeck.core.deployment import BAD, GOOD, OFF, Deployment, tone
from quantdeck.core.events import MetricsEvent
from quantdeck.gui.labels import counted, plain_label
from quantdeck.gui.style import ALERT_TEXT, GREEN, ORANGE, RED, STOPPED

TONE_COLORS = {GOOD: GREEN, BAD: RED, OFF: STOPPED}


def dot(word: str) -> str:
    """A coloured ● for a state word (core/deployment.py's tones)."""
    return f"<span style='color:{TONE_COLORS.get(tone(word), ORANGE)}'>●</span>"


def _reading(v: object, spec: str) -> str:
    """A telemetry reading, or "?" where the driver gave none."""
    return format(v, spec) if isinstance(v, int | float) else "?"


class StatusLine:
    """The labels of a window's status bar, and how each is told."""

    def __init__(self, bar: QStatusBar, device_label: str) -> None:
        self.device_label = device_label
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(240)
        self.progress.hide()
        self.state_label = QLabel(f"{dot('stopped')} stopped")
        self.url_label = QLabel("")
        self.status_label = plain_label(device_label)
        self.alert_label = QLabel("")  # the alerts not yet acknowledged (a badge)
        self.alert_label.setStyleSheet(f"color:{ALERT_TEXT}; font-weight:bold;")
        self.alert_label.hide()
        for w in (self.state_label, self.url_label, self.alert_label):
            bar.addWidget(w)
        bar.addWidget(self.status_label, 1)
        bar.addPermanentWidget(self.progress)

    def show(self, d: Deployment) -> None:
        """What serves: ``● ready``, ``● down behind the router: why``, ``● stopped · ● fleet
        serving``; the URL clients use (the router's behind it)."""
        text = f"{dot(d.word)} {html.escape(d.word)}"
        if d.behind_router:
            text += " behind the router"
        if d.why:
            text += f": {html.escape(d.why)}"
        if d.fleet is not None:
            text += f" · {dot(d.fleet.word)} fleet {html.escape(d.fleet.line())}"
        self.state_label.setText(text)
        self.url_label.setText(f"{d.url} (router)" if d.behind_router and d.url else d.url)

    def show_readings(self, ev: MetricsEvent) -> None:
        """The device's readings of a metrics tick (none this tick: left as they were; the
        problem line says why)."""
        tel = ev.telemetry
        if tel is None:
            return
        if tel.gpus:
            g = tel.gpus[0]
            used = g.memory_used_bytes if isinstance(g.memory_used_bytes, int) else 0
            self.status_label.setText(
                f"{self.device_label} · util {_reading(g.utilization_pct, '.0f')}% · "
                f"{used / 2**30:.1f} GiB · {_reading(g.power_w, '.0f')} W"
            )
        else:
            self.status_label.setText(
                f"{self.device_label} · CPU {tel.host_cpu_pct:.0f}% · RAM "
                f"{tel.host_ram_used_bytes / 2**30:.1f} GiB"
            )

    def show_alerts(self, active: int, unseen: int) -> None:
        """The badge: ``⚠ 1 alert active, 2 not acknowledged`` (none of either: hidden)."""
        text = ""
        if unseen or active:
            text = f"⚠ {counted(active, 'alert')} active" + (
                f", {unseen} not acknowledged" if unseen else ""
            )
        self.alert_label.setText(text)
        self.alert_label.setVisible(bool(text))
