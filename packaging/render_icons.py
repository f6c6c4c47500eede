"""Render Quantdeck's icon (assets/icons/hicolor/scalable/apps/quantdeck.svg) to the PNG sizes
of the hicolor theme, with Qt's own SVG renderer:

    .venv/bin/python packaging/render_icons.py [--check]

writes assets/icons/hicolor/<N>x<N>/apps/quantdeck.png for N in SIZES. ``--check`` writes
nothing and exits 1 when a committed PNG differs from a fresh rendering (more than
``TOLERANCE`` per channel, anywhere): the PNGs are renderings of the SVG, never edited apart.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parents[1]
HICOLOR = ROOT / "assets" / "icons" / "hicolor"
SVG = HICOLOR / "scalable" / "apps" / "quantdeck.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
TOLERANCE = 2  # 8-bit levels: rounding of one Qt build against another


def png_path(size: int) -> Path:
    return HICOLOR / f"{size}x{size}" / "apps" / "quantdeck.png"


def render(size: int, svg: Path = SVG) -> QImage:
    """The SVG drawn on a transparent ``size`` x ``size`` image, antialiased."""
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: not a valid SVG")
    image = QImage(size, size, QImage.Format_ARGB32_Premultiplied)
    image.fill(Qt.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.Antialiasing)
    painter.setRenderHint(QPainter.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return image.convertToFormat(QImage.Format_ARGB32)


def png_bytes(image: QImage) -> bytes:
    buf = QBuffer()
    buf.open(QIODevice.WriteOnly)
    image.save(buf, "PNG", 0)  # 0: the strongest compression (PNG is lossless either way)
    return bytes(buf.data().data())


def max_difference(a: QImage, b: QImage) -> int:
    """The largest per-channel difference between two images of one size (256: sizes differ)."""
    if a.size() != b.size():
        return 256
    a, b = a.convertToFormat(QImage.Format_ARGB32), b.convertToFormat(QImage.Format_ARGB32)
    da, db = bytes(a.constBits()), bytes(b.constBits())
    return max((abs(x - y) for x, y in zip(da, db, strict=True)), default=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    ns = p.parse_args(argv)
    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    stale = []
    for size in SIZES:
        image, path = render(size), png_path(size)
        if ns.check:
            committed = QImage(str(path))
            if committed.isNull() or max_difference(image, committed) > TOLERANCE:
                stale.append(str(path.relative_to(ROOT)))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png_bytes(image))
        print(f"{path.relative_to(ROOT)}: {size}x{size}, {path.stat().st_size} bytes")
    if stale:
        print("differ from the SVG (run packaging/render_icons.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
