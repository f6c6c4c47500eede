"""The Launch tab's fleet of one (Start behind the router, as ``quantdeck serve
--behind-router``): the file written for it, whether its start is under way, and what the Launch
tab is told of it, derived by core/deployment.py (cut out of the main window, issue 44)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from quantdeck.core.deployment import RUNNING_PHASES, Deployment, behind_the_router
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, FactEvent, InstanceEvent, PlanEvent, TrialEvent
from quantdeck.gui.launch.state import ROUTER_INSTANCE

if TYPE_CHECKING:
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.gui.fleet import FleetView
    from quantdeck.gui.launch import LaunchTab

INSTANCE = ROUTER_INSTANCE  # the fleet of one's instance (core.fleet.spec.fleet_of_one's)


class RouterOfOne(QObject):
    """Starts, follows and stops the Launch tab's fleet of one through the Fleet tab, and
    tells the Launch tab its state. ``changed``: what it serves changed (the window's status
    bar tells it again)."""

    changed = Signal()

    def __init__(self, launch: LaunchTab, fleet: FleetView, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.launch, self.fleet = launch, fleet
        self.file: str | None = None  # the fleet file written for it
        self.pending = False  # written, not yet read by the Fleet tab
        self._shown: tuple[Any, ...] = ()  # what the Launch tab was last told
        self._chosen = False  # the instance is the one Monitor, Logs and Playground follow
        self._running: LaunchConfig | None = None  # its instance's launch, as last seen
        # the plan and the engine's figures of its instance and of a trial's candidate (which
        # become the instance's at a promotion): the engine-vs-plan block a plain start shows
        self._engine: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        fleet.fleet_event.connect(self._on_fleet_event)
        fleet.changed.connect(self._on_fleet_changed)
        fleet.serve_refused.connect(self._on_refused)
        launch.router_start_requested.connect(self.start)
        launch.router_restart_requested.connect(lambda: fleet.act_on(INSTANCE, "restart_instance"))

    @property
    def running(self) -> bool:
        """It runs, or its start is under way (Stop stops it, not the Launch tab's server)."""
        return self.phase() is not None or self.pending

    def phase(self) -> str | None:
        """The phase of its fleet (starting, serving, stopping); None where it does not run
        (or the Fleet tab shows another fleet)."""
        fleet = self.fleet
        if self.file is None or fleet.path != self.file:
            return None
        return fleet.phase if fleet.phase in RUNNING_PHASES else None

    def deployment(self) -> Deployment | None:
        """What it serves, told once (None: it neither runs nor is about to)."""
        fleet, phase = self.fleet, self.phase()
        rows = fleet.rows if phase is not None else None
        row = rows.row(INSTANCE) if rows is not None and INSTANCE in rows else None
        return behind_the_router(
            phase,
            pending=self.pending,
            row=row,
            url=fleet.spec.router.url if fleet.spec is not None else "",
            health=fleet.health if phase == "serving" else None,
            trial_busy=fleet.trial_busy,
        )

    def start(self, cfg: LaunchConfig) -> None:
        """A fleet file of one (the router on the form's host and port, the instance "serve"
        on a free port, served by the Launch tab's engine) that the Fleet tab reads and
        starts. A fleet of the user's that runs there is not replaced: one red line says so."""
        from quantdeck.core.fleet.spec import fleet_of_one
        from quantdeck.core.paths import cache_dir

        fleet = self.fleet
        if fleet.job is not None or self.pending:
            name = Path(fleet.path).name if fleet.path else "a fleet"
            self.launch.refuse(
                f"Not started: the Fleet tab runs {name}; stop it there first (behind the "
                "router the Launch tab serves a fleet of one of its own, and one fleet runs "
                "at a time)"
            )
            return
        try:
            path = fleet_of_one(
                cfg, cache_dir() / "fleet", engine=self.launch.engine_box.currentData() or None
            )
        except (QuantdeckError, OSError) as e:
            self.launch.refuse(f"Not started: {e}")
            return
        self.file, self.pending = str(path), True
        self.launch.set_router_state("starting")
        fleet.serve_file(str(path))

    def stop(self) -> None:
        self.fleet.stop_fleet()

    def try_live(self, cfg: LaunchConfig) -> None:
        """Try live…: the Fleet tab's dialog for its instance, the form's knobs already the
        candidate's (the diff against the running launch shown)."""
        self.fleet.select(INSTANCE)
        self.fleet.try_live(candidate=cfg)

    def _follow_launch(self, running: LaunchConfig | None) -> None:
        """The form follows the launch its instance runs: after a promotion or an undo it
        holds the running knobs (Try live… then compares with what serves, not with what was
        undone), and the message line says what changed, in the operator's words."""
        was, self._running = self._running, running
        if running is None or was is None or running is was:
            return
        from quantdeck.core.launch.diff import after_text, live_candidate, live_changes

        changes = live_changes(was, running)
        if not changes:
            return
        try:
            form = self.launch.config()
        except QuantdeckError:  # a form being edited into an error: left as it is
            return
        self.launch.set_config(live_candidate(form, running))
        trial = self.fleet.fleet.trial if self.fleet.fleet is not None else None
        undone = trial is not None and trial.undo is not None
        self.launch.message.setText(
            f"Undone: back to {after_text(changes)}"
            if undone
            else f"Promoted {after_text(changes)} (Undo: the Fleet tab)"
        )

    def _on_fleet_event(self, ev: Event) -> None:
        """Its instance's (and a candidate's) plan and the engine's figures; a promotion makes
        the candidate's the instance's."""
        if not self.running or not isinstance(ev, InstanceEvent):
            return
        from quantdeck.core.fleet.trial import CANDIDATE  # (the fleet runs: it is loaded)

        name, inner = ev.instance, ev.event
        if name not in (INSTANCE, INSTANCE + CANDIDATE):
            return
        match inner:
            case PlanEvent(plan=planned):
                self._engine[name] = (dict(planned), {})
            case FactEvent(name=fact, value=value) if name in self._engine:
                self._engine[name][1][fact] = value
            case TrialEvent(phase="promoted") if INSTANCE + CANDIDATE in self._engine:
                # (an undo woken from sleep brings no plan: the instance's stays)
                self._engine[INSTANCE] = self._engine.pop(INSTANCE + CANDIDATE)
            case _:
                return
        self._show_engine()

    def _show_engine(self) -> None:
        d = self.deployment()
        planned, facts = self._engine.get(INSTANCE, ({}, {}))
        state = "stopped" if d is None else "ready" if d.word == "serving" else d.word
        self.launch.show_instance_engine(planned, facts, state)

    def _on_refused(self, path: str, why: str) -> None:
        if path != self.file:
            return
        self.pending = False
        self.launch.set_router_state(None)
        self.launch.refuse(f"Not started behind the router: {why}")

    def _on_fleet_changed(self) -> None:
        """The Launch tab follows it: the state line, Stop, Try live… (on while it serves, no
        trial is under way and the form differs from the running launch), and Monitor, Logs
        and Playground pointed at its instance once it serves."""
        fleet = self.fleet
        if self.phase() is not None:
            self.pending = False
        d = self.deployment()
        if d is None:
            self.launch.set_live_target(
                None, "check Behind the router and Start: Try live… changes its knobs"
            )
        else:
            launch = fleet.running_launch(INSTANCE)
            self._follow_launch(launch)
            running = launch if not d.try_live else None
            self.launch.set_live_target(running, d.try_live)
        rows = fleet.rows if self.phase() is not None else None
        row = rows.row(INSTANCE) if rows is not None and INSTANCE in rows else None
        if rows is None:
            self._chosen = False
        elif not self._chosen and row is not None and row.state != "stopped":
            # Monitor, Logs, Playground follow its instance once it has begun to start: its
            # start at once, its samples once it serves
            self._chosen = True
            fleet.choose(INSTANCE, show=False)
        shown = (d.word, d.url, d.instance, d.why) if d is not None else (None, "", "", "")
        if shown == self._shown:
            return
        was = self._shown[0] if self._shown else None
        self._shown = shown
        self.launch.set_router_state(*shown)
        if shown[0] is None:
            self._engine.clear()
        self._show_engine()
        if was is not None and shown[0] is None and fleet.message.text():
            self.launch.message.setText(f"The fleet of one stopped: {fleet.message.text()}")
        self.changed.emit()
