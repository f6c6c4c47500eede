"""The shape rules of the design card, checked on every run."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import source_copy

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts() -> None:
    """import-linter (pyproject.toml): the layers cli > gui > core jobs > shared core; core.convert
    never imports core.runtime; core never imports Qt or the front end; only the worker
    subprocesses import torch/vLLM; inside the GUI, layers from start-up down to gui.style (no
    import circle), the Monitor's, the Benchmark tab's and the Fleet tab's own, and gui.style
    importing nothing. Every contract of pyproject.toml is checked, none skipped."""
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    n = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert f"Contracts: {n} kept, 0 broken" in r.stdout


def _loaded_after(code: str) -> list[str]:
    probe = (
        code + "\nimport sys, json\n"
        "print(json.dumps(sorted(n for n in ('torch', 'vllm', 'transformers', 'PySide6', "
        "'pyqtgraph', 'superqt') if n in sys.modules)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_core_loads_no_qt_torch_or_vllm() -> None:
    """``import quantdeck.core`` and every package face of it stay plain Python."""
    faces = ["launch", "models", "engines", "runtime", "monitor", "bench", "convert", "workers"]
    code = "import quantdeck.core\n" + "".join(f"import quantdeck.core.{f}\n" for f in faces)
    assert _loaded_after(code) == []


@pytest.mark.parametrize("module", ["quantdeck.core.runtime.server", "quantdeck.core.convert"])
def test_serving_and_converting_leave_the_doctor_unloaded(module: str) -> None:
    """Starting a server or a conversion takes its engine from core.engines, below them both:
    the doctor (every check of the machine, ``quantdeck doctor``'s) stays unloaded."""
    code = f"import {module}, sys; print('quantdeck.core.doctor' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_gui_process_imports_no_torch_or_vllm() -> None:
    """Importing every module of the GUI process (core, gui, cli; the workers apart from their
    protocol) leaves torch, vllm and transformers unloaded."""
    code = (
        "import importlib, pkgutil\n"
        "import quantdeck.core, quantdeck.gui, quantdeck.cli\n"
        "for pkg in (quantdeck.core, quantdeck.gui, quantdeck.cli):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if m.name.startswith('quantdeck.core.workers.') and "
        "not m.name.endswith('.protocol') or m.name.endswith('__main__'):\n"
        "            continue\n"
        "        importlib.import_module(m.name)\n"
    )
    loaded = _loaded_after(code)
    assert [n for n in loaded if n in ("torch", "vllm", "transformers")] == []
    assert "PySide6" in loaded  # the walk did reach the GUI


def test_wheel_has_one_top_level_name(tmp_path: Path) -> None:
    """``pip wheel .``: everything lives under ``quantdeck/`` (core, gui, cli, assets)."""
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources
    src = source_copy(tmp_path / "src")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("quantdeck-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"quantdeck"}
    # every module of the source folders is in the wheel (the package list is written by hand)
    for folder in ("core", "gui", "cli"):
        for py in (ROOT / folder).rglob("*.py"):
            assert f"quantdeck/{py.relative_to(ROOT).as_posix()}" in names, py
    for must in (
        "quantdeck/core/runtime/server.py",
        "quantdeck/gui/app.py",
        "quantdeck/cli/main.py",
        "quantdeck/assets/corpus/train.txt",
        "quantdeck/core/py.typed",
    ):
        assert must in names
