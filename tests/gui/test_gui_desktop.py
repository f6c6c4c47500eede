"""The panel's own icon: every PNG size of assets/icons, as the launcher entry names it."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSize

from quantdeck.core.desktop import ICON_SIZES
from quantdeck.gui.app import app_icon


def test_app_icon_has_every_size(qtbot: Any) -> None:
    icon = app_icon()
    assert sorted(s.width() for s in icon.availableSizes()) == sorted(ICON_SIZES)
    for size in (16, 48, 512):
        image = icon.pixmap(QSize(size, size)).toImage()
        assert (image.width(), image.height()) == (size, size)
        assert image.pixelColor(size // 2, size // 2).alpha() == 255  # drawn, not blank
        assert image.pixelColor(0, 0).alpha() < 64  # the rounded corner is transparent
