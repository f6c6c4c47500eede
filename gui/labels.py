"""Labels that show what users and models wrote: always plain text.

A QLabel guesses rich text from its content, so a model path, a run title or an error that
quotes a file could render as HTML (a link, an image, a forged message). These never guess."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget


def plain_label(text: str = "", parent: QWidget | None = None) -> QLabel:
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label
