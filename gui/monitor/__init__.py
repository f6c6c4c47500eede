"""The Monitor: the window's Monitor tab and its pages, and recordings replayed in a window.

- ``panel``: the Plots page (:class:`MonitorPanel`): live plots, window, pause, alerts, span
  comparison, export; what it plots is ``charts``, where from ``sources``, its grid of plots
  (y ranges, legends, axes) ``plot_grid``, how it is drawn cheaply ``plot_items``, its alerts
  ``alerting``, its span comparison ``spans``, a fleet's instances overlaid ``instances``, its
  markers and span table ``timeline``;
- ``alerts``: the Alerts page (:class:`AlertsView`), the panel's alert log;
- ``kv``: the KV cache page (:class:`KvView`), vLLM's prefix cache from its KV events;
- ``profile``: the Trace page (:class:`ProfilePanel`), vLLM's torch profiler;
- ``replay``: a recording in a window of its own (:class:`ReplayWindow`, ``quantdeck replay``).

Its modules import each other directly, never through this face. The colours are
:mod:`quantdeck.gui.style`'s.
"""

from quantdeck.gui.monitor.alerts import AlertsView
from quantdeck.gui.monitor.charts import WINDOWS, with_gaps
from quantdeck.gui.monitor.kv import KvView
from quantdeck.gui.monitor.panel import MonitorPanel
from quantdeck.gui.monitor.profile import ProfilePanel
from quantdeck.gui.monitor.replay import ReplayWindow, replay_view
from quantdeck.gui.monitor.sources import SERVER_SOURCE, STALE_S, MonitorSource

__all__ = [
    "SERVER_SOURCE",
    "STALE_S",
    "WINDOWS",
    "AlertsView",
    "KvView",
    "MonitorPanel",
    "MonitorSource",
    "ProfilePanel",
    "ReplayWindow",
    "replay_view",
    "with_gaps",
]
