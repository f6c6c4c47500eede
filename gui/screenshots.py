"""``quantdeck screenshots OUTDIR [--size WxH]``: drive every tab against a running demo
server, one PNG each, at the window size given (the panel's default 1400x900).

Starts the demo model from the Launch tab (with KV events on), sends Playground requests and a
little background load while the Monitor fills, saves launch.png, playground.png, monitor.png,
alerts.png (the load crosses a KV limit), then, after prompts sharing a long prefix, the
Monitor's KV view (kv.png); runs a small benchmark, saves logs.png and benchmark.png, stops the
server, converts the demo model to W8A8 (convert.png), replays two recorded launches with their
spans compared (timeline.png) and shows a profiler trace's summary (profile.png; both also
alone, without a server: ``--offline DIR``), brings up a two-instance demo fleet in the Fleet
tab under load (fleet.png; Open in Monitor must attach, and the Monitor then overlays both
instances: monitor-fleet.png), tries max-num-seqs 8 live on one instance (the Trial view
measuring: trial.png; decided: trial-decided.png; Stop fleet must leave no process) and exits
0 (1 if a server never became ready).
OUTDIR is written whole or not at all (:func:`quantdeck.core.paths.atomic_dir`): an earlier set
of screenshots is replaced, any other file or folder there is refused.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QApplication, QCheckBox, QLineEdit

from quantdeck.core.errors import ServerError
from quantdeck.core.models import ensure_demo_model
from quantdeck.core.paths import atomic_dir


def _wait(app: QApplication, cond: Callable[[], bool], timeout: float) -> bool:
    """Run the event loop (no sleeping on the UI thread) until ``cond()`` or the timeout."""
    from PySide6.QtCore import QEventLoop, QTimer

    if cond():
        return True
    loop = QEventLoop()
    poll = QTimer()
    poll.setInterval(20)

    def check() -> None:
        if cond():
            loop.quit()

    poll.timeout.connect(check)
    QTimer.singleShot(int(timeout * 1000), loop.quit)
    poll.start()
    loop.exec()
    poll.stop()
    return cond()


_LOAD = r"""
import sys, threading, time, httpx
url, model, seconds, clients = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
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
threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def _background_load(url: str, model: str, seconds: float, clients: int = 3) -> Any:
    """``clients`` clients sending completions for ``seconds``, in another process (as other
    users of the server would be): returns the Popen, whose ``is_alive()`` says if it runs."""
    from quantdeck.core.procs import own_python, spawn

    argv = [own_python(), "-c", _LOAD, url, model, str(seconds), str(clients)]
    proc = spawn(argv, kind="load generator")
    proc.is_alive = lambda: proc.poll() is None  # type: ignore[attr-defined]
    return proc


_SHARED = r"""
import sys, httpx
url, model, path = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path, encoding="utf-8").read()
prefix = text[:3000]
for i in range(5):  # each its own tail, long enough to fill blocks of its own
    own = text[4000 + 1500 * i : 5000 + 1500 * i]
    httpx.post(url + "/v1/completions", timeout=120, json={
        "model": model, "prompt": prefix + f"\n\nQuestion {i}: {own}", "max_tokens": 8})
"""


def _shared_prefix_load(url: str, model: str) -> Any:
    """Five completions, one after another, sharing the corpus's first 3,000 characters (about
    800 demo tokens: six full blocks of the CPU's 128), each with a tail of its own (vLLM caches
    full blocks only: a chain must store blocks past the shared ones to show its reuse), in
    another process."""
    from quantdeck.core.paths import CORPUS
    from quantdeck.core.procs import own_python, spawn

    cmd = [own_python(), "-c", _SHARED, url, model, str(CORPUS / "train.txt")]
    proc = spawn(cmd, kind="load generator")
    proc.is_alive = lambda: proc.poll() is None  # type: ignore[attr-defined]
    return proc


def main(argv: Sequence[str], size: tuple[int, int] = (1400, 900)) -> int:
    """``size``: the window's, 1400x900 (the panel's default) unless told."""
    if argv and argv[0] == "--offline":  # profile.png and timeline.png alone, no server
        return offline(Path(argv[1] if len(argv) > 1 else "screenshots"))
    out = Path(argv[0] if argv else "screenshots").expanduser().absolute()
    running = QApplication.instance()
    app = running if isinstance(running, QApplication) else QApplication(sys.argv[:1])
    try:
        with atomic_dir(out, "screenshots", overwrite=True) as tmp:
            _shoot(app, tmp, size)
    except ServerError as e:
        print(f"screenshots: {e}", file=sys.stderr)
        return 1
    for p in sorted(out.glob("*.png")):
        print(p)
    return 0


ROOT = Path(__file__).resolve().parents[1]  # the source tree (its recordings and fixtures)
RECORDINGS = ("record-bf16-graphs.jsonl.gz", "record-bnb4-eager.jsonl.gz")
TRACE = ROOT / "tests" / "fixtures" / "vllm_cpu_demo_4_steps.pt.trace.json.gz"


def offline(out: Path) -> int:
    """``python -m quantdeck.gui.screenshots --offline DIR``: the two shots that need no
    server, written into DIR (the other files there are kept)."""
    from quantdeck.gui.main_window import MainWindow

    running = QApplication.instance()
    app = running if isinstance(running, QApplication) else QApplication(sys.argv[:1])
    out = out.expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    win = MainWindow(probe=False)
    win.resize(1600, 1000)
    win.show()
    try:
        _shoot_offline(app, win, out)
    finally:
        win.close()
    for name in ("timeline.png", "profile.png"):
        if (out / name).is_file():
            print(out / name)
    return 0


def _shoot_offline(app: QApplication, win: Any, out: Path) -> None:
    """timeline.png: two H200 launches of one model (bf16 with CUDA graphs, then bitsandbytes
    eager) replayed as one recording, with the spans either side of the knob change compared;
    profile.png: the Trace page over a trace vLLM's profiler wrote (4 steps of the demo
    model). Skipped where the source tree's recordings or trace are not there (a wheel)."""
    import tempfile

    from quantdeck.core.monitor import Recorder, read_recording, timeline_of

    recs = [ROOT / "docs" / "gpu-validation" / name for name in RECORDINGS]
    if all(p.is_file() for p in recs):
        read = [read_recording(p) for p in recs]
        with tempfile.TemporaryDirectory(prefix="quantdeck-shot-") as tmp:
            path = Path(tmp) / "two-launches.jsonl"
            rec = Recorder(path, dict(read[0].header.info))
            events = [*timeline_of(read).markers, *(e for r in read for e in r.events)]
            for ev in sorted(events, key=lambda e: getattr(e, "t", None) or 0.0):
                rec.write(ev)
            rec.close()
            win.open_recording(str(path))
        replay = win.replays[-1]  # the recording's own window
        replay.resize(win.size())
        replay.show()
        replay.panel.compare_button.click()
        _wait(app, lambda: False, 1.0)
        replay.panel.refresh(force=True)
        replay.grab().save(str(out / "timeline.png"))
        replay.close()
    if TRACE.is_file():
        view = win.profile_view
        win.tabs.setCurrentWidget(win._monitor_box)
        win.monitor_pages.setCurrentWidget(view)
        view.open_trace(TRACE)
        _wait(app, lambda: view.summary is not None, 30)
        _wait(app, lambda: False, 0.5)
        win.grab().save(str(out / "profile.png"))
        win.monitor_pages.setCurrentWidget(win.monitor)


def _shoot(app: QApplication, out: Path, size: tuple[int, int] = (1400, 900)) -> None:
    """Drive the window and save the PNGs into ``out``; ServerError if it never got ready."""
    from quantdeck.gui.main_window import MainWindow

    win = MainWindow()
    win.resize(*size)
    win.show()
    demo = ensure_demo_model()
    win.add_model(demo, select=True)
    launch = win.launch
    kv_bytes = launch.form.editors["kv_cache_memory_bytes"].widget
    assert isinstance(kv_bytes, QLineEdit)
    kv_bytes.setText("64MiB")
    launch.eager.setChecked(True)
    kv_events = launch.form.editors["kv_events"].widget
    assert isinstance(kv_events, QCheckBox)
    kv_events.setChecked(True)  # for the KV view (kv.png)
    win.monitor.ttft_limit.setValue(2000)
    win.monitor.kv_limit.setValue(1)  # the load crosses it: an alert raised and cleared
    # Start is off while the engine's options are read (a first run on a machine: seconds)
    if not _wait(app, launch.start_button.isEnabled, 180):
        win.close()
        raise ServerError(f"Start stayed off: {launch.start_button.toolTip() or 'no reason'}")
    _wait(app, lambda: False, 0.5)
    launch.grab().save(str(out / "launch.png"))
    launch.start_button.click()
    if (
        not _wait(app, lambda: win.controller.state in ("ready", "crashed"), 600)
        or win.controller.state != "ready"
    ):
        state = win.controller.state
        win.close()
        raise ServerError(f"the server did not become ready ({state})")
    _wait(app, lambda: False, 1.0)
    launch.grab().save(str(out / "launch.png"))
    url, model = win.controller.url, win.controller.model_name
    assert url is not None and model is not None  # set once the server is ready
    loader = _background_load(url, model, 25)
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
    win.monitor_pages.setCurrentWidget(win.alerts_view)
    _wait(app, lambda: False, 0.5)
    win.grab().save(str(out / "alerts.png"))
    win.monitor_pages.setCurrentWidget(win.monitor)
    _shoot_kv(app, win, out)
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
    _shoot_offline(app, win, out)
    try:
        _shoot_fleet(app, win, out, target.parent)
        _shoot_router(app, win, out)
    finally:
        win.close()
        shutil.rmtree(target.parent, ignore_errors=True)  # our temp folder: the W8A8 model


def _shoot_kv(app: QApplication, win: Any, out: Path) -> None:
    """The Monitor's KV view once prompts sharing a long prefix were served (kv.png)."""
    kv = win.kv_view
    loader = _shared_prefix_load(win.controller.url, win.controller.model_name)
    _wait(app, lambda: not loader.is_alive(), 300)
    if not _wait(app, lambda: kv.last is not None and bool(kv.last.top_prefixes), 10):
        raise ServerError("KV view: no shared prefix in the kv events")
    win.monitor_pages.setCurrentWidget(kv)
    _wait(app, lambda: kv.tokenizer is not None, 10)
    _wait(app, lambda: False, 1.0)
    kv.refresh()
    win.grab().save(str(out / "kv.png"))
    win.monitor_pages.setCurrentWidget(win.monitor)


def _fleet_file(folder: Path) -> Path:
    """Two demo instances (eager, 64 MiB of KV cache, two seats) behind a round-robin router,
    on free ports."""
    import yaml

    from quantdeck.core.runtime import free_port

    profile = {
        "model": str(ensure_demo_model()),
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": 2,
    }
    doc = {
        "router": {"port": free_port(), "policy": "round_robin", "retries": 2},
        "instances": [
            {"name": "a", "port": free_port(), "profile": profile, "restart": "on-failure"},
            {"name": "b", "port": free_port(), "profile": profile, "restart": "on-failure"},
        ],
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _shoot_trial(app: QApplication, win: Any, out: Path) -> None:
    """Try live on instance a: max-num-seqs 2 -> 8 under load, the Trial view while it
    measures (trial.png) and once decided and carried out (trial-decided.png)."""
    view = win.fleet
    win.tabs.setCurrentWidget(view)
    view.select("a")
    _wait(app, lambda: view.try_button.isEnabled(), 30)
    view.try_button.click()
    dialog = view.trial_dialog
    dialog.form.editors["max_num_seqs"].widget.setValue(8)
    dialog.min_requests.setValue(20)
    dialog.max_duration.setValue(120)
    loader = None
    try:
        dialog.ok_button.click()  # the candidate starts on an idle machine (2 cores here)
        if not _wait(app, lambda: view.trial is not None, 120):
            raise ServerError(f"Try live: no trial ({dialog.error.text()})")
        trial = view.trial
        if not _wait(
            app, lambda: trial.phase in ("measuring", "decided") or trial.done.is_set(), 300
        ):
            raise ServerError(f"Try live: the trial never measured ({trial.phase})")
        # 9 clients over a, b and the candidate: a's two seats queue, the candidate's eight not
        loader = _background_load(view.spec.router.url, str(ensure_demo_model()), 150, 9)

        def measured() -> bool:
            cand = trial.arms.candidate
            return (cand is not None and (cand.requests or 0) >= 10) or trial.done.is_set()

        _wait(app, measured, 120)
        _wait(app, lambda: False, 3.0)  # a few points on the curves
        win.grab().save(str(out / "trial.png"))
        _wait(app, lambda: trial.done.is_set(), 300)
        _wait(app, lambda: False, 2.0)
        win.grab().save(str(out / "trial-decided.png"))
    finally:
        if loader is not None:
            loader.kill()
            loader.wait(timeout=30)


def _shoot_fleet(app: QApplication, win: Any, out: Path, folder: Path) -> None:
    """The Fleet tab with a live two-instance fleet under load (fleet.png); then "Open in
    Monitor" must attach the Monitor to instance a, and Stop fleet must leave no process."""
    import psutil

    view = win.fleet
    win.tabs.setCurrentWidget(view)
    view.load(str(_fleet_file(folder)))
    _wait(app, lambda: view.start_button.isEnabled(), 30)
    view.start_button.click()
    try:
        _wait(app, lambda: view.phase == "serving" or view.job is None, 900)
        if view.phase != "serving":
            raise ServerError(f"the fleet did not come up: {view.message.text()}")
        loader = _background_load(view.spec.router.url, str(ensure_demo_model()), 40)
        rows = view.rows.rows
        _wait(app, lambda: all(r.tok_s for r in rows[1:]) and rows[0].requests, 60)
        view.select("a")
        _wait(app, lambda: False, 1.0)
        win.grab().save(str(out / "fleet.png"))
        view.open_monitor.click()
        if not _wait(app, lambda: len(win.monitor.store) >= 3, 60):
            raise ServerError(f"Open in Monitor: no points from a ({win.controller.state})")
        # the Monitor follows a and overlays both instances (monitor-fleet.png)
        win.tabs.setCurrentWidget(win._monitor_box)
        series = view.series
        _wait(app, lambda: all(len(s) >= 15 for s in series.values()), 60)
        _wait(app, lambda: False, 1.0)
        win.grab().save(str(out / "monitor-fleet.png"))
        _wait(app, lambda: not loader.is_alive(), 60)
        _shoot_trial(app, win, out)
    finally:
        pids = {c.pid for c in psutil.Process().children(recursive=True)}
        win.controller.stop()
        view.stop_fleet()
        _wait(app, lambda: view.job is None, 180)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    if left:
        raise ServerError(f"Stop fleet left processes {left}")


def _shoot_router(app: QApplication, win: Any, out: Path) -> None:
    """The Launch tab's fleet of one (Start behind the router) under load: serving
    (router-serving.png), a live trial of the form's max-num-seqs 8 promoted (router-promoted
    .png: the Trial view; router-monitor.png: the instance's one Monitor source and its
    markers), undone (router-undone.png), then its instance killed: down in every view, Restart
    offered (router-crashed.png); Restart serves again, Stop leaves nothing."""
    import os
    import signal

    launch, view = win.launch, win.fleet
    ed = launch.form.editors
    win.tabs.setCurrentWidget(launch)
    ed["max_num_seqs"].widget.setValue(1)
    ed["kv_events"].widget.setChecked(False)
    launch.behind_router.setChecked(True)
    if not _wait(app, launch.start_button.isEnabled, 60):
        raise ServerError(f"behind the router: Start stayed off ({launch.start_button.toolTip()})")
    launch.start_button.click()
    loader = None
    try:
        _wait(app, lambda: win.router_phase() == "serving" or not win.router.running, 900)
        if win.router_phase() != "serving":
            raise ServerError(f"behind the router: not serving ({launch.stage.text()})")
        url = view.spec.router.url
        # 3 clients for the whole part (the candidate starts beside them on 2 cores)
        loader = _background_load(url, str(ensure_demo_model()), 900, 3)
        _wait(app, lambda: len(win.monitor.store) >= 10, 60)
        win.grab().save(str(out / "router-serving.png"))
        ed["max_num_seqs"].widget.setValue(8)
        if not _wait(app, launch.try_live_button.isEnabled, 30):
            raise ServerError(f"Try live… stayed off: {launch.try_live_button.toolTip()}")
        launch.try_live_button.click()
        dialog = view.trial_dialog
        dialog.min_requests.setValue(20)
        dialog.max_duration.setValue(240)
        # the operator decides (a busy 2-core machine may judge 8 seats worse than 1: the
        # tour shows a promotion and its undo, whatever the verdict)
        dialog.decide.setCurrentText("ask")
        before = view.trial_view  # the fleet tour's trial, shown until this one's view comes
        dialog.ok_button.click()
        if not _wait(app, lambda: view.trial_view not in (None, before), 120):
            raise ServerError(f"Try live: no trial ({dialog.error.text()})")
        tv = view.trial_view
        _wait(app, lambda: tv.promote_button.isEnabled() or tv.result is not None, 400)
        _wait(app, lambda: False, 8.0)  # a few looks of the verdict on the curves
        if tv.promote_button.isEnabled():
            tv.promote_button.click()
        _wait(app, lambda: tv.result is not None, 300)
        if tv.result != "promoted":
            raise ServerError(f"the trial was not promoted: {tv.result_label.text()}")
        _wait(app, lambda: False, 3.0)
        win.grab().save(str(out / "router-promoted.png"))
        win.tabs.setCurrentWidget(win.monitor_tab)
        _wait(app, lambda: False, 3.0)
        win.monitor.refresh(force=True)
        win.grab().save(str(out / "router-monitor.png"))
        win.tabs.setCurrentWidget(view)
        view.select("serve")
        if not _wait(app, view.undo_button.isEnabled, 60):
            raise ServerError("Undo promotion stayed off")
        view.undo_button.click()
        _wait(app, lambda: view.trial_view is not tv, 60)
        undo = view.trial_view
        _wait(app, lambda: undo.result is not None, 600)
        _wait(app, lambda: False, 3.0)
        win.grab().save(str(out / "router-undone.png"))
        loader.kill()
        loader.wait(timeout=30)
        loader = None
        pid = view.fleet.servers["serve"].pid
        os.kill(pid, signal.SIGKILL)
        _wait(app, lambda: "down behind the router" in win.state_label.text(), 30)
        win.tabs.setCurrentWidget(launch)
        _wait(app, lambda: False, 1.0)
        win.grab().save(str(out / "router-crashed.png"))
        launch.restart_button.click()
        _wait(app, lambda: view.phase_label.text() == "fleet: serving", 600)
    finally:
        if loader is not None:
            loader.kill()
            loader.wait(timeout=30)
        win.controller.stop()
        view.stop_fleet()
        _wait(app, lambda: view.job is None, 180)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
