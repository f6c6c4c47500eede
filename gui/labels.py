"""Labels that show what users and models wrote: always plain text.

A QLabel guesses rich text from its content, so a model path, a run title or an error that
quotes a file could render as HTML (a link, an image, a forged message). These never guess."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from quantdeck.gui.style import FORM_ERROR


def plain_label(text: str = "", parent: QWidget | None = None) -> QLabel:
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


def error_label() -> QLabel:
    """A form's error line: plain text, wrapped, in the form-error colour (a refusal is read
    where it happened, not in a tooltip)."""
    label = plain_label()
    label.setWordWrap(True)
    label.setStyleSheet(f"color: {FORM_ERROR}")
    return label


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 instance``, ``2 instances`` (``plural`` where adding an s is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
