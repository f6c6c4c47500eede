"""The Monitor's Alerts page: every alert raised, when it cleared, and whether the operator
acknowledged it (:class:`quantdeck.core.monitor.alerts.AlertLog`, kept by the Monitor panel).

The panel's ``alerts_changed`` signal redraws it; Acknowledge all marks them seen, which is what
the badges on the Monitor tab and the status bar count."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from quantdeck.core.monitor.alerts import Alert
from quantdeck.gui.labels import plain_label
from quantdeck.gui.monitor.panel import MonitorPanel
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table


def _clock(t: float | None) -> str:
    return "" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


ALERT_COLUMNS: tuple[Column[Alert], ...] = (
    Column("raised", lambda a: _clock(a.raised_t)),
    Column("cleared", lambda a: _clock(a.cleared_t) if a.cleared_t is not None else "active"),
    Column("state", lambda a: a.state),
    Column("alert", lambda a: a.message),
)


class AlertsView(QWidget):
    """The alert list of a Monitor panel (newest first)."""

    def __init__(self, monitor: MonitorPanel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.monitor = monitor
        self.model: ObjectTableModel[Alert] = ObjectTableModel(ALERT_COLUMNS, self)
        self.table = row_table(self.model)
        self.table.setObjectName("alerts")
        self.summary = plain_label("")
        self.ack_button = QPushButton("Acknowledge all")
        self.ack_button.clicked.connect(monitor.acknowledge_alerts)
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(self.ack_button)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.table, 1)
        monitor.alerts_changed.connect(self._on_alerts_changed)
        self._on_alerts_changed()

    def _on_alerts_changed(self) -> None:
        log = self.monitor.alerts
        self.model.set_rows(reversed(log.alerts))
        active, unseen = len(log.active), log.unacknowledged
        self.summary.setText(
            f"{active} active · {unseen} not acknowledged · {len(log)} in all"
            if len(log)
            else "No alert yet. Alerts: KV cache ≥ 98 % full, preemptions, an SLO met by "
            "under 99 %, and the limits set on the Plots page."
        )
        self.ack_button.setEnabled(unseen > 0)
