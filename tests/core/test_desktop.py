"""Desktop integration: the shipped entry and icons, install and uninstall under a temporary
``$XDG_DATA_HOME`` (core/desktop.py, ``quantdeck desktop-install``/``desktop-uninstall``)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, snapshot

from quantdeck.core import desktop
from quantdeck.core.errors import ConfigError

# installed, or unpacked from Debian's package by packaging/bootstrap.sh test
_UNPACKED = ROOT / ".cache" / "tools" / "root" / "usr" / "bin" / "desktop-file-validate"
VALIDATE = shutil.which("desktop-file-validate") or (
    str(_UNPACKED) if _UNPACKED.is_file() else None
)
needs_validator = pytest.mark.skipif(VALIDATE is None, reason="desktop-file-utils not installed")
ICONS = ROOT / "assets" / "icons" / "hicolor"


def validate(path: Path) -> str:
    """desktop-file-validate's complaints about ``path`` (errors and warnings; hints apart)."""
    assert VALIDATE is not None
    r = subprocess.run([VALIDATE, str(path)], capture_output=True, text=True)
    out = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines() if ": hint:" not in ln)
    assert r.returncode == 0 or out, "desktop-file-validate failed without saying why"
    return out if r.returncode or out else ""


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature, every chunk's CRC, an IHDR
    first, an IEND last and IDAT data that inflates to the rows the header announces."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append(kind)
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND"
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert (depth, color) == (8, 6)  # 8-bit RGBA: the icon has a transparent outside
    assert len(zlib.decompress(idat)) == height * (1 + 4 * width)
    return width, height


def split_exec(value: str) -> list[str]:
    """An Exec value read as the Desktop Entry Specification says: the string escapes first,
    then the quoting, then ``%%``."""
    text, i = "", 0
    while i < len(value):  # string escapes: \s \n \t \r \\
        if value[i] == "\\" and i + 1 < len(value):
            text += {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[value[i + 1]]
            i += 2
        else:
            text += value[i]
            i += 1
    args: list[str] = []
    cur: str | None = None
    quoted, i = False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\" and text[i + 1] in '"`$\\':
            cur, i = (cur or "") + text[i + 1], i + 2
            continue
        if c == '"':
            quoted, cur = not quoted, cur or ""
        elif c == " " and not quoted:
            if cur is not None:
                args.append(cur)
            cur = None
        else:
            assert quoted or c not in desktop._EXEC_RESERVED, f"unquoted {c!r} in {value}"
            cur = (cur or "") + c
        i += 1
    assert not quoted
    if cur is not None:
        args.append(cur)
    return [a.replace("%%", "%") for a in args]


def entry_keys(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return dict(ln.split("=", 1) for ln in lines if "=" in ln)


# -- what ships ------------------------------------------------------------------------------


@needs_validator
def test_shipped_entry_validates() -> None:
    assert validate(ROOT / "assets" / "quantdeck.desktop") == ""


def test_icons_are_pngs_of_their_sizes() -> None:
    for size in desktop.ICON_SIZES:
        assert png_size((ICONS / f"{size}x{size}" / "apps" / "quantdeck.png").read_bytes()) == (
            size,
            size,
        )
    svg = ET.parse(ICONS / "scalable" / "apps" / "quantdeck.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert svg.get("viewBox") == "0 0 512 512"  # square: the hicolor theme's icons are


def test_pngs_are_renderings_of_the_svg() -> None:
    """packaging/render_icons.py --check: each committed PNG is what Qt draws from the SVG."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "render_icons.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert r.returncode == 0, r.stdout + r.stderr


# -- Exec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/bin/quantdeck"],
        ["/home/a b/.local/bin/quantdeck"],
        ["/opt/q$d \"x\" 'y'/back\\slash/50%/quantdeck"],
        ["/venv (3.12)/bin/python", "-m", "quantdeck.cli"],
    ],
)
def test_exec_line_reads_back_as_the_command(argv: list[str]) -> None:
    assert split_exec(desktop.exec_line(argv)) == argv


def test_exec_line_refuses_what_an_entry_cannot_hold() -> None:
    for argv in (["quantdeck"], ["/a=b/quantdeck"], ["/a\nb/quantdeck"]):
        with pytest.raises(ConfigError):
            desktop.exec_line(argv)


def test_the_running_script_is_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "bin" / "quantdeck"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["bin/quantdeck", "desktop-install"])
    assert desktop.quantdeck_command() == [str(script)]
    monkeypatch.setattr(sys, "argv", ["/nowhere/quantdeck"])  # not there: the one beside python
    beside = Path(sys.executable).absolute().parent / "quantdeck"
    assert desktop.quantdeck_command() == (
        [str(beside)]
        if beside.is_file()
        else [str(Path(sys.executable).absolute()), "-m", "quantdeck.cli"]
    )


# -- install / uninstall ---------------------------------------------------------------------

ODD = ["/opt/my apps/q$d/quantdeck"]  # a space and a dollar: both need the Exec quoting


def expected_files(home: Path) -> set[str]:
    icons = {f"icons/hicolor/{s}x{s}/apps/quantdeck.png" for s in desktop.ICON_SIZES}
    return {
        "applications/quantdeck.desktop",
        "icons/hicolor/scalable/apps/quantdeck.svg",
        "quantdeck/desktop-install.json",
        *icons,
    }


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_install_writes_exactly_the_expected_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "data home"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    change = desktop.install(command=ODD)
    assert files_under(home) == expected_files(home)
    assert set(change.written) == {str(home / f) for f in expected_files(home)} - {
        str(home / "quantdeck/desktop-install.json")
    }
    for size in desktop.ICON_SIZES:
        rel = f"icons/hicolor/{size}x{size}/apps/quantdeck.png"
        assert (home / rel).read_bytes() == (ROOT / "assets" / rel).read_bytes()
    entry = home / "applications" / "quantdeck.desktop"
    keys = entry_keys(entry)
    assert split_exec(keys["Exec"]) == ODD
    assert keys["TryExec"] == ODD[0] and keys["Icon"] == "quantdeck"
    assert oct(entry.stat().st_mode & 0o777) == "0o644"
    if VALIDATE:
        assert validate(entry) == ""


def test_uninstall_removes_only_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "share"
    (home / "applications").mkdir(parents=True)
    (home / "applications" / "other.desktop").write_text("[Desktop Entry]\nName=Other\n")
    before = snapshot(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    desktop.install(command=ODD)
    # the user edits the 48 px icon; another app puts its icon beside Quantdeck's 64 px one
    changed = home / "icons/hicolor/48x48/apps/quantdeck.png"
    changed.write_bytes(changed.read_bytes() + b"edited")
    foreign = home / "icons/hicolor/64x64/apps/other.png"
    foreign.write_bytes(b"not ours")
    change = desktop.uninstall()
    assert [k["path"] for k in change.kept] == [str(changed)]
    assert len(change.removed) == len(desktop.ICON_SIZES) + 1  # the icons left, the svg, entry
    assert files_under(home) == {
        "applications/other.desktop",
        "icons/hicolor/48x48/apps/quantdeck.png",
        "icons/hicolor/64x64/apps/other.png",
    }
    changed.unlink()
    foreign.unlink()
    assert desktop.uninstall().removed == ()  # nothing left of its own: nothing to do
    # the folders it made went when empty: the tree is as it was
    for folder in ("48x48/apps", "48x48", "64x64/apps", "64x64"):
        (home / "icons/hicolor" / folder).rmdir()
    (home / "icons/hicolor").rmdir()
    (home / "icons").rmdir()
    assert snapshot(tmp_path) == before


def test_install_then_uninstall_leaves_the_tree_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "share" / "icons" / "hicolor").mkdir(parents=True)
    before = snapshot(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    desktop.install(command=ODD)
    desktop.install(command=["/usr/bin/quantdeck"])  # again, another executable: replaced
    assert split_exec(entry_keys(tmp_path / "share/applications/quantdeck.desktop")["Exec"]) == [
        "/usr/bin/quantdeck"
    ]
    desktop.uninstall()
    assert snapshot(tmp_path) == before


def test_install_refuses_a_file_it_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "share"
    mine = home / "applications" / "quantdeck.desktop"
    mine.parent.mkdir(parents=True)
    mine.write_text("[Desktop Entry]\nName=My own Quantdeck\n")
    before = snapshot(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    with pytest.raises(ConfigError, match="not written by Quantdeck"):
        desktop.install(command=ODD)
    assert snapshot(tmp_path) == before  # refused before anything was written
    desktop.install(command=ODD, force=True)
    assert split_exec(entry_keys(mine)["Exec"]) == ODD


def test_an_existing_icon_cache_is_refreshed_none_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "a"))
    assert desktop.install(command=ODD).refreshed == ()
    assert not (tmp_path / "a/icons/hicolor/icon-theme.cache").exists()
    if shutil.which("gtk-update-icon-cache") is None:
        pytest.skip("gtk-update-icon-cache not installed")
    cache = tmp_path / "b/icons/hicolor/icon-theme.cache"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(b"")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "b"))
    assert "gtk-update-icon-cache" in desktop.install(command=ODD).refreshed
    assert b"quantdeck" in cache.read_bytes()  # the cache now lists the icon


def test_cli_installs_the_running_quantdeck(tmp_path: Path) -> None:
    """``quantdeck desktop-install --json`` in a subprocess: Exec is this venv's quantdeck."""
    exe = Path(sys.executable).parent / "quantdeck"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    r = subprocess.run(
        [str(exe), "desktop-install", "--json"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["command"] == [str(exe)]
    assert split_exec(entry_keys(tmp_path / "applications/quantdeck.desktop")["Exec"]) == [str(exe)]
    r = subprocess.run([str(exe), "desktop-uninstall"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert files_under(tmp_path) == set()
