"""Interpreters that are no engine, for the tests of ``doctor``, ``engines`` and ``serve
--engine``: a venv without vLLM, one whose vLLM is installed but fails on import, and scripts
named like an interpreter that misbehave (endless output, a hang, odd answers)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


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


# -- interpreters that misbehave (issue 43): the CLI runs them under bounds -------------------
# Each fake is a /bin/sh script named like an interpreter. The CLI that checks it runs as a
# subprocess under `ulimit -v 3000000` (RLIMIT_AS) with a mark in its environment, which every
# process the fake starts inherits: psutil finds whatever of it is left by that mark.

AS_LIMIT = 3_000_000 * 1024  # bytes: `ulimit -v 3000000`
MARK_VAR = "QUANTDECK_TEST_FAKE_ENGINE"
# `python -c CLI TIMEOUT PROBE_TIMEOUT ARGV...`: quantdeck with the engine check's time limit
# set to TIMEOUT seconds, and the engine probe's (its version, plugins and probe: see
# core/runtime/engine.py) to PROBE_TIMEOUT ("" keeps a default), and without this interpreter
# among the engines found (its check imports vLLM: seconds of a core per test), so a listing
# holds the test's fakes only.
CLI = """
import runpy, sys
from quantdeck.core.engines import check, registry
timeout = sys.argv.pop(1)
if timeout:
    check.ENGINE_TIMEOUT_S = float(timeout)
probe_timeout = sys.argv.pop(1)
if probe_timeout:
    from quantdeck.core.runtime import engine
    engine.VERSION_TIMEOUT_S = engine.PROBE_TIMEOUT_S = float(probe_timeout)
registry.default_engines = lambda: []
sys.argv[0] = "quantdeck"
runpy.run_module("quantdeck.cli", run_name="__main__", alter_sys=True)
"""
# What the engine check of a Python without vLLM answers (as core/workers/engine_check.py does).
NO_VLLM_ANSWER = (
    b'{"python": "/x/python", "python_version": "3.11.9", "vllm_distribution": null, '
    b'"vllm_version": null, "torch_version": null, "libraries": {"bitsandbytes": '
    b'{"importable": false, "version": null}}, "torch_error": "ModuleNotFoundError: torch", '
    b'"vllm_error": "vLLM is not installed"}'
)


def tool(name: str) -> str:
    """The absolute path of a system program a fake runs (the CLI's PATH holds fakes only)."""
    found = shutil.which(name, path=os.defpath + ":/usr/bin:/bin")
    assert found, name
    return found


def fake_interpreter(path: Path, body: str) -> Path:
    """An executable ``#!/bin/sh`` script at ``path`` running ``body`` (whatever arguments the
    check passes, ``-c SOURCE``, are ignored)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def answering(path: Path, answer: bytes, after: str = "") -> Path:
    """A fake that prints the bytes ``answer`` (kept beside it) as its one line, then runs
    ``after``."""
    data = path.with_name(path.name + ".answer")
    path.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(answer + b"\n")
    return fake_interpreter(path, f"{tool('cat')} '{data}'\n{after}")


@dataclass
class CliRun:
    code: int
    out: str
    err: str
    wall_s: float
    mark: str

    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_cli_bounded(
    argv: list[str],
    tmp_path: Path,
    *,
    path: Sequence[Path] = (),
    engine_timeout: float | None = None,
    probe_timeout: float | None = None,
    timeout: float = 120.0,
) -> CliRun:
    """``quantdeck ARGV`` (see :data:`CLI`) under :data:`AS_LIMIT`, its PATH the folders
    ``path``, its home and cache (engine probes too) in ``tmp_path``; the test fails if it
    runs past ``timeout`` seconds (a hang is a failure, not a wait)."""
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.pop("CONDA_EXE", None)
    env.pop("QUANTDECK_PROBE_DIR", None)  # a fake's probe stays in its test's cache
    env.update(
        {
            "PATH": os.pathsep.join(map(str, path)),
            "HOME": str(tmp_path / "home"),
            "QUANTDECK_CACHE_DIR": str(tmp_path / "cache"),
            "OPENBLAS_NUM_THREADS": "1",
            MARK_VAR: mark,
        }
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))

    limit_arg = "" if engine_timeout is None else str(engine_timeout)
    probe_arg = "" if probe_timeout is None else str(probe_timeout)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, limit_arg, probe_arg, *argv],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=limit,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        for p in left_running(mark):
            p.kill()
        raise AssertionError(f"quantdeck {argv} still ran after {timeout} s") from None
    wall = time.monotonic() - t0
    return CliRun(proc.returncode, out.decode(), err.decode(errors="replace"), wall, mark)


def left_running(mark: str) -> list[psutil.Process]:
    """The processes (zombies count as gone) whose environment holds ``mark``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK_VAR) == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out
