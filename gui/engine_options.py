"""The Launch tab's "All engine options" page: every option of the chosen engine's ``vllm
serve``, read from that engine's own parser (its kind, default, choices, group and help), with
a search; the values set here ride along as ``LaunchConfig.extra_args`` (the CLI's
``--vllm-arg NAME=VALUE``, a profile's ``vllm-args:``), checked against that engine before
they are taken. The options Quantdeck sets itself are shown greyed, with the knob to use."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import engine_args as ea
from quantdeck.core.launch.knobs import managed_options
from quantdeck.gui.labels import error_label, plain_label
from quantdeck.gui.style import QUIET_TEXT

COLUMNS = ("option", "value", "kind", "default", "group")


def shown_value(value: Any) -> str:
    """A value as the operator types it back (``--vllm-arg``'s text)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value)
    return "" if value is None else str(value)


class EngineOptionsDialog(QDialog):
    """Every option of ``engine`` (a :class:`Capabilities`), the ones in ``extra`` filled in.
    :meth:`values` is what OK took: checked against the engine (kinds, choices, Quantdeck's
    own flags), in their kinds' types."""

    def __init__(self, engine: Any, extra: dict[str, Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.engine = engine
        self.setWindowTitle(f"All engine options — {engine.label}")
        self.resize(1100, 700)
        self.options = ea.list_options(engine, managed_options())
        self._values: dict[str, Any] = dict(extra)
        self.search = QLineEdit()
        self.search.setPlaceholderText("search flags and help (every word)…")
        self.search.setClearButtonEnabled(True)
        self.count = plain_label()
        self.count.setStyleSheet(f"color:{QUIET_TEXT}")
        self.table = QTableWidget(len(self.options), len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.AnyKeyPressed
        )
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        quiet = QColor(QUIET_TEXT)
        for row, opt in enumerate(self.options):
            name = QTableWidgetItem(", ".join(opt.flags))
            value = QTableWidgetItem(shown_value(extra.get(opt.name)))
            cells = [
                name,
                value,
                QTableWidgetItem(
                    opt.kind + (f" ({', '.join(map(str, opt.choices))})" if opt.choices else "")
                ),
                QTableWidgetItem(shown_value(opt.default)),
                QTableWidgetItem(opt.group),
            ]
            for col, cell in enumerate(cells):
                if col != 1 or opt.managed:
                    cell.setFlags(cell.flags() & ~Qt.ItemFlag.ItemIsEditable)
                if opt.managed:
                    cell.setForeground(quiet)
                cell.setToolTip(
                    opt.help if not opt.managed else f"Quantdeck sets it: {opt.managed}"
                )
                self.table.setItem(row, col, cell)
        self.help = QLabel()  # the selected option's help, in full (not only in a tooltip)
        self.help.setWordWrap(True)
        self.help.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.help.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.error = error_label()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.help)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.addWidget(
            plain_label(
                f"Every option of {engine.label}'s `vllm serve`, from its own parser. Type a "
                "value to set one (true/false for a switch; empty: not passed); the curated "
                "knobs on the Launch form stay where they are."
            )
        )
        lay.addWidget(self.search)
        lay.addWidget(self.count)
        lay.addWidget(split, 1)
        lay.addWidget(self.error)
        lay.addWidget(buttons)
        known = {o.name for o in self.options}
        lost = [n for n in extra if n not in known]
        if lost:  # set for another engine (a profile from another version)
            self.error.setText(
                f"{engine.label} has no "
                + ", ".join(f"--{n}" for n in lost)
                + ": not kept when you press OK"
            )
        self.search.textChanged.connect(self._filter)
        self.table.currentCellChanged.connect(self._show_help)
        self._filter("")

    def _filter(self, text: str) -> None:
        shown = {o.name for o in ea.list_options(self.engine, managed_options(), text or None)}
        for row, opt in enumerate(self.options):
            self.table.setRowHidden(row, opt.name not in shown)
        n_set = len(self._typed())
        self.count.setText(f"{len(shown)} of {len(self.options)} options shown · {n_set} set here")

    def _show_help(self, row: int, *_: Any) -> None:
        if 0 <= row < len(self.options):
            opt = self.options[row]
            managed = f"\n\nQuantdeck sets it: {opt.managed}" if opt.managed else ""
            self.help.setText(f"{', '.join(opt.flags)} [{opt.group}]\n{opt.help}{managed}")

    def _typed(self) -> dict[str, Any]:
        """The values typed in the table, parsed as ``--vllm-arg NAME=VALUE`` parses them."""
        out: dict[str, Any] = {}
        for row, opt in enumerate(self.options):
            item = self.table.item(row, 1)
            text = item.text().strip() if item is not None else ""
            if text:
                out[opt.name] = ea.parse_cli_arg(f"{opt.name}={text}")[1]
        return out

    def set_value(self, name: str, text: str) -> None:
        """Type ``text`` into option ``name``'s value cell (as an operator would)."""
        row = next(i for i, o in enumerate(self.options) if o.name == name)
        item = self.table.item(row, 1)
        assert item is not None
        item.setText(text)

    def values(self) -> dict[str, Any]:
        return dict(self._values)

    def accept(self) -> None:
        try:
            self._values = ea.check_against(self._typed(), self.engine, managed_options())
        except ConfigError as e:
            self.error.setText(str(e))
            return
        super().accept()
