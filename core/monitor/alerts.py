"""The Monitor's alerts as an operator works through them: each raised with its time and
reading, cleared when the condition ends, acknowledged by the operator (Grafana's and
Alertmanager's states: firing, resolved; silenced here is "acknowledged").

:class:`AlertLog` takes one verdict per condition and sample (:meth:`AlertLog.update`) and
keeps the alerts in the order they were raised, bounded; ``version`` moves on every change, so
that views redraw only then.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

MAX_ALERTS = 500  # the oldest cleared alerts go first past this
# An alert clears once its condition has stayed false this long (Grafana's "keep firing for"):
# a reading that hovers at its limit is one alert, not one every other second.
CLEAR_AFTER_S = 10.0


@dataclass
class Alert:
    """One alert: ``key`` names the condition (``kv_full``, ``ttft``...), ``message`` its
    reading when it was raised."""

    key: str
    message: str
    raised_t: float  # unix seconds
    cleared_t: float | None = None  # None: still active
    acknowledged: bool = False
    # why it ended without clearing: its source's life ended ("server stopped"), so the
    # condition can no longer be read (cleared_t is then when that happened)
    ended: str | None = None

    @property
    def active(self) -> bool:
        return self.cleared_t is None

    @property
    def state(self) -> str:
        if self.active:
            return "active, acknowledged" if self.acknowledged else "active"
        what = "cleared" if self.ended is None else f"ended: {self.ended}"
        return what + (", acknowledged" if self.acknowledged else "")

    def text(self) -> str:
        """One line: ``08:12:31 KV cache 99.1% full (cleared 08:13:02)``, or ``(ended
        08:13:02: server stopped)``."""
        raised = _clock(self.raised_t)
        end = ""
        if self.cleared_t is not None:
            how = "cleared" if self.ended is None else "ended"
            end = f" ({how} {_clock(self.cleared_t)}" + (
                f": {self.ended})" if self.ended is not None else ")"
            )
        return f"{raised} {self.message}{end}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class AlertLog:
    """The alerts of one live source: raised, cleared, acknowledged. Used on one thread."""

    def __init__(self, limit: int = MAX_ALERTS, clear_after_s: float = CLEAR_AFTER_S) -> None:
        self.alerts: collections.deque[Alert] = collections.deque()
        self.limit = limit
        self.clear_after_s = clear_after_s
        self._open: dict[str, Alert] = {}
        self._ok_since: dict[str, float] = {}  # open alerts whose condition has ended: since
        self.version = 0

    def update(self, key: str, over: bool, message: str, t: float) -> Alert | None:
        """The condition ``key`` is ``over`` its limit (or not) at ``t``: the alert it raises,
        or clears (once the condition has stayed false ``clear_after_s``; its cleared time is
        when it ended), else None."""
        alert = self._open.get(key)
        if over:
            self._ok_since.pop(key, None)
            if alert is not None:
                return None
            alert = Alert(key, message, t)
            self._open[key] = alert
            self.alerts.append(alert)
            self._trim()
            self.version += 1
            return alert
        if alert is None:
            return None
        since = self._ok_since.setdefault(key, t)
        if t - since < self.clear_after_s:
            return None
        alert.cleared_t = since
        del self._open[key], self._ok_since[key]
        self.version += 1
        return alert

    def end_all(self, why: str, t: float) -> list[Alert]:
        """The source's life ended at ``t`` (``why``: "server stopped", "server crashed"):
        every active alert ends, its condition no longer read; the alerts ended."""
        ended = list(self._open.values())
        for alert in ended:
            alert.cleared_t, alert.ended = t, why
        self._open.clear()
        self._ok_since.clear()
        if ended:
            self.version += 1
        return ended

    def _trim(self) -> None:
        while len(self.alerts) > self.limit:
            oldest = next((a for a in self.alerts if not a.active), self.alerts[0])
            self.alerts.remove(oldest)
            if self._open.get(oldest.key) is oldest:
                del self._open[oldest.key]
                self._ok_since.pop(oldest.key, None)

    def acknowledge_all(self) -> int:
        """Mark every alert acknowledged; how many were not."""
        n = 0
        for a in self.alerts:
            if not a.acknowledged:
                a.acknowledged = True
                n += 1
        if n:
            self.version += 1
        return n

    @property
    def active(self) -> list[Alert]:
        return [a for a in self.alerts if a.active]

    @property
    def unacknowledged(self) -> int:
        """The badge's number: alerts the operator has not acknowledged, active or cleared."""
        return sum(not a.acknowledged for a in self.alerts)

    def __len__(self) -> int:
        return len(self.alerts)
