"""The Launch tab's server actions and the state line they follow: Start, Behind the router,
Stop, Restart and Try live…, on or off for the server's state (or its fleet of one's phase
behind the router), the stage with the seconds since the click, the progress and the
router's refusal."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QCheckBox, QProgressBar, QPushButton

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.diff import live_changes
from quantdeck.gui.labels import error_label, plain_label

BEHIND_ROUTER_TIP = (
    "Serve as a fleet of one behind vLLM's router on the form's port: the URL clients use "
    "stays the same across live trials, promotions and undo, and knob changes go through "
    "Try live… without downtime. The fleet shows in the Fleet tab. "
    "CLI: quantdeck serve MODEL --behind-router"
)
TRY_LIVE_TIP = (
    "Try the form's knobs on the live traffic: a candidate beside the running server, "
    "promoted or rolled back by the verdict, the URL unchanged (opens the trial in the "
    "Fleet tab). CLI: quantdeck fleet try FILE serve --KNOB VALUE"
)
ROUTER_INSTANCE = "serve"  # the fleet of one's instance (core.fleet.spec.fleet_of_one's)
STATE_NAMES = {
    "starting": "starting",
    "loading_weights": "loading weights",
    "profiling": "profiling memory",
    "compiling": "compiling",
    "capturing_cuda_graphs": "capturing CUDA graphs",
    "ready": "ready",
    "stopping": "stopping",
    "stopped": "stopped",
    "crashed": "crashed",
    "attached": "attached",
}


class ServerActions(QObject):
    """The action buttons and the state line of a Launch tab, which lays them out and
    handles their clicks. ``config()`` is the form's launch (Try live… compares it with the
    running one), ``blocking()`` why a start is refused now (empty: it is not), and
    ``has_model()`` whether a model is chosen."""

    def __init__(
        self,
        config: Callable[[], LaunchConfig],
        blocking: Callable[[], list[str]],
        has_model: Callable[[], bool],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._config, self._blocking, self._has_model = config, blocking, has_model
        self.start_button = QPushButton("Start")
        self.behind_router = QCheckBox("Behind the router")
        self.behind_router.setToolTip(BEHIND_ROUTER_TIP)
        self.stop_button = QPushButton("Stop")
        self.restart_button = QPushButton("Restart")
        self.try_live_button = QPushButton("Try live…")
        self.try_live_button.setEnabled(False)
        self.state = "stopped"  # the server's (the tab's own, or the one it attached to)
        # behind the router: the phase of the Launch tab's fleet of one (None: a plain server
        # or none), its state line, and the instance's running launch Try live… compares the
        # form with (None: why not, in _live_why)
        self.router: str | None = None
        self._router_text = ""
        self._live_running: LaunchConfig | None = None
        self._live_why = "check Behind the router and Start: Try live… changes its knobs"
        self.router_error = error_label()
        self.router_error.setVisible(False)
        self.stage = plain_label("stopped")
        # wrapped: a long line takes two lines rather than widening the window
        self.stage.setWordWrap(True)
        # a start shows its sub-stage and the time since the click, ticking once a second (a
        # CPU engine spends most of a minute importing before its first stage)
        self._stage_text = "stopped"
        self._started_at: float | None = None
        self._elapsed = QTimer(self)
        self._elapsed.setInterval(1000)
        self._elapsed.timeout.connect(self._show_stage)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.behind_router.toggled.connect(lambda _on: self.refuse(""))

    def update_buttons(self) -> None:
        """Each button on or off (and its tooltip) for the state, the phase and the form."""
        blocked = self._blocking()
        idle = self.state in ("stopped", "crashed")
        routed = self.router is not None  # the fleet of one runs: Stop stops it
        model = self._has_model()
        self.start_button.setEnabled(idle and not routed and model and not blocked)
        self.restart_button.setEnabled(
            (not idle and not routed and model and not blocked)
            or self.router == "down"  # the fleet of one's instance down: started again
        )
        self.stop_button.setEnabled(
            self.router not in (None, "stopping") or (not routed and not idle)
        )
        self.behind_router.setEnabled(idle and not routed)
        self.start_button.setToolTip(blocked[0] if blocked else "")
        self.restart_button.setToolTip(
            "Start the fleet of one's instance again, as it was launched"
            if self.router == "down"
            else "Behind the router a knob change goes through Try live…, without downtime "
            "(Stop then Start restarts the fleet of one)"
            if routed
            else ""
        )
        self._update_try_live()

    def set_server_state(self, state: str, detail: str = "") -> None:
        self.state = state
        text = STATE_NAMES.get(state, state) + (f" — {detail}" if detail else "")
        if self.router is None:  # (behind the router, the fleet's phase is the state line)
            if state == "starting" and self._started_at is None:
                self._started_at = time.monotonic()
                self._elapsed.start()
            if state == "ready" and self._started_at is not None:
                text += f" in {time.monotonic() - self._started_at:.0f} s"
            if state in ("ready", "stopped", "crashed", "attached", "stopping"):
                self._started_at = None
                self._elapsed.stop()
            # the server's package is loaded by the time it reports a state
            from quantdeck.core.runtime import START_ORDER as order

            if state in order:
                self.progress.setValue(int(100 * order.index(state) / (len(order) - 1)))
            elif state in ("stopped", "crashed"):
                self.progress.setValue(0)
        self._show_stage(text)
        self.update_buttons()

    # -- behind the router -----------------------------------------------------------------------
    def set_router_state(
        self, phase: str | None, url: str = "", instance: str = "", why: str = ""
    ) -> None:
        """The Launch tab's fleet of one (``serve --behind-router``): its ``phase`` (starting,
        serving, stopping, or while it runs its health: degraded, down; None or another: it
        does not run), the router's ``url`` (the one clients use), its instance's state while
        it starts, and ``why`` it is degraded or down (core/fleet/health.py)."""
        was = self.router
        running = ("starting", "serving", "degraded", "down", "stopping")
        self.router = phase if phase in running else None
        if self.router == "starting":
            if self._started_at is None:
                self._started_at = time.monotonic()
                self._elapsed.start()
            step = f": {ROUTER_INSTANCE} {STATE_NAMES.get(instance, instance)}" if instance else ""
            self._router_text = f"starting behind the router{step}"
            from quantdeck.core.runtime import START_ORDER as order

            if instance in order:
                self.progress.setValue(int(90 * order.index(instance) / (len(order) - 1)))
        elif self.router == "serving":
            self._router_text = f"serving behind the router at {url}\nits fleet of one: Fleet tab"
            self.progress.setValue(100)
        elif self.router in ("degraded", "down"):
            self._router_text = (
                f"{self.router} behind the router at {url}: {why}\n"
                "its fleet of one: Fleet tab (Start the instance there, or Stop here)"
            )
        elif self.router == "stopping":
            self._router_text = "stopping the fleet of one"
        else:
            self._router_text = ""
            if was is not None:
                self.progress.setValue(0)
        if self.router != "starting":
            self._started_at = None
            self._elapsed.stop()
        self.progress.setVisible(self.router in ("starting", "stopping"))  # else: room
        self._show_stage()
        self.update_buttons()

    def refuse(self, line: str) -> None:
        """A start behind the router refused (or "": none): one red line."""
        self.router_error.setText(line)
        self.router_error.setVisible(bool(line))

    def set_live_target(self, running: LaunchConfig | None, why: str = "") -> None:
        """The running launch of the fleet of one's instance, which Try live… compares the
        form with (None: Try live… is off, ``why`` says why in its tooltip)."""
        if running is self._live_running and why == self._live_why:
            return
        self._live_running, self._live_why = running, why
        self._update_try_live()

    def live_blocker(self) -> str:
        """Why Try live… is off now ("": it is on)."""
        running = self._live_running
        if running is None:
            return self._live_why or "the fleet of one does not serve"
        try:
            cfg = self._config()
        except QuantdeckError as e:
            return str(e)
        if Path(cfg.model.model).resolve() != Path(running.model.model).resolve():
            return (
                f"the form's model is not the one served ({Path(running.model.model).name}): "
                "a live trial changes knobs; Stop, then Start serves another model"
            )
        if not live_changes(running, cfg):  # the knobs a trial would change
            return "the form's knobs are the running launch's: change one to try it live"
        return ""

    def _update_try_live(self) -> None:
        why = self.live_blocker()
        self.try_live_button.setEnabled(not why)
        self.try_live_button.setToolTip(TRY_LIVE_TIP if not why else f"{why}.\n\n{TRY_LIVE_TIP}")

    def set_progress(self, stage: str, pct: float) -> None:
        if stage == "loading_weights":
            self._show_stage(f"loading weights {pct:.0f}%")
            self.progress.setValue(int(20 * (1 + pct / 100)))

    def _show_stage(self, text: str | None = None) -> None:
        """The stage line: the sub-stage, and while starting the seconds since the click."""
        if text is not None:
            self._stage_text = text
        elapsed = ""
        if self._started_at is not None:
            elapsed = f" · {time.monotonic() - self._started_at:.0f} s"
        self.stage.setText((self._router_text or self._stage_text) + elapsed)
