"""Interpreters that are no engine, for the tests of ``doctor``, ``engines`` and ``serve
--engine``: a venv without vLLM, and one whose vLLM is installed but fails on import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def make_bare_venv(root: Path) -> Path:
    """``python -m venv --without-pip ROOT``: a Python with no vLLM; its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    return root / "bin" / "python"


def make_broken_vllm(base: Path, root: Path) -> Path:
    """A venv (made by the interpreter ``base``) whose vLLM is installed, its metadata saying
    9.9.0, but raises ImportError('libcudart.so.12: not found') on import; its interpreter."""
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python*/site-packages")
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("raise ImportError('libcudart.so.12: not found')\n")
    dist = site / "vllm-9.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.0\n")
    return root / "bin" / "python"
