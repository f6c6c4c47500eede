"""The Fleet tab: several vLLM instances behind vLLM's router, as ``quantdeck fleet up`` runs
them, in a table with a row for the router; start and stop the fleet or one instance, edit the
fleet file in a form, and point Monitor, Logs and Playground at an instance.

The fleet's blocking lifecycle (check, start, route, keep, stop) runs in a worker
(:meth:`WorkerSet.follow`); its events come from its own threads through a Qt signal, which
Qt queues onto the GUI thread; each instance's metrics come as its ``metrics`` events (the
fleet scrapes them once a second) and are kept in one store per instance, which the Monitor
overlays on the instance it follows. A recording of ``quantdeck fleet up --record`` replays
here as if live, its rows and news (the live Monitor's plots untouched). The core
objects (:mod:`quantdeck.core.fleet`, httpx, psutil) are imported on first use: the window
shows before they load.

"Try live…" starts a live trial of the selected instance (:mod:`.trials`, in a worker): a form
of the candidate's knobs, prefilled with the instance's launch, with the diff against it; the
trial then shows in a :class:`~quantdeck.gui.trial_view.TrialView` below the table, and its
candidate as a row of its own while it runs. What the tab shows is read by :mod:`.files`, the
instance the other tabs follow is :mod:`.chosen`'s, the fleet's news :mod:`.news`'s.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    Event,
    InstanceEvent,
    MetricsEvent,
    StateEvent,
)
from quantdeck.gui.fleet.chosen import ChosenInstance
from quantdeck.gui.fleet.columns import FLEET_COLUMNS
from quantdeck.gui.fleet.files import FleetFiles
from quantdeck.gui.fleet.news import FleetNews
from quantdeck.gui.fleet.trials import TrialControl
from quantdeck.gui.labels import counted, plain_label
from quantdeck.gui.server_control import SERVER_NICE
from quantdeck.gui.style import ORANGE, RED
from quantdeck.gui.table_model import ObjectTableModel, row_table

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet, FleetSpec
    from quantdeck.core.fleet.health import FleetHealth
    from quantdeck.core.fleet.live import LiveTrial
    from quantdeck.core.fleet.rows import FleetRow, FleetRows
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.core.models import ModelInfo
    from quantdeck.core.monitor import Recording, TimeSeriesStore
    from quantdeck.gui.fleet.try_live import TryLiveDialog
    from quantdeck.gui.trial_view import TrialView
    from quantdeck.gui.workers import CallWorker, WorkerSet

STORE_POINTS = 3600  # each instance's metrics kept: an hour at the fleet's one sample a second
TRIAL_CANDIDATE = "candidate"  # a trial's candidate row's role (core.fleet.rows says so too)


class FleetView(QWidget):
    """The fleet file's instances and router in a table; the fleet's lifecycle in a worker."""

    # url, API key ("" for none), whether to show the Monitor: attach Monitor/Playground (again
    # when the chosen instance's URL changes: a promotion moves it to the candidate's port)
    instance_chosen = Signal(str, str, bool)
    instance_event = Signal(Event)  # the chosen instance's own events (its log, its states)
    # {name: TimeSeriesStore}: a fleet's instances to overlay (a fleet's, never a replay's)
    instances_changed = Signal(object)
    fleet_event = Signal(Event)  # the fleet's events, from its threads, on the UI thread
    phase_changed = Signal(str)  # no fleet, stopped, starting, serving, stopping, replay
    changed = Signal()  # the phase, rows, selection or a trial may have changed
    serve_refused = Signal(str, str)  # path, why: a file given to serve_file did not start

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path: str | None = None
        self.spec: FleetSpec | None = None
        self.infos: dict[str, ModelInfo | None] = {}
        self.rows: FleetRows | None = None
        self.fleet: Fleet | None = None
        self.job: CallWorker | None = None
        self.phase = "no fleet"  # stopped, starting, serving, stopping
        self._phase_shown = self.phase  # the last phase_changed said
        self._unwatch: Any = None
        self.series: dict[str, TimeSeriesStore] = {}  # each instance's metrics
        self.replayed: str | None = None  # the recording shown, if one is
        self._workers: WorkerSet | None = None
        self.model: ObjectTableModel[FleetRow] = ObjectTableModel(FLEET_COLUMNS, self)
        self.table = row_table(self.model, "KV %")
        self.start_button = QPushButton("Start fleet")
        self.stop_button = QPushButton("Stop fleet")
        self.path_label = plain_label("no fleet file: open one, or write one with Edit fleet…")
        self.phase_label = plain_label()
        self.inst_start = QPushButton("Start")
        self.inst_stop = QPushButton("Stop")
        self.inst_restart = QPushButton("Restart")
        self.open_monitor = QPushButton("Open in Monitor")
        self.open_monitor.setToolTip("Point Monitor, Logs and Playground at the selected instance")
        self.message = plain_label()
        self.message.setWordWrap(True)
        self.files = FleetFiles(
            lambda: self.workers,
            self.message.setText,
            lambda: self.path,
            lambda: self.job is not None,
            self,
        )
        self.open_button = self.files.open_button
        self.replay_button, self.edit_button = self.files.replay_button, self.files.edit_button
        self.splitter = QSplitter(Qt.Orientation.Vertical)  # the table; a trial's view below
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.table)
        self.trials = TrialControl(
            self.splitter,
            lambda: self.fleet,
            self.selected,
            lambda: self.workers,
            self.message.setText,
            self,
        )
        self.try_button, self.undo_button = self.trials.try_button, self.trials.undo_button
        self.events = FleetNews()
        self.chosen_instance = ChosenInstance(  # (a replay's rows are of no fleet that runs)
            lambda: self.rows,
            lambda: self.fleet if self.replayed is None else None,
            self.message.setText,
            self,
        )
        top = QHBoxLayout()
        for w in (
            self.open_button,
            self.replay_button,
            self.edit_button,
            self.start_button,
            self.stop_button,
        ):
            top.addWidget(w)
        top.addWidget(self.phase_label)
        top.addStretch(1)
        per = QHBoxLayout()
        per.addWidget(plain_label("Selected instance:"))
        for b in (
            self.inst_start,
            self.inst_stop,
            self.inst_restart,
            self.open_monitor,
            self.try_button,
            self.undo_button,
        ):
            per.addWidget(b)
        per.addStretch(1)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.path_label)
        lay.addWidget(self.splitter, 4)
        lay.addLayout(per)
        lay.addWidget(self.message)
        lay.addWidget(self.events, 1)
        self.fleet_event.connect(self._on_fleet_event)
        self.chosen_instance.attach.connect(self.instance_chosen)
        self.chosen_instance.instance_event.connect(self.instance_event)
        self.files.fleet_read.connect(self._on_loaded)
        self.files.serve_read.connect(self._on_serve_read)
        self.files.serve_refused.connect(self.serve_refused)
        self.files.recording_read.connect(self.show_recording)
        self.files.done.connect(self._update_buttons)
        self.start_button.clicked.connect(self.start_fleet)
        self.stop_button.clicked.connect(self.stop_fleet)
        self.inst_start.clicked.connect(lambda: self._act("start_instance"))
        self.inst_stop.clicked.connect(lambda: self._act("stop_instance"))
        self.inst_restart.clicked.connect(lambda: self._act("restart_instance"))
        self.open_monitor.clicked.connect(self.choose_selected)
        self.trials.changed.connect(self._update_buttons)
        self.table.selectionModel().selectionChanged.connect(self._update_buttons)
        self._update_buttons()

    @property
    def workers(self) -> WorkerSet:
        if self._workers is None:  # superqt is imported on first use
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(self.message.setText)
        return self._workers

    # -- the files (FleetFiles) --------------------------------------------------------------
    def load(self, path: str) -> None:
        """Read a fleet file (in a worker) and show its instances, stopped."""
        self.files.load(path)

    def serve_file(self, path: str) -> None:
        """Read a fleet file (in a worker) and start its fleet once read, as Open fleet file…
        then Start fleet do (the Launch tab's fleet of one, behind the router). A file that
        cannot be read or a fleet that runs already: ``serve_refused(path, why)``."""
        self.files.serve(path)

    def _on_serve_read(self, path: str) -> None:
        if self.path != path or self.job is not None:
            self.serve_refused.emit(path, f"the Fleet tab runs {self.path}: stop it first")
            return
        self.start_fleet()

    def _on_loaded(self, path: str, spec: FleetSpec, infos: dict[str, ModelInfo | None]) -> None:
        from quantdeck.core.fleet.rows import FleetRows

        if self.job is not None:  # read while a fleet ran: shown when it has stopped
            return
        self.path, self.spec, self.infos = path, spec, infos
        self._show(FleetRows(spec, infos))
        self.path_label.setText(
            f"{path} · {counted(len(spec.instances), 'instance')} · router {spec.router.url} "
            f"({spec.router.policy})"
        )
        self.phase = "stopped"
        self._update_buttons()

    def replay(self, path: str) -> None:
        """Read a recording of ``fleet up --record`` (in a worker) and show it: the rows as
        they ended, the fleet's news with their times (the live Monitor's plots untouched:
        Open recording… in the Monitor replays it with its plots, in a window of its own)."""
        self.files.replay(path)

    def show_recording(self, path: str, rec: Recording) -> None:
        from quantdeck.core.fleet.rows import recorded_rows

        try:
            rows = recorded_rows(rec)
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        self.fleet, self.spec, self.path = None, None, None
        self._show(rows, replayed=path)
        for ev in rec.events:
            self._on_fleet_event(ev)
        self.phase = "replay"
        self.path_label.setText(
            f"replay: {Path(path).name} · {counted(len(rows.rows) - 1, 'instance')} · "
            f"{rec.duration_s:.0f} s recorded"
        )
        self._update_buttons()

    # -- the fleet ---------------------------------------------------------------------------
    def watch(self, fleet: Fleet) -> None:
        """Show ``fleet``'s events in the table: they come from its threads, through a Qt
        signal queued onto the GUI thread."""
        from quantdeck.core.fleet.rows import FleetRows

        if self._unwatch is not None:
            self._unwatch()
        self.fleet, self.spec = fleet, fleet.spec
        self.chosen_instance.forget()  # another fleet: Monitor follows what is chosen in it
        self._show(FleetRows(fleet.spec, self.infos))
        self._unwatch = fleet.subscribe(self.fleet_event.emit)

    def _show(self, rows: FleetRows, replayed: str | None = None) -> None:
        """These rows in the table, with an empty metrics store per instance (overlaid by
        the Monitor on the instance it follows; a replay's are the Fleet tab's alone)."""
        from quantdeck.core.monitor import TimeSeriesStore

        self.rows, self.replayed = rows, replayed
        self.model.set_rows(rows.rows)
        self.series = {r.name: TimeSeriesStore(STORE_POINTS) for r in rows.rows[1:]}
        self.events.clear()
        if replayed is None:
            self.instances_changed.emit(self.series)

    def start_fleet(self) -> None:
        """Check the fleet, start its instances and then the router (in a worker), as
        ``quantdeck fleet up`` does; scrape the instances' metrics meanwhile."""
        from quantdeck.core.fleet import Fleet

        if self.spec is None or self.job is not None:
            return
        fleet = Fleet(self.spec, nice=SERVER_NICE)  # as the Launch tab's server: the UI first
        self.watch(fleet)
        stop = threading.Event()
        self.message.setText("")
        self.job = self.workers.follow(
            lambda: fleet.serve(stop),
            cancel=stop.set,
            returned=self._on_fleet_returned,
            finished=self._on_fleet_finished,
        )
        self.phase = "starting"
        self._update_buttons()

    def stop_fleet(self) -> None:
        """The router, then every instance (the worker ends once all have stopped)."""
        if self.job is not None:
            self.phase = "stopping"
            self.job.quit()
            self._update_buttons()

    def _on_fleet_returned(self, stopped: bool) -> None:
        if not stopped:
            self.message.setText(
                "the fleet stopped: an instance or the router failed (its row says which; "
                "select it and press Open in Monitor for its log)"
            )

    def _on_fleet_finished(self) -> None:
        self.job = None
        self.phase = "stopped"
        for n, row in enumerate(self.rows.rows if self.rows else []):
            if not row.local:
                row.state = "remote"
                row.clear_metrics()
                self.model.row_changed(n)
        self._update_buttons()

    def _on_fleet_event(self, event: Event) -> None:
        if (
            self.rows is None
            or not isinstance(event, InstanceEvent)
            or event.instance not in self.rows
        ):
            return
        before = len(self.rows.rows)
        changed = self.rows.apply(event)
        if len(self.rows.rows) != before:  # a trial's candidate row came or went
            chosen = self.selected()
            self.model.set_rows(self.rows.rows)
            if chosen is not None and chosen.name in self.rows:
                self.select(chosen.name)
        else:
            for i in changed:
                self.model.row_changed(i)
        ev, name = event.event, event.instance
        self.chosen_instance.follow_url()
        if isinstance(ev, MetricsEvent):
            store = self.series.get(name)
            if store is not None:
                store.append(ev)
            if not self.replayed:
                self._update_buttons()  # a remote instance answers, or no longer
            return
        if self.replayed:
            self.events.add(event, recorded=True)
            return
        if self.rows.row(name).is_router and isinstance(ev, StateEvent):
            if ev.state == "ready":
                self.phase = "serving"
            elif ev.state in ("stopping", "stopped") or (
                ev.state == "crashed" and self.phase != "serving"
            ):  # (a crash while it serves is restarted: the fleet's health says it is down)
                self.phase = "stopping" if self.job is not None else "stopped"
        alarm = self.events.add(event)  # what an operator must not miss
        if alarm is not None:
            self.message.setText(alarm)
        self.chosen_instance.on_event(name, ev)
        self._update_buttons()

    def _act(self, action: str) -> None:
        """Start, stop or restart the selected instance (blocking calls: in a worker)."""
        row = self.selected()
        if row is not None:
            self.act_on(row.name, action)

    def act_on(self, name: str, action: str) -> None:
        """``start_instance``, ``stop_instance`` or ``restart_instance`` of instance ``name``
        (in a worker); the Launch tab's Restart of its fleet of one's instance comes here."""
        if self.fleet is not None:
            self.workers.start(getattr(self.fleet, action), name, finished=self._update_buttons)

    # -- choosing an instance ----------------------------------------------------------------
    def selected(self) -> FleetRow | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.row(rows[0].row()) if rows else None

    def select(self, name: str) -> None:
        self.table.selectRow(self.model.find(lambda r: r.name == name))

    def choose_selected(self) -> None:
        """Point Monitor, Logs and Playground at the selected instance (:meth:`choose`)."""
        row = self.selected()
        if row is not None:
            self.choose(row.name)

    def choose(self, name: str, show: bool = True) -> None:
        """Point Monitor, Logs and Playground at instance ``name`` (:class:`ChosenInstance`);
        ``show``: the window shows the Monitor."""
        self.chosen_instance.choose(name, show)

    @property
    def chosen(self) -> str | None:
        """The instance Monitor, Logs and Playground follow."""
        return self.chosen_instance.name

    @property
    def health(self) -> FleetHealth:
        """What the fleet serves, derived from its rows (core/fleet/health.py): the word every
        view says (serving, degraded, down, or the phase)."""
        from quantdeck.core.fleet.health import FleetHealth, fleet_health

        if self.rows is None or self.phase != "serving":
            return FleetHealth(self.phase)
        return fleet_health(self.phase, self.rows.rows)

    def _update_buttons(self, *_: Any) -> None:
        idle = self.job is None
        self.open_button.setEnabled(idle)
        self.start_button.setEnabled(idle and self.spec is not None)
        self.stop_button.setEnabled(not idle and self.phase != "stopping")
        health = self.health
        self.phase_label.setText(f"fleet: {health.line()}")
        color = {"down": RED, "degraded": ORANGE}.get(health.word)
        self.phase_label.setStyleSheet(f"color: {color}" if color else "")
        if self.phase != self._phase_shown:
            self._phase_shown = self.phase
            self.phase_changed.emit(self.phase)
        row = self.selected()
        acts = (
            self.fleet is not None
            and self.phase == "serving"
            and row is not None
            and row.local
            and not row.is_router
            and row.role != TRIAL_CANDIDATE  # the trial's: its view's buttons act on it
        )
        self.inst_start.setEnabled(acts and row is not None and row.down)
        self.inst_stop.setEnabled(
            acts and row is not None and not row.down and row.state != "stopping"
        )
        self.inst_restart.setEnabled(
            acts and row is not None and row.state in ("ready", "degraded", "crashed", "hung")
        )
        self.open_monitor.setEnabled(
            row is not None
            and not row.is_router
            and (row.serving or (row.local and self.fleet is not None))
        )
        self.trials.update_buttons(row, acts)
        self.changed.emit()

    # -- live trials (TrialControl) -----------------------------------------------------------
    @property
    def trial(self) -> LiveTrial | None:
        """The trial shown (under way or ended)."""
        return self.trials.trial

    @property
    def trial_view(self) -> TrialView | None:
        """The trial shown, in its view below the table."""
        return self.trials.view

    @property
    def trial_dialog(self) -> TryLiveDialog | None:
        """The last candidate's form Try live… opened."""
        return self.trials.dialog

    @property
    def trial_busy(self) -> bool:
        """A trial is being started or is under way (one at a time)."""
        return self.trials.busy

    def running_launch(self, name: str) -> LaunchConfig | None:
        """Local instance ``name``'s launch as it runs now (a promotion's candidate's after
        one); None: no fleet runs, or no such local instance."""
        return self.trials.running_launch(name)

    def try_live(self, candidate: LaunchConfig | None = None) -> None:
        """The candidate's form for the selected instance (prefilled with ``candidate``'s
        knobs where given, else with the instance's launch); its OK starts the trial."""
        self.trials.try_live(candidate)

    def show_trial(self, trial: LiveTrial) -> None:
        """Show ``trial`` in a Trial view below the table (in place of the last one)."""
        self.trials.show(trial)

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop the fleet and wait for every worker (the window is closing)."""
        self.trials.close()
        if self._workers is not None:
            self._workers.quit()
            self._workers.wait(timeout)
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
