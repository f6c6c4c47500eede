"""``quantdeck replay FILE``: a recording in the Monitor, as a window or saved as a PNG.

With ``--png OUT`` it renders off screen (no display needed), saves the plots and exits; the
GPU validation's screenshots in docs/ are made this way from the H200 recordings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from quantdeck.core.events import MetricsEvent
from quantdeck.core.monitor import Recording, read_recording, timeline_of


def _window_for(rec: Recording) -> str:
    from quantdeck.gui.monitor import WINDOWS

    ts = [e.t for e in rec.of(MetricsEvent)]
    span = (max(ts) - min(ts)) if ts else 0.0
    for name, seconds in WINDOWS.items():
        if span <= seconds:
            return name
    return list(WINDOWS)[-1]


def replay_view(rec: Recording, title: str) -> tuple[Any, Any]:
    """The window: a heading (plain text: a recording's title is data, never markup) over a
    Monitor panel fed the recording's metrics. Returns (window, panel)."""
    from PySide6.QtWidgets import QVBoxLayout, QWidget

    from quantdeck.gui.labels import plain_label
    from quantdeck.gui.monitor import MonitorPanel

    box = QWidget()
    note = rec.header.get("note")
    label = plain_label(
        f"{title} · {rec.duration_s:.0f} s recorded · {len(rec.of(MetricsEvent))} samples"
        + (f" · {note}" if note else "")
    )
    font = label.font()
    font.setBold(True)
    label.setFont(font)
    panel = MonitorPanel(parent=box)
    lay = QVBoxLayout(box)
    lay.addWidget(label)
    lay.addWidget(panel, 1)
    for ev in rec.of(MetricsEvent):
        panel.add_event(ev)
    for marker in timeline_of([rec]).markers:  # its markers, or its launch from its header
        panel.timeline.add(marker)
    panel.window_box.setCurrentText(_window_for(rec))
    return box, panel


def main(
    path: str, png: str | None = None, size: tuple[int, int] = (1400, 900), title: str | None = None
) -> int:
    rec = read_recording(path)  # one-line errors before Qt starts
    if png and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    title = title or rec.header.get("title") or rec.header.get("model") or Path(path).name
    box, panel = replay_view(rec, str(title))
    box.setWindowTitle(f"Quantdeck replay: {Path(path).name}")
    box.resize(*size)
    if png:
        box.show()
        app.processEvents()
        panel.refresh(force=True)
        app.processEvents()
        box.grab().save(png)
        box.close()
        return 0
    box.show()
    return int(app.exec())
