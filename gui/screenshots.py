"""``quantdeck screenshots OUTDIR``: drive every tab against a running demo server, one PNG each.

Starts the demo model from the Launch tab, sends Playground requests and a little background
load while the Monitor fills, saves launch.png, monitor.png, logs.png, playground.png, stops
the server and exits 0 (1 if the server never became ready).
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from PySide6.QtWidgets import QApplication

from core.demo_model import ensure_demo_model


def _wait(app: QApplication, cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        app.processEvents()
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _background_load(url: str, model: str, seconds: float) -> threading.Thread:
    import httpx

    def run() -> None:
        end = time.time() + seconds
        i = 0
        while time.time() < end:
            try:
                httpx.post(url + "/v1/completions", timeout=60, json={
                    "model": model, "prompt": f"Topic {i}: the import statement",
                    "max_tokens": 24 + (i % 3) * 16, "ignore_eos": True})
            except Exception:
                time.sleep(0.5)
            i += 1

    threads = [threading.Thread(target=run, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    return threads[0]


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0] if argv else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from gui.main_window import MainWindow

    win = MainWindow()
    win.resize(1600, 1000)
    win.show()
    demo = ensure_demo_model()
    win.add_model(demo, select=True)
    launch = win.launch
    launch.form.editors["kv_cache_memory_bytes"].widget.setText("64MiB")
    launch.eager.setChecked(True)
    win.monitor.ttft_limit.setValue(2000)
    _wait(app, lambda: False, 0.5)
    launch.grab().save(str(out / "launch.png"))
    launch.start_button.click()
    if not _wait(app, lambda: win.controller.state in ("ready", "crashed"), 600) or \
            win.controller.state != "ready":
        print(f"screenshots: the server did not become ready ({win.controller.state})",
              file=sys.stderr)
        win.close()
        return 1
    _wait(app, lambda: False, 1.0)
    launch.grab().save(str(out / "launch.png"))
    loader = _background_load(win.controller.url, win.controller.model_name, 25)
    pg = win.playground
    win.tabs.setCurrentWidget(pg)
    for mode, text in (("chat", "What does the import statement do?"),
                       ("completion", "A class definition is")):
        pg.mode.setCurrentText(mode)
        pg.max_tokens.setValue(48)
        pg.input.setPlainText(text)
        pg.send_button.click()
        _wait(app, lambda: pg.send_button.isEnabled(), 120)
    pg.grab().save(str(out / "playground.png"))
    win.tabs.setCurrentWidget(win.monitor)
    _wait(app, lambda: not loader.is_alive(), 60)
    _wait(app, lambda: False, 3.0)
    win.monitor.refresh()
    win.grab().save(str(out / "monitor.png"))
    win.tabs.setCurrentWidget(win.logs)
    _wait(app, lambda: False, 0.5)
    win.grab().save(str(out / "logs.png"))
    win.controller.stop()
    _wait(app, lambda: win.controller.state in ("stopped", "crashed"), 120)
    win.close()
    for p in sorted(out.glob("*.png")):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
