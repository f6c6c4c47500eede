"""Process start to first shown window of `quantdeck` (goal: <= 1.0 s).

    python benchmarks/startup.py [-n 5]

Each run spawns a fresh process that starts the app as `quantdeck` does
(quantdeck.gui.app.build_window, an existing demo model) and reports the wall time from spawn to the
end of the main window's first paint (the first paint event in the window, plus the rest of that
paint pass)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import os, sys, time
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
from quantdeck.gui.app import build_window
win = build_window()


class FirstPaint(QObject):
    # the first paint event of the window or a widget in it; the time is taken on the next
    # turn of the event loop, when Qt has painted the whole window
    seen = False

    def eventFilter(self, obj, ev):
        if (not self.seen and ev.type() == QEvent.Paint and obj.isWidgetType()
                and obj.window() is win):
            self.seen = True
            QTimer.singleShot(0, shown)
        return False


def shown():
    print(f"SHOWN {time.time()}", flush=True)
    app.quit()


watch = FirstPaint()
app.installEventFilter(watch)
win.show()
app.exec()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=5)
    a = ap.parse_args()
    from quantdeck.core.models import ensure_demo_model

    demo = ensure_demo_model()
    data = Path(tempfile.mkdtemp()) / "data"
    (data / "models").mkdir(parents=True)
    os.symlink(demo, data / "models" / demo.name)
    env = dict(
        os.environ,
        QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
        QUANTDECK_DATA_DIR=str(data),
        QUANTDECK_CONFIG_DIR=str(data / "cfg"),
        PYTHONPATH=str(ROOT),
    )
    times = []
    for _ in range(a.n):
        t0 = time.time()
        r = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
        )
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("SHOWN")]
        if not line:
            raise SystemExit(r.stderr[-2000:])
        times.append(float(line[0].split()[1]) - t0)
    print(
        f"start to first shown window: median {statistics.median(times):.3f} s, "
        f"max {max(times):.3f} s over {a.n} runs (goal <= 1.0 s)"
    )


if __name__ == "__main__":
    main()
