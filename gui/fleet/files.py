"""The files the Fleet tab shows: a fleet file (Open fleet file…, Edit fleet…, or one given to
serve at once) and a recording of ``quantdeck fleet up --record`` (Open recording…). Each is
read in a worker; what was read goes to the tab through a signal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QDialog, QFileDialog, QPushButton, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.gui.fleet.edit_dialog import FleetEditDialog

if TYPE_CHECKING:
    from quantdeck.core.fleet import FleetSpec
    from quantdeck.core.models import ModelInfo
    from quantdeck.gui.workers import WorkerSet


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


class FleetFiles(QObject):
    """The Fleet tab's three file buttons and the reading behind them, in ``workers()``; the
    tab's messages go to ``say``. ``path()`` is the fleet file the tab shows (None: none),
    ``running()`` whether its fleet runs. A fleet file read: ``fleet_read(path, spec, infos)``
    (then ``serve_read(path)`` where it was given to :meth:`serve`), a recording read:
    ``recording_read(path, rec)``; ``done`` when a read has ended, read or not."""

    fleet_read = Signal(str, object, object)  # path, FleetSpec, {instance: ModelInfo | None}
    serve_read = Signal(str)  # a file given to serve was read (and shown through fleet_read)
    serve_refused = Signal(str, str)  # path, why: a file given to serve could not be read
    recording_read = Signal(str, object)  # path, Recording
    done = Signal()

    def __init__(
        self,
        workers: Callable[[], WorkerSet],
        say: Callable[[str], None],
        path: Callable[[], str | None],
        running: Callable[[], bool],
        parent: QWidget,
    ) -> None:
        super().__init__(parent)
        self._workers, self._say, self._path, self._running = workers, say, path, running
        self._parent = parent
        self.open_button = QPushButton("Open fleet file…")
        self.replay_button = QPushButton("Open recording…")
        self.replay_button.setToolTip("Replay a recording of `quantdeck fleet up --record FILE`")
        self.edit_button = QPushButton("Edit fleet…")
        self.open_button.clicked.connect(self._on_open_clicked)
        self.replay_button.clicked.connect(self._on_replay_clicked)
        self.edit_button.clicked.connect(self.edit)

    # -- fleet files -------------------------------------------------------------------------
    def _on_open_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self._parent, "Open a fleet file", "", "Fleet files (*.yaml *.yml);;All files (*)"
        )
        if path:
            self.load(path)

    def load(self, path: str) -> None:
        """Read a fleet file (in a worker): ``fleet_read``."""
        self._say("")
        self._workers().start(
            read_fleet,
            path,
            returned=lambda r: self.fleet_read.emit(path, *r),
            finished=lambda: self.done.emit(),
        )

    def serve(self, path: str) -> None:
        """Read a fleet file (in a worker) to serve it: ``fleet_read`` then ``serve_read``; a
        file that cannot be read: ``serve_refused(path, why)``."""

        def read() -> tuple[FleetSpec, dict[str, ModelInfo | None]] | str:
            try:
                return read_fleet(path)
            except (QuantdeckError, OSError) as e:
                return str(e)

        def returned(result: tuple[FleetSpec, dict[str, ModelInfo | None]] | str) -> None:
            if isinstance(result, str):
                self._say(result)
                self.serve_refused.emit(path, result)
                return
            self.fleet_read.emit(path, *result)
            self.serve_read.emit(path)

        self._say("")
        self._workers().start(read, returned=returned, finished=lambda: self.done.emit())

    def edit(self) -> None:
        """The fleet file in a form; saved, it is read again (unless a fleet runs)."""
        from quantdeck.core.fleet.document import read_document

        path = self._path()  # None: a new file, named when it is saved
        try:
            doc = read_document(path) if path is not None and Path(path).exists() else {}
        except QuantdeckError as e:
            self._say(str(e))
            return
        dialog = FleetEditDialog(path, doc, self._parent)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.path is not None:
            path = dialog.path
            if not self._running():
                self.load(path)
            else:
                self._say(f"{path} saved: the running fleet keeps its settings")

    # -- recordings --------------------------------------------------------------------------
    def _on_replay_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self._parent,
            "Open a fleet recording",
            "",
            "Recordings (*.jsonl *.jsonl.gz);;All files (*)",
        )
        if path:
            self.replay(path)

    def replay(self, path: str) -> None:
        """Read a recording of ``fleet up --record`` (in a worker): ``recording_read``; not
        while a fleet runs."""
        from quantdeck.core.monitor import read_recording

        if self._running():
            self._say("stop the fleet first: a recording replaces what is shown")
            return
        self._say("")
        self._workers().start(
            read_recording,
            path,
            returned=lambda rec: self.recording_read.emit(path, rec),
            finished=lambda: self.done.emit(),
        )
