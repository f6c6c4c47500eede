"""The desktop panel and what draws with it: the window, screenshots, replay."""

from __future__ import annotations

import argparse

from quantdeck.cli._common import AddCommand


def cmd_gui(ns: argparse.Namespace) -> int:
    from quantdeck.gui import app  # Qt loads only for the commands that draw

    return int(app.main([]) or 0)


def cmd_screenshots(ns: argparse.Namespace) -> int:
    from quantdeck.gui import screenshots

    return int(screenshots.main([ns.outdir], size=ns.size) or 0)


def cmd_replay(ns: argparse.Namespace) -> int:
    from quantdeck.core.monitor import read_recording

    read_recording(ns.file)  # one-line errors before Qt starts
    from quantdeck.gui.monitor import replay

    return int(replay.main(ns.file, ns.png, ns.size, ns.title))


def _size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT``, each 1 to 10000 pixels (a larger PNG is no screenshot)."""
    w, _, h = text.partition("x")
    try:
        size = int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not WIDTHxHEIGHT") from None
    if not all(1 <= n <= 10_000 for n in size):
        raise argparse.ArgumentTypeError(f"'{text}': width and height must be 1 to 10000")
    return size


def register(add: AddCommand) -> None:
    sp = add("gui", cmd_gui, "open the desktop panel")

    sp = add(
        "screenshots",
        cmd_screenshots,
        "drive every tab against a demo server and save one PNG per tab",
    )
    sp.add_argument("outdir")
    sp.add_argument(
        "--size", default="1400x900", type=_size, help="WIDTHxHEIGHT of the window (default's)"
    )

    sp = add("replay", cmd_replay, "show a recording in the Monitor (or save it as a PNG)")
    sp.add_argument("file", help="a recording (.jsonl or .jsonl.gz)")
    sp.add_argument("--png", metavar="OUT", help="render off screen, save, exit")
    sp.add_argument("--size", default="1400x900", type=_size, help="WIDTHxHEIGHT of the PNG")
    sp.add_argument("--title", help="heading above the plots (default: the model)")
