"""``quantdeck screenshots OUTDIR``: drive every tab against a running demo server, one PNG each.

Starts the demo model from the Launch tab, sends Playground requests and a little background
load while the Monitor fills, runs a small benchmark, saves launch.png, monitor.png, logs.png,
playground.png, benchmark.png, stops the server, converts the demo model to W8A8 (convert.png)
and exits 0 (1 if the server never became ready).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QApplication

from quantdeck.core.models import ensure_demo_model


def _wait(app: QApplication, cond: Callable[[], bool], timeout: float) -> bool:
    """Run the event loop (no sleeping on the UI thread) until ``cond()`` or the timeout."""
    from PySide6.QtCore import QEventLoop, QTimer

    if cond():
        return True
    loop = QEventLoop()
    poll = QTimer()
    poll.setInterval(20)
    poll.timeout.connect(lambda: cond() and loop.quit())
    QTimer.singleShot(int(timeout * 1000), loop.quit)
    poll.start()
    loop.exec()
    poll.stop()
    return cond()


_LOAD = r"""
import sys, threading, time, httpx
url, model, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
end = time.time() + seconds
def run(k):
    i = 0
    while time.time() < end:
        try:
            httpx.post(url + "/v1/completions", timeout=60, json={
                "model": model, "prompt": f"Topic {k}.{i}: the import statement",
                "max_tokens": 24 + (i % 3) * 16, "ignore_eos": True})
        except Exception:
            time.sleep(0.5)
        i += 1
threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def _background_load(url: str, model: str, seconds: float) -> Any:
    """Three clients sending completions for ``seconds``, in another process (as other
    users of the server would be): returns the Popen, whose ``is_alive()`` says if it runs."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", _LOAD, url, model, str(seconds)])
    proc.is_alive = lambda: proc.poll() is None  # type: ignore[attr-defined]
    return proc


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0] if argv else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from quantdeck.gui.main_window import MainWindow

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
    if (
        not _wait(app, lambda: win.controller.state in ("ready", "crashed"), 600)
        or win.controller.state != "ready"
    ):
        print(
            f"screenshots: the server did not become ready ({win.controller.state})",
            file=sys.stderr,
        )
        win.close()
        return 1
    _wait(app, lambda: False, 1.0)
    launch.grab().save(str(out / "launch.png"))
    loader = _background_load(win.controller.url, win.controller.model_name, 25)
    pg = win.playground
    win.tabs.setCurrentWidget(pg)
    for mode, text in (
        ("chat", "What does the import statement do?"),
        ("completion", "A class definition is"),
    ):
        pg.mode.setCurrentText(mode)
        pg.max_tokens.setValue(48)
        pg.input.setPlainText(text)
        pg.send_button.click()
        _wait(app, lambda: pg.send_button.isEnabled(), 120)
    pg.grab().save(str(out / "playground.png"))
    win.tabs.setCurrentWidget(win._monitor_box)
    _wait(app, lambda: not loader.is_alive(), 60)
    _wait(app, lambda: False, 3.0)
    win.monitor.refresh(force=True)
    win.grab().save(str(out / "monitor.png"))
    win.tabs.setCurrentWidget(win.logs)
    _wait(app, lambda: False, 0.5)
    win.grab().save(str(out / "logs.png"))
    bench = win.bench
    win.tabs.setCurrentWidget(win._bench_box)
    bench.concurrency.setValue(4)
    bench.num_prompts.setValue(24)
    bench.input_len.setValue(64)
    bench.output_len.setValue(32)
    bench.slo_ttft.setValue(1500)
    bench.label.setText("demo c4")
    bench.run_button.click()
    _wait(app, lambda: bench.job is None and bench.run_button.isEnabled(), 300)
    _wait(app, lambda: False, 0.5)
    win.grab().save(str(out / "benchmark.png"))
    win.controller.stop()
    _wait(app, lambda: win.controller.state in ("stopped", "crashed"), 120)
    conv = win.convert
    win.tabs.setCurrentWidget(conv)
    conv.method.setCurrentIndex(conv.method.findData("w8a8"))
    import tempfile

    target = Path(tempfile.mkdtemp(prefix="quantdeck-shot-")) / "demo-w8a8"
    conv.out.setText(str(target))
    conv.samples.setValue(16)
    conv.seq_len.setValue(128)
    job = conv.convert()
    _wait(app, lambda: job is None or job.state in ("done", "failed", "cancelled"), 600)
    _wait(app, lambda: False, 0.5)
    conv.table.selectRow(0)
    win.grab().save(str(out / "convert.png"))
    win.controller.stop()
    _wait(app, lambda: win.controller.state in ("stopped", "crashed"), 120)
    win.close()
    for p in sorted(out.glob("*.png")):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
