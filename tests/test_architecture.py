"""The shape rules of the design card, checked on every run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts() -> None:
    """import-linter (pyproject.toml): core never imports Qt; nothing imports torch/vllm except
    the subprocess entry points named there."""
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 2 kept, 0 broken" in r.stdout


def test_gui_process_imports_no_torch_or_vllm() -> None:
    """Importing every core and gui module leaves torch, vllm and transformers unloaded."""
    code = (
        "import importlib, pkgutil, sys, json\n"
        "import core, gui\n"
        "for pkg in (core, gui):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if m.name.rsplit('.', 1)[-1] in ('demo_train',) or '_entry' in m.name:\n"
        "            continue\n"
        "        importlib.import_module(m.name)\n"
        "print(json.dumps(sorted(n for n in ('torch', 'vllm', 'transformers') "
        "if n in sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
