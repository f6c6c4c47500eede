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
    QScrollArea,
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
# the widest each column opens (pixels; the value column: this wide): longer text is elided
# there and read whole in the help below the table (a choice list or a JSON default ran to
# 3,000-7,000 px); the last column takes the rest, the table scrolls sideways past that
COLUMN_WIDTHS = (240, 200, 200, 160)
DIALOG_SIZE = (1100, 700)  # at most: the window it opens over, and the screen, may be smaller


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
        self.options = ea.list_options(engine, managed_options())
        self._values: dict[str, Any] = dict(extra)
        self._shown = len(self.options)  # the options the search shows
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
        self.table.setWordWrap(False)  # one line a row, elided (…): the help has it whole
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
                    cell.text()  # a choice list, a default: whole (the column elides it)
                    if col in (2, 3) and len(cell.text()) > 40
                    else opt.help
                    if not opt.managed
                    else f"Quantdeck sets it: {opt.managed}"
                )
                self.table.setItem(row, col, cell)
        self._size_columns()
        self.help = QLabel()  # the selected option's help, in full (not only in a tooltip)
        self.help.setWordWrap(True)
        self.help.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.help.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        help_scroll = QScrollArea()  # a long help scrolls; it never widens the dialog
        help_scroll.setWidgetResizable(True)
        help_scroll.setWidget(self.help)
        self.error = error_label()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(help_scroll)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        intro = plain_label(
            f"Every option of {engine.label}'s `vllm serve`, from its own parser. Type a "
            "value to set one (true/false for a switch; empty: not passed); the curated "
            "knobs on the Launch form stay where they are."
        )
        intro.setWordWrap(True)  # one line of it made the dialog 1,500 px wide
        lay.addWidget(intro)
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
        self.table.itemChanged.connect(self._on_value_changed)
        self._filter("")
        self._fit(parent)

    def _size_columns(self) -> None:
        """Each column as wide as its contents up to :data:`COLUMN_WIDTHS` (the operator may
        widen it), the value column that wide to type in, the last one taking the rest."""
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.table.resizeColumnsToContents()
        for col, most in enumerate(COLUMN_WIDTHS):
            width = most if col == 1 else min(self.table.columnWidth(col), most)
            self.table.setColumnWidth(col, width)

    def _fit(self, parent: QWidget | None) -> None:
        """No wider or taller than the screen, opened no larger than the window it is over."""
        width, height = DIALOG_SIZE
        screen = (parent.screen() if parent is not None else self.screen()).availableGeometry()
        self.setMaximumSize(screen.width(), screen.height())
        width, height = min(width, screen.width()), min(height, screen.height())
        if parent is not None:
            window = parent.window()
            width, height = min(width, window.width()), min(height, window.height())
        self.resize(width, height)

    def _filter(self, text: str) -> None:
        shown = {o.name for o in ea.list_options(self.engine, managed_options(), text or None)}
        for row, opt in enumerate(self.options):
            self.table.setRowHidden(row, opt.name not in shown)
        self._shown = len(shown)
        self._show_count()

    def _on_value_changed(self, item: QTableWidgetItem) -> None:
        if item.column() == 1:
            self._show_count()

    def _show_count(self) -> None:
        """How many options the search shows, how many have a value typed (every edit)."""
        n_set = len(self.typed_names())
        self.count.setText(f"{self._shown} of {len(self.options)} options shown · {n_set} set here")

    def _show_help(self, row: int, *_: Any) -> None:
        if 0 <= row < len(self.options):
            opt = self.options[row]
            managed = f"\n\nQuantdeck sets it: {opt.managed}" if opt.managed else ""
            facts = [self.table.item(row, col) for col in (2, 3)]  # kind, default: whole here
            kind, default = (item.text() if item is not None else "" for item in facts)
            self.help.setText(
                f"{', '.join(opt.flags)} [{opt.group}] · {kind} · default: {default or '-'}\n"
                f"{opt.help}{managed}"
            )

    def typed_names(self) -> list[str]:
        """The options with a value typed in the table (not yet parsed or checked)."""
        out = []
        for row, opt in enumerate(self.options):
            item = self.table.item(row, 1)
            if item is not None and item.text().strip():
                out.append(opt.name)
        return out

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
