"""``packaging/build-app.sh`` refuses, before building anything, an OUTDIR whose ``quantdeck``
folder or bundle tarball it did not make (the build itself: tests/packaging/test_bundle.py)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from conftest import ROOT

BUILD = ROOT / "packaging" / "build-app.sh"


def build(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BUILD), str(out)], capture_output=True, text=True, timeout=60
    )


def test_a_foreign_quantdeck_folder_is_refused_and_left(tmp_path: Path) -> None:
    theirs = tmp_path / "quantdeck"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    r = build(tmp_path)
    assert r.returncode == 2 and "was not made by this script" in r.stderr, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["quantdeck"]
    assert (theirs / "notes.txt").read_text() == "mine"


def test_a_foreign_tarball_of_the_bundles_name_is_refused_and_left(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x.txt").write_text("x")
    tarball = tmp_path / "quantdeck-0.1.0-linux-x86_64.tar.gz"
    with tarfile.open(tarball, "w:gz") as t:
        t.add(src / "x.txt", arcname="x.txt")
    before = tarball.read_bytes()
    r = build(tmp_path)
    assert r.returncode == 2 and tarball.name in r.stderr, r.stderr
    assert tarball.read_bytes() == before and not (tmp_path / ".build").exists()
