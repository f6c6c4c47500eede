"""The Monitor during an n-gram speculative run of the demo: vLLM's acceptance in the Hits ·
SLO plot (docs/screenshots/monitor-speculative.png).

    xvfb-run -a -s "-screen 0 2000x1200x24" python benchmarks/speculative_monitor.py OUT WxH

Two clients send repetitive prompts, greedy: the demo's output repeats itself, where the n-gram
lookup finds drafts (with the corpus prompts `ab` sends, sampled, it found none). Saves
OUT/monitor-speculative.png and prints the acceptance the Monitor's samples show.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
from PySide6.QtWidgets import QApplication

from quantdeck.core.models import ensure_demo_model
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.screenshots import _wait

PROMPTS = (" ".join(["the"] * 16), " ".join(str(i) for i in range(1, 23)))


def main() -> int:
    app = QApplication(sys.argv)
    out = Path(sys.argv[1])
    w, h = (int(x) for x in sys.argv[2].split("x"))
    win = MainWindow()
    win.resize(w, h)
    win.show()
    win.add_model(ensure_demo_model(), select=True)
    launch = win.launch
    launch.form.editors["kv_cache_memory_bytes"].widget.setText("64MiB")
    launch.eager.setChecked(True)
    launch.form.editors["speculative"].widget.setText("ngram:3")
    _wait(app, lambda: False, 0.5)
    launch.start_button.click()
    _wait(app, lambda: win.controller.state in ("ready", "crashed"), 600)
    if win.controller.state != "ready":
        print(f"the server did not become ready ({win.controller.state})", file=sys.stderr)
        return 1
    url, model = win.controller.url, win.controller.model_name
    stop = threading.Event()

    def client(prompt: str) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": 48, "temperature": 0}
        while not stop.is_set():
            try:
                httpx.post(f"{url}/v1/completions", timeout=60, json=body)
            except httpx.HTTPError:
                time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(p,), daemon=True) for p in PROMPTS]
    for t in threads:
        t.start()
    win.tabs.setCurrentWidget(win._monitor_box)
    _wait(app, lambda: False, 30.0)
    win.grab().save(str(out / "monitor-speculative.png"))
    _, cols = win.monitor.store.window(60.0, ["spec_accept_pct"])
    accepted = [float(v) for v in cols.get("spec_accept_pct", []) if v == v]
    if accepted:
        print(f"spec. accepted: last {accepted[-1]:.1f} % ({len(accepted)} samples)")
    else:
        print("no acceptance figure in the samples")
    stop.set()
    for t in threads:
        t.join(timeout=70)
    win.controller.stop()
    _wait(app, lambda: win.controller.state in ("stopped", "crashed"), 120)
    win.close()
    return 0 if accepted else 1


if __name__ == "__main__":
    sys.exit(main())
