"""The fleet file as a form (Edit fleet…): the router's port and policy, a row per instance;
Save writes the file and reads it back as a fleet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.gui.labels import error_label, plain_label

if TYPE_CHECKING:
    from quantdeck.core.fleet import FleetSpec
    from quantdeck.core.fleet.document import InstanceForm

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
