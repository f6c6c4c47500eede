"""The Trial view and "Try live…" in the Fleet tab.

Without a server: a real :class:`LiveTrial` of a fleet instance (not started) reports its steps
through the fleet's own event path, with a verdict and arms' figures made by the core's judge
from two arms' scrapes, and the instances' ``metrics`` events as the fleet's sampler makes them;
the view shows them and its buttons ask the trial for the operator's decision. The Fleet tab
shows the candidate as a row of its own and, after a promotion, the instance's new knobs; the
Try live dialog shows the diff and a refusal in one red line.

With a server (marked ``server``): the Launch tab serving the demo behind the router (a fleet
of one), a clearly better candidate tried live from its form under load through the router,
promoted in the view (the Monitor following the instance), undone, with no failed client
request.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import metrics_event
from fleet_load import Load, tiny_fleet_file
from live_trials import trial_of
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSpinBox
from pytestqt.exceptions import TimeoutError as QtTimeoutError

from quantdeck.core.events import InstanceEvent, StateEvent, TrialEvent
from quantdeck.core.fleet import Fleet
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.fleet.rows import fleet_news
from quantdeck.core.fleet.trial import ArmSpan, TrialOptions, judge
from quantdeck.core.monitor.metrics import Histogram, RawMetrics
from quantdeck.core.payloads import ArmFigures, ProbeFigures, TrialArms
from quantdeck.gui.fleet import FleetView, TryLiveDialog
from quantdeck.gui.trial_view import TrialView

BOUNDS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, math.inf)
TTFT = "TTFT p99 (ms)"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    return tiny_fleet_file(tmp_path)


@pytest.fixture
def view(qtbot: Any, fleet_file: Path) -> Iterator[FleetView]:
    v = FleetView()
    qtbot.addWidget(v)
    v.load(str(fleet_file))
    qtbot.waitUntil(lambda: v.model.rowCount() == 2, timeout=10_000)
    yield v
    v.shutdown()


@pytest.fixture
def fleet(view: FleetView) -> Fleet:
    assert view.spec is not None
    f = Fleet(view.spec)
    view.watch(f)
    return f


def live_trial(fleet: Fleet, decide: str = "auto") -> LiveTrial:
    """A trial of instance a with max-num-seqs 8, as the fleet makes one (not started)."""
    return trial_of(
        fleet, 8, opts=TrialOptions(decide=decide, min_requests=20), saved="profile saved"
    )


def _histogram(samples: np.ndarray) -> Histogram:
    idx = np.searchsorted(np.asarray(BOUNDS), samples, side="left")
    cumulative = np.cumsum(np.bincount(idx, minlength=len(BOUNDS)))
    buckets = tuple(zip(BOUNDS, (float(c) for c in cumulative), strict=True))
    return Histogram(buckets=buckets, count=buckets[-1][1], total=float(np.sum(samples)))


def _span(ttft: np.ndarray, tokens: float) -> ArmSpan:
    def raw(t: float, **kw: Any) -> RawMetrics:
        return RawMetrics(
            t, kw.get("gauges", {}), kw.get("counters", {}), kw.get("h", {}), {}, 0, 0
        )

    end = raw(
        60.0,
        h={"ttft": _histogram(ttft), "e2e": _histogram(ttft * 4 + 0.2)},
        counters={"generation_tokens": tokens},
        gauges={"kv_usage": 0.25},
    )
    return ArmSpan(raw(0.0), end)


def measured(trial: LiveTrial, n: int) -> dict[str, Any]:
    """The running verdict and both arms' figures as the trial reports them, for ``n``
    requests per arm: the candidate's TTFT a sixth of the incumbent's (beyond vLLM's buckets)."""
    rng = np.random.default_rng(1)
    inc = _span(rng.lognormal(math.log(0.3), 0.4, n), 600.0)
    cand = _span(rng.lognormal(math.log(0.05), 0.4, n), 900.0)
    verdict = judge(inc, cand, trial.opts)
    arms = TrialArms(inc.figures({}), cand.figures({}))
    trial.verdict, trial.arms = verdict, arms
    return {"verdict": verdict, "arms": arms}


def arms_cell(v: TrialView, figure: str, column: str) -> str:
    row = v.arms_model.find(lambda r: r.figure.title == figure)
    return v.arms_model.text(row, column)


def buttons(v: TrialView) -> tuple[bool, bool, bool]:
    return (
        v.promote_button.isEnabled(),
        v.rollback_button.isEnabled(),
        v.stop_button.isEnabled(),
    )


def test_the_view_follows_a_trial_from_admitted_to_promoted(qtbot: Any, fleet: Fleet) -> None:
    trial = live_trial(fleet)
    trial._event("admitted", reason="fits: 0.1 GiB of 12 GiB")
    v = TrialView(trial, fleet)
    qtbot.addWidget(v)
    assert v.title.text() == "Trial of a: max-num-seqs 2 → 8 · goal ttft_p99 · decide auto"
    assert v.phase_label.text() == "phase: admitted"
    assert buttons(v) == (False, False, True)  # only Stop before the measuring

    emit = fleet._events.emit
    emit(InstanceEvent("a+try", StateEvent("ready")))
    trial._event("started", reason="ready in 20 s")
    trial._event("measuring", **measured(trial, 10))
    assert v.phase_label.text() == "phase: measuring · candidate ready"
    assert v.verdict_label.text().startswith("verdict: TTFT p99: inconclusive")
    assert "10 / 10 requests" in v.verdict_label.text()
    assert v.reason_label.text() == "10 and 10 requests measured; 20 an arm before the first look"
    assert buttons(v) == (True, True, True)  # auto: Promote and Roll back override it

    trial._event("measuring", **measured(trial, 2000))
    text = v.verdict_label.text()
    inc, cand = trial.arms.incumbent, trial.arms.candidate
    assert inc is not None and cand is not None
    # the verdict's figures are the arms' table's: one computation, one source
    head = f"verdict: TTFT p99 {inc.ttft_p99_ms:,.4g} → {cand.ttft_p99_ms:,.4g} ms, ×0."
    assert text.startswith(head), text
    assert "better (beyond the 10 % margin) · 2000 / 2000 requests" in text
    assert v.split_label.text() == "traffic split: incumbent 50 % (2000) · candidate 50 % (2000)"
    assert arms_cell(v, "requests finished", "incumbent") == "2000"
    inc, cand = trial.arms.incumbent, trial.arms.candidate
    assert inc is not None and cand is not None
    assert arms_cell(v, TTFT, "incumbent") == f"{inc.ttft_p99_ms:.1f}"
    assert arms_cell(v, TTFT, "candidate") == f"{cand.ttft_p99_ms:.1f}"
    assert arms_cell(v, TTFT, "change").startswith("-")  # faster: green
    row = v.arms_model.find(lambda r: r.figure.title == TTFT)
    color = v.arms_model.data(v.arms_model.index(row, 3), Qt.ItemDataRole.ForegroundRole)
    assert color.name() == "#2e7d32"
    assert arms_cell(v, "generation (tokens/s)", "candidate") == "15.0"

    trial._event("decided", decision="promote", reason="ttft_p99: better", **measured(trial, 200))
    assert buttons(v) == (False, False, False)
    assert v.result_label.text() == "decided: promote (ttft_p99: better)"
    trial._event("promoted", reason="profile saved")
    assert v.result == "promoted"
    assert v.result_label.text() == "Promoted max-num-seqs 8: profile saved"
    assert buttons(v) == (False, False, False)


def test_an_undo_is_shown_as_an_undo_not_as_a_trial(qtbot: Any, fleet: Fleet) -> None:
    """Undo after a promotion is no trial: its title says where it goes back to, nothing is
    compared (no verdict, no Promote or Roll back), and its end reads "Undone: back to …";
    its events say so (``undo``), and the Fleet tab's lines too."""
    inst = fleet.spec.instances[0]
    assert inst.cfg is not None
    inst.cfg.scheduler.max_num_seqs = 16  # the promoted launch; the one before had 2
    trial = trial_of(fleet, 2, undo="undo of the promotion (max-num-seqs 2 → 16)", saved="")
    trial._event("admitted", reason="fits")
    v = TrialView(trial, fleet)
    qtbot.addWidget(v)
    assert v.title.text() == "Undo on a: back to max-num-seqs 2"
    assert v.arms_table.isHidden() and all(w.isHidden() for w in v.plots.values())
    assert v.verdict_label.text().startswith("an undo: no comparison")
    assert buttons(v) == (False, False, True)  # Stop only: it goes back once it serves
    trial._event("started", reason="ready in 20 s")
    assert buttons(v) == (False, False, True)
    trial._event("promoted")
    assert v.result == "promoted" and v.result_label.text() == "Undone: back to max-num-seqs 2"
    assert buttons(v) == (False, False, False)
    ev = TrialEvent("promoted", knobs={"max_num_seqs": [16, 2]}, undo=True)
    assert fleet_news(ev) == "undone: back to max-num-seqs 2"
    assert fleet_news(TrialEvent("admitted", knobs={"max_num_seqs": [2, 16]}, reason="fits")) == (
        "trial admitted: max-num-seqs 2 → 16 (fits)"
    )


def test_both_arms_curves_fill_from_their_metrics_events(qtbot: Any, fleet: Fleet) -> None:
    trial = live_trial(fleet)
    v = TrialView(trial, fleet)
    qtbot.addWidget(v)
    emit = fleet._events.emit
    for i in range(5):
        emit(InstanceEvent("a", metrics_event(100.0 + i, ttft_p99_ms=300.0 + i, kv_usage_pct=20)))
        cand = metrics_event(100.5 + i, ttft_p99_ms=100.0 + i, kv_usage_pct=40)
        emit(InstanceEvent("a+try", cand))
    emit(InstanceEvent("b", metrics_event(106.0, ttft_p99_ms=1.0)))  # not an arm's
    v.redraw()
    x_i, y_i = v.curves[(TTFT, "incumbent")].getData()
    x_c, y_c = v.curves[(TTFT, "candidate")].getData()
    assert list(y_i) == [300.0, 301.0, 302.0, 303.0, 304.0]
    assert list(y_c) == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert list(x_c) == [0.5, 1.5, 2.5, 3.5, 4.5]  # one time axis: the view's first sample
    assert set(v.curves[("KV cache (%)", "candidate")].getData()[1]) == {40.0}
    # a scrape that failed is a gap, not a line
    from quantdeck.core.events import MetricsEvent

    emit(InstanceEvent("a+try", MetricsEvent(106.0, error="connection refused")))
    v.redraw()
    assert math.isnan(v.curves[(TTFT, "candidate")].getData()[1][-1])
    # after the decision the curves keep the trial's window
    trial._event("decided", decision="rollback", reason="worse")
    emit(InstanceEvent("a", metrics_event(120.0, ttft_p99_ms=1.0)))
    v.redraw()
    assert len(v.curves[(TTFT, "incumbent")].getData()[1]) == 5


@pytest.mark.parametrize(
    ("button", "decision"),
    [
        ("promote_button", ("promote", "by the operator")),
        ("rollback_button", ("rollback", "by the operator")),
        ("stop_button", ("rollback", "stopped by the operator")),
    ],
)
def test_the_operators_buttons_decide_on_the_trial(
    qtbot: Any, fleet: Fleet, button: str, decision: tuple[str, str]
) -> None:
    trial = live_trial(fleet, decide="ask")
    trial._event("admitted", reason="fits")
    trial._event("measuring", **measured(trial, 10))
    v = TrialView(trial, fleet)  # built after the events: it reads the trial's state
    qtbot.addWidget(v)
    assert v.phase_label.text() == "phase: measuring"
    assert v.verdict_label.text().startswith("verdict: TTFT p99: inconclusive")
    assert buttons(v) == (True, True, True)
    qtbot.mouseClick(getattr(v, button), Qt.MouseButton.LeftButton)
    assert trial._operator() == decision
    assert buttons(v) == (False, False, False)  # asked once
    assert v.result_label.text()


def test_a_trial_that_ended_before_the_view_shows_its_result(qtbot: Any, fleet: Fleet) -> None:
    trial = live_trial(fleet)
    trial._event("decided", decision="rollback", reason="the candidate crashed")
    trial._event("rolled back", reason="the candidate crashed")
    trial.result = "rolled back"
    v = TrialView(trial, fleet)
    qtbot.addWidget(v)
    assert buttons(v) == (False, False, False)


# -- the Fleet tab ----------------------------------------------------------------------------
def serving(fleet: Fleet) -> None:
    emit = fleet._events.emit
    emit(InstanceEvent("a", StateEvent("ready")))
    emit(InstanceEvent("router", StateEvent("ready", url="http://127.0.0.1:18080")))


def test_the_candidate_has_a_row_and_a_promotion_gives_the_instance_its_knobs(
    qtbot: Any, view: FleetView, fleet: Fleet
) -> None:
    serving(fleet)
    view.select("a")
    assert view.try_button.isEnabled()
    assert view.model.text(1, "knobs") == "max-num-seqs=2"
    trial = live_trial(fleet)
    trial._event("admitted", reason="fits")
    view.show_trial(trial)
    assert not view.try_button.isEnabled()  # one trial at a time
    names = [view.model.text(i, "instance") for i in range(view.model.rowCount())]
    assert names == ["router", "a", "a+try"]
    assert view.model.text(2, "role") == "candidate"
    assert view.model.text(2, "knobs") == "max-num-seqs=8"
    assert view.selected() is not None and view.selected().name == "a"  # kept
    fleet._events.emit(InstanceEvent("a+try", StateEvent("ready")))
    assert view.model.text(2, "state") == "ready"
    view.select("a+try")
    assert not view.inst_stop.isEnabled()  # the trial's buttons act on the candidate
    assert "a: trial admitted: max-num-seqs 2 → 8" in view.events.toPlainText()

    trial._event("decided", decision="promote", reason="better")
    fleet._events.emit(InstanceEvent("a", StateEvent("stopped")))  # the incumbent, retired
    trial._event("promoted", reason="profile saved")
    names = [view.model.text(i, "instance") for i in range(view.model.rowCount())]
    assert names == ["router", "a"]
    assert view.model.text(1, "knobs") == "max-num-seqs=8"
    assert view.model.text(1, "state") == "ready"  # the candidate's server is a's now
    assert view.rows is not None and view.rows.row("a").url == trial.url
    assert view.trial_view is not None and view.trial_view.result == "promoted"
    trial.done.set()
    view.select("a")
    assert view.try_button.isEnabled()


def test_try_live_shows_the_diff_and_a_refusal_in_one_red_line(
    qtbot: Any, view: FleetView, fleet: Fleet
) -> None:
    serving(fleet)
    view.select("a")
    qtbot.mouseClick(view.try_button, Qt.MouseButton.LeftButton)
    dialog = view.trial_dialog
    assert isinstance(dialog, TryLiveDialog) and dialog.isVisible()
    assert dialog.diff.text().startswith("no knob changed")
    dialog.form.editors["max_num_seqs"].widget.setValue(8)  # type: ignore[union-attr]
    assert isinstance(dialog.form.editors["max_num_seqs"].widget, QSpinBox)
    assert dialog.diff.text() == "changed: max-num-seqs 2 → 8"
    dialog.slo.setText("ttft<=5")
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    assert dialog.error.text().startswith("--slo 'ttft<=5'")
    dialog.slo.setText("ttft_p99<=500ms")
    # the fleet's own refusal: its servers never started (nothing runs in this test)
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.error.text() != "", timeout=10_000)
    assert dialog.error.text() == "instance 'a' does not serve now: try it once it does"
    assert "\n" not in dialog.error.text() and "#b71c1c" in dialog.error.styleSheet()
    assert dialog.isVisible() and dialog.ok_button.isEnabled()  # the operator may edit
    assert view.trial_view is None and fleet.trial is None
    assert dialog.options().probe is False
    dialog.probe.setChecked(True)  # the paired probe, asked for
    assert dialog.options().probe is True
    dialog.reject()
    # the Undo promotion button waits for a promotion of the selected instance
    assert not view.undo_button.isEnabled()


def test_the_split_line_says_when_the_paired_probe_decides() -> None:
    from quantdeck.gui.trial_view import split_text

    arms = TrialArms(ArmFigures(requests=3), ArmFigures(requests=1))
    assert split_text(arms) == "traffic split: incumbent 75 % (3) · candidate 25 % (1)"
    arms = dataclasses.replace(arms, probe=ProbeFigures(24, 1, why="asked for (--probe)"))
    assert split_text(arms).endswith(
        "; paired probe: 24 pairs decide (asked for (--probe)), 1 failed"
    )


# -- on a real fleet ----------------------------------------------------------------------------
@pytest.mark.server
@pytest.mark.solo
def test_a_better_candidate_is_promoted_in_the_trial_view(
    qtbot: Any, demo_model: Path, demo_server_parked: Any, tmp_path: Path
) -> None:
    """The Launch tab serves the demo (max-num-seqs 1, eager, small KV) behind the router, 6
    clients on the form's port; max-num-seqs 8 in the form, its Try live… is promoted, shown
    so, the Monitor following the instance to its new port; undone; 0 failed requests."""
    import httpx

    from quantdeck.core.launch import cpu_device
    from quantdeck.core.runtime import free_port
    from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV
    from quantdeck.gui.main_window import MainWindow

    mp = pytest.MonkeyPatch()
    for k, value in ONE_PROCESS_ENGINE_ENV.items():
        mp.setenv(k, value)
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_model(demo_model, select=True)
    launch, v = win.launch, win.fleet
    ed = launch.form.editors
    ed["enforce_eager"].widget.setChecked(True)  # type: ignore[union-attr]
    ed["max_num_seqs"].widget.setValue(1)  # type: ignore[union-attr]
    ed["kv_cache_memory_bytes"].widget.setText("64MiB")  # type: ignore[union-attr]
    port = free_port()
    ed["port"].widget.setValue(port)  # type: ignore[union-attr]
    load: Load | None = None
    try:
        launch.behind_router.setChecked(True)
        qtbot.mouseClick(launch.start_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(
            lambda: (
                win.router_phase() == "serving"
                or (not win.router.pending and win.router_phase() is None)
            ),
            timeout=600_000,
        )
        assert win.router_phase() == "serving", (launch.router_error.text(), v.message.text())
        url = f"http://127.0.0.1:{port}"  # the Launch form's port: the router's
        assert launch.stage.text().startswith(f"serving behind the router at {url}")
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        assert v.rows is not None
        qtbot.waitUntil(lambda: win.controller.url == v.rows.row("serve").url, timeout=30_000)

        load = Load(url, model).__enter__()
        assert not launch.try_live_button.isEnabled()  # the form is the running launch
        ed["max_num_seqs"].widget.setValue(8)  # type: ignore[union-attr]
        qtbot.waitUntil(launch.try_live_button.isEnabled, timeout=10_000)
        qtbot.mouseClick(launch.try_live_button, Qt.MouseButton.LeftButton)
        dialog = v.trial_dialog
        assert dialog is not None and win.tabs.currentWidget() is v
        assert dialog.diff.text() == "changed: max-num-seqs 1 → 8"
        dialog.min_requests.setValue(20)
        dialog.max_duration.setValue(240)
        qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: v.trial_view is not None, timeout=60_000)
        tv = v.trial_view
        assert tv is not None
        qtbot.waitUntil(lambda: v.rows is not None and "serve+try" in v.rows, timeout=10_000)
        try:  # (a clear difference may be decided at the first look, before a poll sees it)
            qtbot.waitUntil(
                lambda: tv.phase == "measuring" or tv.result is not None, timeout=300_000
            )
        except QtTimeoutError:  # what the fleet said meanwhile
            raise AssertionError(
                (tv.phase, v.message.text(), v.events.toPlainText()[-3000:])
            ) from None
        if tv.result is None:
            assert tv.promote_button.isEnabled()
        qtbot.waitUntil(lambda: tv.result is not None, timeout=400_000)
        assert tv.result == "promoted", (tv.result_label.text(), tv.reason_label.text())
        assert "better (beyond the" in tv.verdict_label.text(), tv.verdict_label.text()
        tv.redraw()
        for arm in ("incumbent", "candidate"):
            assert len(tv.curves[(TTFT, arm)].getData()[1]) > 0, arm
        assert v.rows is not None and "serve+try" not in v.rows
        assert "max-num-seqs=8" in v.model.text(1, "knobs")
        # in the operator's words, no file named (a fleet of one keeps its launch itself)
        assert tv.result_label.text().startswith("Promoted max-num-seqs 8: ")
        assert "undo starts it again" in tv.result_label.text()  # no sleep mode on CPU
        assert ".yaml" not in tv.result_label.text()
        # the Monitor follows the instance to the candidate's port; the form is its launch now
        promoted = v.rows.row("serve").url
        qtbot.waitUntil(lambda: win.controller.url == promoted, timeout=30_000)
        qtbot.waitUntil(
            lambda: launch.try_live_button.toolTip().startswith("the form's knobs are the "),
            timeout=10_000,
        )
        assert not launch.try_live_button.isEnabled()
        assert launch.message.text() == "Promoted max-num-seqs 8 (Undo: the Fleet tab)"
        assert launch.config().scheduler.max_num_seqs == 8  # the form follows what serves
        # Undo promotion: the launch from before back (started beside: no sleep here)
        v.select("serve")
        qtbot.waitUntil(v.undo_button.isEnabled, timeout=10_000)
        qtbot.mouseClick(v.undo_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: v.trial_view is not tv, timeout=60_000)
        undo = v.trial_view
        assert undo is not None
        qtbot.waitUntil(lambda: undo.result is not None, timeout=400_000)
        assert undo.result == "promoted", (undo.result_label.text(), undo.reason_label.text())
        assert "max-num-seqs=8" not in v.model.text(1, "knobs")
        assert undo.title.text() == "Undo on serve: back to max-num-seqs 1"  # not a trial
        assert undo.result_label.text().startswith("Undone: back to max-num-seqs 1")
        # an undo is not undone in turn: Undo is off once used
        assert v.fleet is not None and "serve" not in v.fleet.retired
        assert not v.undo_button.isEnabled()
        load.__exit__()
        assert load.failed == [] and load.sent > 0, load.failed[:3]
        running = v.running_launch("serve")
        assert running is not None and running.scheduler.max_num_seqs == 1
        # the form follows: back to 1, so Try live… does not offer the change just undone
        qtbot.waitUntil(lambda: launch.config().scheduler.max_num_seqs == 1, timeout=10_000)
        assert launch.message.text() == "Undone: back to max-num-seqs 1"
        assert not launch.try_live_button.isEnabled()
        # one Monitor source for the instance across both moves, with both markers, its
        # history from before the promotion kept
        mon = win.monitor
        instance_sources = [k for k in mon.sources if k.startswith("instance serve of ")]
        assert len(instance_sources) == 1 and not any(k.startswith("url ") for k in mon.sources)
        src = mon.sources[instance_sources[0]]
        assert src.label == "serve (behind the router)"
        whats = [m.what for m in src.timeline.markers]
        assert "promoted" in whats and "undone" in whats, whats
        promoted_at = next(m.t for m in src.timeline.markers if m.what == "promoted")
        first_t = src.store.first_t
        assert first_t is not None and first_t < promoted_at  # samples from before it
        # Logs behind the router: a header per instance start and trial step, no router probe
        logs = win.logs.text()
        assert "GET /get_load" not in logs and "GET /health" not in logs  # probes
        assert "━━ serve: promoted max-num-seqs 8" in logs
        assert "━━ serve: undone: back to max-num-seqs 1" in logs

        # kill -9 of the instance: every view says down within 2 s; Restart serves again
        assert v.fleet is not None
        pid = v.fleet.servers["serve"].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: v.phase_label.text().startswith("fleet: down"), timeout=2_000)
        qtbot.waitUntil(lambda: "down behind the router" in win.state_label.text(), timeout=500)
        assert launch.stage.text().startswith(f"down behind the router at {url}")
        assert "no instance serves (serve crashed" in launch.stage.text()
        assert launch.restart_button.isEnabled() and launch.stop_button.isEnabled()
        qtbot.mouseClick(launch.restart_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: v.phase_label.text() == "fleet: serving", timeout=300_000)
        assert "serving behind the router" in win.state_label.text()
        serve_url = v.rows.row("serve").url

        def routed() -> bool:
            workers = httpx.get(url + "/list_workers", timeout=10).json()["urls"]
            return serve_url in [str(w).rstrip("/") for w in workers]

        qtbot.waitUntil(routed, timeout=30_000)
        r = httpx.post(
            url + "/v1/completions",
            json={"model": model, "prompt": "Hello", "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        if load is not None:
            load.__exit__()
        if win.router_phase() is not None:
            qtbot.mouseClick(launch.stop_button, Qt.MouseButton.LeftButton)
        v.stop_fleet()
        qtbot.waitUntil(lambda: v.job is None, timeout=180_000)
        win.close()
        mp.undo()


def test_the_arms_change_column_shows_in_a_1400_by_900_window(qtbot: Any, fleet: Fleet) -> None:
    """At 1400x900 the Trial view below the Fleet tab's table is about 1,060 x 560 px: its
    arms table showed figure, incumbent and candidate, the change cut off, and the curves got
    about 100 px. The change column now shows whole and the curves get the larger share."""
    trial = live_trial(fleet)
    trial._event("measuring", **measured(trial, 200))
    v = TrialView(trial, fleet)
    qtbot.addWidget(v)
    v.resize(1060, 560)
    v.show()
    qtbot.waitExposed(v)
    table = v.arms_table
    change = v.arms_model.column("change")
    right = table.columnViewportPosition(change) + table.columnWidth(change)
    assert table.columnViewportPosition(change) >= 0 and right <= table.viewport().width()
    plot = next(iter(v.plots.values()))
    assert plot.height() >= 150, plot.height()
