"""The model library: the folders of models on the window's left, what the inspector read of
each, and Add folder… (cut out of the main window, issue 44)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QListView, QPushButton, QVBoxLayout, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.models import AdapterInfo, ModelInfo, inspect_model, read_adapter
from quantdeck.core.models.adapters import is_adapter_dir
from quantdeck.gui.labels import plain_label
from quantdeck.gui.table_model import Column, ObjectTableModel


@dataclass(frozen=True)
class ModelFolder:
    """A model folder of the library and what the inspector says of it (None: unreadable);
    a LoRA adapter folder has ``adapter`` instead, shown with its base model."""

    path: str
    info: ModelInfo | None
    adapter: AdapterInfo | None = None
    error: str | None = None  # why the inspector could not read it (info None)

    @property
    def title(self) -> str:
        name = Path(self.path).name
        if self.adapter:
            base = Path(self.adapter.base_model or "?").name
            return f"{name}   [{self.adapter.badge} on {base}]"
        return f"{name}   [{self.info.badge}]" if self.info else f"{name}   (unreadable)"


LIBRARY_COLUMNS: tuple[Column[ModelFolder], ...] = (
    Column("model", lambda m: m.title, tooltip=lambda m: m.path),
)


def describe(selected: ModelFolder) -> str:
    """The line under the list for the chosen folder: the model's facts, the adapter's, or
    why it cannot be launched (where the operator looks, not a tooltip)."""
    if selected.adapter is not None:  # served on top of its base: nothing to launch alone
        a = selected.adapter
        return (
            f"LoRA adapter · rank {a.rank} · alpha {a.alpha:g} · "
            f"{', '.join(a.target_modules)} · base {a.base_model or 'not named'} · "
            "load it into a server started with LoRA (quantdeck lora load)"
        )
    info = selected.info
    if info is None:
        why = selected.error or "the inspector could not read it"
        return f"{Path(selected.path).name} cannot be launched: {why}"
    q = info.quantization
    return (
        f"{info.architecture} · {info.num_parameters / 1e6:,.1f} M params · "
        f"{info.weights_bytes / 2**20:,.1f} MiB · {info.num_layers} layers · "
        f"kv heads {info.num_kv_heads}" + (f" · {q.method} {q.scheme}" if q else "")
    )


class LibraryPanel(QWidget):
    """The list of model folders. ``model_chosen(path, info)`` when the operator picks one
    that can be launched (an adapter or an unreadable folder is described, not chosen);
    ``folder_added(folder)`` when Add folder… adds one (the window remembers it)."""

    model_chosen = Signal(str, object)  # path, ModelInfo
    folder_added = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model: ObjectTableModel[ModelFolder] = ObjectTableModel(LIBRARY_COLUMNS, self)
        self.view = QListView()  # shows the model's first column
        self.view.setObjectName("library")
        self.view.setModel(self.model)
        self.info = plain_label()
        self.info.setWordWrap(True)
        self.info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.add_folder_button = QPushButton("Add folder…")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("<b>Models</b>"))
        lay.addWidget(self.view, 1)
        lay.addWidget(self.info)
        lay.addWidget(self.add_folder_button)
        self.view.selectionModel().currentChanged.connect(self._on_current_changed)
        self.add_folder_button.clicked.connect(self._on_add_folder_clicked)

    def add_model(self, path: Path, select: bool = False, info: ModelInfo | None = None) -> None:
        """Add a model folder (``info``: already inspected, e.g. by a scan)."""
        i = self.model.find(lambda m: m.path == str(path))
        if i < 0:
            adapter, error = None, None
            if info is None:
                try:
                    if is_adapter_dir(path):
                        adapter = read_adapter(path)
                    else:
                        info = inspect_model(path)
                except QuantdeckError as e:
                    error = str(e)
                    self.info.setText(error)
            i = self.model.append(ModelFolder(str(path), info, adapter, error))
        if select:
            self.view.setCurrentIndex(self.model.index(i, 0))

    def selected(self) -> ModelFolder | None:
        """The current model folder, if any."""
        index = self.view.currentIndex()
        return self.model.row(index.row()) if index.isValid() else None

    def scan(self, folder: Path) -> None:
        """Add the models found in ``folder`` (none found: said, not added in silence)."""
        from quantdeck.core.models import scan_folders

        try:
            found = scan_folders([folder])
        except QuantdeckError as e:
            self.info.setText(str(e))
            return
        for entry in found:
            self.add_model(Path(entry.path), info=entry.info)  # an adapter is read by add_model
        if not found:
            self.info.setText(
                f"No model found in {folder}: a model is a folder with a config.json (or a "
                "LoRA adapter's adapter_config.json), there or up to three folders down"
            )

    def _on_add_folder_clicked(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        d = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if d:
            self.folder_added.emit(d)

    def _on_current_changed(self, *_: Any) -> None:
        selected = self.selected()
        if selected is None:
            return
        self.info.setText(describe(selected))
        if selected.adapter is None:
            self.model_chosen.emit(selected.path, selected.info)
