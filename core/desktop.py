"""Desktop integration: Quantdeck's launcher entry and icons in the user's data folder.

:func:`install` writes ``applications/quantdeck.desktop`` (its ``Exec`` the running quantdeck
executable, by absolute path, quoted as the Desktop Entry Specification says) and the hicolor
icons (``icons/hicolor/<N>x<N>/apps/quantdeck.png``, ``scalable/apps/quantdeck.svg``) under
``$XDG_DATA_HOME`` (``~/.local/share`` by default), each written atomically. A manifest,
``quantdeck/desktop-install.json`` there, records the SHA-256 of every file written and the
folders made. :func:`uninstall` removes only those files, and only while they still hold what
Quantdeck wrote: a file the user changed since, or one Quantdeck never wrote, stays.

Desktop caches are refreshed where a cache already exists and its tool is installed
(``update-desktop-database``, ``gtk-update-icon-cache``); without either, nothing is said: the
desktops read the folders themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.paths import ASSETS, move_file, write_atomic
from quantdeck.core.schema import load_json

APP_ID = "quantdeck"  # the entry's file name, the icon's name and the GUI's desktopFileName
ENTRY_TEMPLATE = ASSETS / "quantdeck.desktop"
ICONS = ASSETS / "icons" / "hicolor"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
MANIFEST = Path("quantdeck") / "desktop-install.json"  # relative to the data home

# Characters that make an Exec argument need double quotes (Desktop Entry Specification,
# "The Exec key"); inside the quotes, these four take a backslash.
_EXEC_RESERVED = frozenset(" \t\n\"'\\><~|&;$*?#()`")
_EXEC_ESCAPED = frozenset('"`$\\')


def data_home() -> Path:
    """``$XDG_DATA_HOME``, or ``~/.local/share`` when it is unset, empty or relative (the XDG
    Base Directory Specification ignores a relative one)."""
    value = os.environ.get("XDG_DATA_HOME", "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / ".local" / "share"


def quantdeck_command() -> list[str]:
    """The command that starts this Quantdeck, by absolute path: a bundled executable, the
    ``quantdeck`` script this process runs as, the script beside this interpreter, or else
    ``python -m quantdeck.cli``. Links are kept (a pipx link survives upgrades)."""
    if getattr(sys, "frozen", False):  # a PyInstaller bundle: the executable is the app
        return [os.path.abspath(sys.executable)]
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == APP_ID and _is_executable(argv0):
        return [os.path.abspath(argv0)]
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), APP_ID)
    if _is_executable(beside):
        return [beside]
    return [os.path.abspath(sys.executable), "-m", "quantdeck.cli"]


def _is_executable(path: str) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def _check_writable(arg: str) -> None:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
        raise ConfigError(f"{arg!r}: a control character cannot go in a desktop entry's Exec")


def exec_quote(arg: str) -> str:
    """One argument of an ``Exec`` value: ``%`` doubled; in double quotes, with ``"`` ``\\``
    ``$`` and backquote escaped, when it holds a reserved character. (The value as a whole
    still takes the string escape of :func:`exec_line`.)"""
    _check_writable(arg)
    arg = arg.replace("%", "%%")
    if not any(c in _EXEC_RESERVED for c in arg):
        return arg
    return '"' + "".join("\\" + c if c in _EXEC_ESCAPED else c for c in arg) + '"'


def exec_line(argv: list[str]) -> str:
    """The ``Exec`` value that runs ``argv``: quoted arguments, then the string escape of
    every value (a backslash doubled), which the specification applies before unquoting."""
    if not argv or not os.path.isabs(argv[0]):
        raise ConfigError("the desktop entry needs the program's absolute path")
    if "=" in argv[0]:  # the specification forbids it in the program's name or path
        raise ConfigError(f"{argv[0]}: a program path with '=' cannot go in a desktop entry")
    return " ".join(exec_quote(a) for a in argv).replace("\\", "\\\\")


def _string_value(text: str) -> str:
    _check_writable(text)
    text = text.replace("\\", "\\\\")
    return "\\s" + text[1:] if text.startswith(" ") else text


def desktop_entry(argv: list[str]) -> str:
    """The shipped entry (``assets/quantdeck.desktop``) with ``Exec`` running ``argv`` and
    ``TryExec`` its program (a launcher hides the entry once that is gone)."""
    out = []
    for line in ENTRY_TEMPLATE.read_text(encoding="utf-8").splitlines():
        if line.startswith("Exec="):
            line = "Exec=" + exec_line(argv)
        elif line.startswith("TryExec="):
            line = "TryExec=" + _string_value(argv[0])
        out.append(line)
    return "\n".join(out) + "\n"


def planned_files(argv: list[str], home: Path) -> dict[Path, bytes]:
    """Every file :func:`install` writes under ``home``, with its content."""
    files = {home / "applications" / f"{APP_ID}.desktop": desktop_entry(argv).encode()}
    svg = ICONS / "scalable" / "apps" / f"{APP_ID}.svg"
    files[home / "icons" / "hicolor" / "scalable" / "apps" / svg.name] = svg.read_bytes()
    for size in ICON_SIZES:
        rel = Path(f"{size}x{size}") / "apps" / f"{APP_ID}.png"
        files[home / "icons" / "hicolor" / rel] = (ICONS / rel).read_bytes()
    return files


@dataclass(frozen=True)
class DesktopChange:
    """What :func:`install` or :func:`uninstall` did. ``kept``: files left in place, each with
    why (``{"path", "reason"}``); ``refreshed``: the cache tools run."""

    action: str  # "install" | "uninstall"
    data_home: str
    written: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    kept: tuple[dict[str, str], ...] = ()
    refreshed: tuple[str, ...] = ()
    command: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "data_home": self.data_home,
            "command": list(self.command),
            "written": list(self.written),
            "removed": list(self.removed),
            "kept": [dict(k) for k in self.kept],
            "refreshed": list(self.refreshed),
        }


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str | None:
    """The hash of a regular file's content; None for no file, a link or anything else."""
    if path.is_symlink() or not path.is_file():
        return None
    return _sha256(path.read_bytes())


def _read_manifest(home: Path) -> dict[str, Any]:
    try:
        data = load_json((home / MANIFEST).read_bytes(), str(home / MANIFEST))
    except (OSError, ConfigError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_bytes(path: Path, data: bytes) -> None:
    """``path`` replaced by ``data`` in one rename (a fsynced temporary sibling, mode 0644)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        move_file(Path(tmp), path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install(
    home: Path | None = None, command: list[str] | None = None, *, force: bool = False
) -> DesktopChange:
    """Write the entry and the icons under ``home`` (default :func:`data_home`). A file there
    that Quantdeck did not write (absent from the manifest, or changed since) and that differs
    from what it would write is refused before anything is written, unless ``force``."""
    home = (home or data_home()).absolute()
    argv = command or quantdeck_command()
    files = planned_files(argv, home)
    previous = _read_manifest(home)
    ours: dict[str, str] = previous.get("files", {}) if isinstance(previous, dict) else {}
    foreign = []
    for path, data in files.items():
        if path.is_symlink() or (path.exists() and not path.is_file()):
            foreign.append(path)  # never replaced, even with force: it may point anywhere
            continue
        have = _file_sha256(path)
        if have is None or have == _sha256(data) or ours.get(str(path)) == have:
            continue
        if not force:
            foreign.append(path)
    if foreign:
        raise ConfigError(
            f"{foreign[0]}: exists and was not written by Quantdeck"
            + (f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else "")
            + "; move it away"
            + ("" if any(p.is_symlink() or p.is_dir() for p in foreign) else " or pass --force")
        )
    made: list[str] = list(previous.get("dirs", [])) if isinstance(previous, dict) else []
    for path in [*files, home / MANIFEST]:
        missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
        for folder in reversed(missing):  # outermost first
            folder.mkdir()
            made.append(str(folder))
    for path, data in files.items():
        _write_bytes(path, data)
    manifest = {
        "command": argv,
        "files": {str(p): _sha256(d) for p, d in files.items()},
        "dirs": sorted(set(made), key=lambda d: (-d.count(os.sep), d)),  # deepest first
    }
    write_atomic(home / MANIFEST, json.dumps(manifest, indent=1), private=False)
    return DesktopChange(
        "install",
        str(home),
        written=tuple(str(p) for p in files),
        refreshed=tuple(refresh_caches(home)),
        command=tuple(argv),
    )


def uninstall(home: Path | None = None) -> DesktopChange:
    """Remove what :func:`install` wrote under ``home`` and still holds what it wrote; the
    folders it made, when empty. Without a manifest (removed by hand), a file counts as
    Quantdeck's when it holds exactly what this version would write."""
    home = (home or data_home()).absolute()
    manifest = _read_manifest(home)
    recorded = manifest.get("files")
    if isinstance(recorded, dict):
        expected = {Path(p): str(h) for p, h in recorded.items()}
    else:
        argv = manifest.get("command") or quantdeck_command()
        expected = {p: _sha256(d) for p, d in planned_files(list(argv), home).items()}
    removed, kept = [], []
    for path, digest in expected.items():
        if not path.is_relative_to(home):  # a manifest edited by hand: nothing outside home
            continue
        if not path.exists() and not path.is_symlink():
            continue
        if _file_sha256(path) != digest:
            kept.append({"path": str(path), "reason": "changed since Quantdeck wrote it"})
            continue
        path.unlink()
        removed.append(str(path))
    with contextlib.suppress(FileNotFoundError):
        (home / MANIFEST).unlink()
    for folder in manifest.get("dirs", []) if isinstance(manifest.get("dirs"), list) else []:
        if Path(folder).is_relative_to(home):
            with contextlib.suppress(OSError):  # not empty (the user's files): it stays
                Path(folder).rmdir()
    return DesktopChange(
        "uninstall",
        str(home),
        removed=tuple(removed),
        kept=tuple(kept),
        refreshed=tuple(refresh_caches(home)),
    )


def refresh_caches(home: Path) -> list[str]:
    """Bring the desktop caches under ``home`` up to date, where one exists already and its
    tool is installed; returns the tools run. A cache is never created: without one, the
    desktops read the folders themselves."""
    done = []
    apps, hicolor = home / "applications", home / "icons" / "hicolor"
    jobs = (
        ("update-desktop-database", apps / "mimeinfo.cache", ["-q", str(apps)]),
        ("gtk-update-icon-cache", hicolor / "icon-theme.cache", ["-q", "-f", "-t", str(hicolor)]),
    )
    for tool, cache, args in jobs:
        exe = shutil.which(tool)
        if exe is None or not cache.is_file():
            continue
        try:
            r = subprocess.run([exe, *args], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            done.append(tool)
    return done
