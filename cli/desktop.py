"""``desktop-install`` / ``desktop-uninstall``: Quantdeck in the desktop's launcher."""

from __future__ import annotations

import argparse

from quantdeck.cli._common import AddCommand, print_json
from quantdeck.core.desktop import DesktopChange, install, uninstall


def _print(change: DesktopChange, as_json: bool) -> None:
    if as_json:
        print_json(change.to_json())
        return
    for path in change.written:
        print(f"wrote   {path}")
    for path in change.removed:
        print(f"removed {path}")
    for kept in change.kept:
        print(f"kept    {kept['path']} ({kept['reason']})")
    if change.action == "install":
        print("Exec:", " ".join(change.command))
    elif not change.removed and not change.kept:
        print(f"nothing of Quantdeck's to remove under {change.data_home}")
    for tool in change.refreshed:
        print(f"ran     {tool}")


def cmd_desktop_install(ns: argparse.Namespace) -> int:
    _print(install(force=ns.force), ns.json)
    return 0


def cmd_desktop_uninstall(ns: argparse.Namespace) -> int:
    _print(uninstall(), ns.json)
    return 0


def register(add: AddCommand) -> None:
    p = add(
        "desktop-install",
        cmd_desktop_install,
        "add Quantdeck to the desktop's launcher: its entry and icons under $XDG_DATA_HOME "
        "(~/.local/share), starting this quantdeck",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an entry or icon of that name that Quantdeck did not write",
    )
    p.add_argument("--json", action="store_true", help="what was written, as one JSON object")
    p = add(
        "desktop-uninstall",
        cmd_desktop_uninstall,
        "remove the launcher entry and icons desktop-install wrote (a file changed since stays)",
    )
    p.add_argument("--json", action="store_true", help="what was removed, as one JSON object")
