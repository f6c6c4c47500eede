"""``quantdeck``: the headless command line over the same core as the GUI.

With no command it opens the desktop panel. Errors a user can cause print one line on stderr
and exit with code 2. Each command group lives in its own module with a ``register(add)`` that
declares its subcommands; their heavy imports happen inside the commands, so ``--help`` and the
light commands start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from quantdeck.cli import (
    bench,
    convert,
    desktop,
    doctor,
    engines,
    fleet,
    gui,
    launch,
    lora,
    models,
    runtime,
    timeline,
    trace,
)
from quantdeck.cli._common import OneLineParser, stop_signals_raise
from quantdeck.core.errors import QuantdeckError

GROUPS = (
    gui,
    models,
    launch,
    runtime,
    convert,
    bench,
    lora,
    fleet,
    trace,
    desktop,
    timeline,
    doctor,
    engines,
)


def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("quantdeck")
    except md.PackageNotFoundError:  # a source tree that is not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="quantdeck",
        description="Serve, quantize, benchmark and "
        "tune LLMs with vLLM. With no command: the desktop panel.",
    )
    p.add_argument("--version", action="version", version=f"quantdeck {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=fn)
        return sp

    for group in GROUPS:
        group.register(add)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        ns.func = gui.cmd_gui
    try:
        with stop_signals_raise():  # SIGTERM and SIGHUP end a command as Ctrl-C does
            return int(ns.func(ns))
    except QuantdeckError as e:
        print(f"quantdeck: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # Ctrl-C, or Stopped (128 + the stop signal's number)
        return int(getattr(e, "exit_code", 130))
    except BrokenPipeError:
        return 0
    except OSError as e:  # a file or folder the user named: unreadable, unwritable, full disk
        where = f"{e.filename}: " if e.filename else ""
        print(f"quantdeck: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
