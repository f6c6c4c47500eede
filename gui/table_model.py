"""Item models over core objects: one row per object, columns declared once, by name.

A view asks :class:`ObjectTableModel` for cells; code and tests read a cell by its column's
name (``model.text(row, "state")``), never by a column number. Rows change on the GUI thread
only: the panels call :meth:`ObjectTableModel.row_changed` from their slots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSize,
    Qt,
)
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHeaderView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
    QTableView,
)

T = TypeVar("T")
Index = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class Column(Generic[T]):
    """One column: its name (the header), the text of a row's cell, optionally its tooltip and
    a value for delegates (``Qt.ItemDataRole.UserRole``, e.g. the percent a progress bar draws)."""

    name: str
    text: Callable[[T], str]
    tooltip: Callable[[T], str] | None = None
    value: Callable[[T], Any] | None = None
    align_right: bool = False
    color: Callable[[T], str | None] | None = None  # the text's colour (None: the default)


class ObjectTableModel(QAbstractTableModel, Generic[T]):
    """A table of objects of one kind; ``columns`` say what each column shows of a row."""

    def __init__(self, columns: Sequence[Column[T]], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._columns: list[Column[T]] = list(columns)
        self._rows: list[T] = []

    # -- Qt's side ---------------------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._columns)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row, col = self._rows[index.row()], self._columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return col.text(row)
        if role == Qt.ItemDataRole.ToolTipRole and col.tooltip is not None:
            return col.tooltip(row)
        if role == Qt.ItemDataRole.UserRole and col.value is not None:
            return col.value(row)
        if role == Qt.ItemDataRole.TextAlignmentRole and col.align_right:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole and col.color is not None:
            color = col.color(row)
            return QColor(color) if color else None
        return None

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self._columns[section].name
        return None

    # -- reading -----------------------------------------------------------------------------
    @property
    def rows(self) -> tuple[T, ...]:
        return tuple(self._rows)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self._columns]

    def column(self, name: str) -> int:
        """The number of the column called ``name`` (for views: widths, delegates)."""
        return self.column_names.index(name)

    def row(self, i: int) -> T:
        return self._rows[i]

    def find(self, match: Callable[[T], bool]) -> int:
        """The first row ``match`` accepts, or -1."""
        return next((i for i, r in enumerate(self._rows) if match(r)), -1)

    def text(self, row: int, column: str) -> str:
        """The cell as the view shows it."""
        return self._columns[self.column(column)].text(self._rows[row])

    def value(self, row: int, column: str) -> Any:
        """The cell's value for delegates (None where its column has none)."""
        col = self._columns[self.column(column)]
        return None if col.value is None else col.value(self._rows[row])

    # -- writing (GUI thread) ----------------------------------------------------------------
    def append(self, obj: T) -> int:
        n = len(self._rows)
        self.beginInsertRows(QModelIndex(), n, n)
        self._rows.append(obj)
        self.endInsertRows()
        return n

    def set_rows(self, rows: Iterable[T], columns: Sequence[Column[T]] | None = None) -> None:
        """Show ``rows`` (and, if given, these columns instead)."""
        self.beginResetModel()
        self._rows = list(rows)
        if columns is not None:
            self._columns = list(columns)
        self.endResetModel()

    def row_changed(self, i: int) -> None:
        """Row ``i``'s object changed: the views redraw it."""
        self.dataChanged.emit(self.index(i, 0), self.index(i, len(self._columns) - 1))


class ProgressDelegate(QStyledItemDelegate):
    """Draws a cell's ``Qt.ItemDataRole.UserRole`` value (0-100) as a progress bar."""

    def sizeHint(self, option: QStyleOptionViewItem, index: Index) -> QSize:
        hint = super().sizeHint(option, index)
        return QSize(max(hint.width(), 90), hint.height())

    def paint(self, painter: Any, option: QStyleOptionViewItem, index: Index) -> None:
        value = index.data(Qt.ItemDataRole.UserRole)
        if value is None:
            super().paint(painter, option, index)
            return
        bar = QStyleOptionProgressBar()
        bar.rect = option.rect.adjusted(2, 2, -2, -2)
        bar.minimum, bar.maximum = 0, 100
        bar.progress = int(value)
        bar.text = f"{value:.0f}%"
        bar.textVisible = True
        bar.state = option.state | QStyle.StateFlag.State_Horizontal  # Qt 6: vertical without it
        style = option.widget.style() if option.widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)


def row_table(model: ObjectTableModel[Any], progress_column: str | None = None) -> QTableView:
    """The panel's table of rows: one row selected at a time, columns sized to their contents,
    the last one stretched, ``progress_column`` drawn as bars."""
    table = QTableView()
    table.setModel(model)
    if progress_column is not None:
        table.setItemDelegateForColumn(model.column(progress_column), ProgressDelegate(table))
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setWordWrap(False)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    return table
