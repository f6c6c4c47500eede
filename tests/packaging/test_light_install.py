"""The light install: Quantdeck's wheel (``python -m build``, ``twine check``) in a fresh venv
without extras, so without torch and vLLM, as ``pipx install quantdeck`` would make it. There
the light commands run (``--version``, ``plan``, ``inspect``, ``doctor`` reporting no engine);
with this project's venv registered as an engine, ``serve`` starts the demo model through it
(that venv's Python runs the light install's engine worker from its file) and a stop signal
leaves no process.

Slow (a venv and its packages, from pip's cache after the bootstrap: ~25 s) and a server (the
session server steps aside: one vLLM at a time on the two cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import alive_pids, read_json_lines, source_copy

from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

pytestmark = [pytest.mark.server, pytest.mark.slow]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The wheel built from a copy of the sources and installed, alone, into a fresh venv; the
    environment its commands run in (their own user folders, no active venv or conda env)."""
    tmp = tmp_path_factory.mktemp("light")
    src = source_copy(tmp / "src")
    dist = tmp / "dist"
    r = run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(src),
        ],
        dict(os.environ),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = dist.glob("quantdeck-*.whl")
    r = run([sys.executable, "-m", "twine", "check", "--strict", str(wheel)], dict(os.environ))
    assert r.returncode == 0 and "PASSED" in r.stdout, r.stdout + r.stderr
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], dict(os.environ)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    for folder in ("config", "cache", "data"):
        env[f"QUANTDECK_{folder.upper()}_DIR"] = str(tmp / folder)
    return venv, env


def test_light_commands_run_without_torch_or_vllm(
    light: tuple[Path, dict[str, str]], demo_model: Path
) -> None:
    venv, env = light
    py, qd = str(venv / "bin" / "python"), str(venv / "bin" / "quantdeck")
    code = "import importlib.util as u; print([m for m in ('torch', 'vllm') if u.find_spec(m)])"
    assert run([py, "-c", code], env).stdout.strip() == "[]"
    r = run([qd, "--version"], env)
    assert r.returncode == 0 and r.stdout.strip() == "quantdeck 0.1.0", r.stdout + r.stderr
    r = run([qd, "plan", str(demo_model), "--device", "cpu", "--json"], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_blocks"] > 0
    r = run([qd, "inspect", str(demo_model)], env)
    assert r.returncode == 0 and "LlamaForCausalLM" in r.stdout, r.stdout + r.stderr
    r = run([qd, "doctor", "--json"], env)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["can_serve"] is False, r.stdout
    assert [e["python"] for e in report["engines"]] == [py]
    assert any("vLLM is not installed there" in p["message"] for p in report["problems"])


def test_light_install_serves_through_this_venv_as_engine(
    light: tuple[Path, dict[str, str]], demo_model: Path, demo_server_parked: Any
) -> None:
    venv, env = light
    qd = str(venv / "bin" / "quantdeck")
    r = run([qd, "engines", "add", sys.executable, "--name", "dev"], env)
    assert r.returncode == 0, r.stderr
    env = {**env, **ONE_PROCESS_ENGINE_ENV}
    cmd = [qd, "serve", str(demo_model), "--engine", "dev", "--enforce-eager"]
    cmd += ["--kv-cache-memory-bytes", "64MiB", "--json-events"]
    cmd += ["--port", str(demo_server_parked.cfg.server.port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=read_json_lines, args=(proc, events), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 420
        while not any(e.get("state") in ("ready", "crashed") for e in events):
            assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
            time.sleep(0.5)
        assert any(e.get("state") == "ready" for e in events), events[-10:]
        import psutil

        tree = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    command = next(e["command"] for e in events if e.get("state") == "starting")
    # this venv's Python runs the light install's engine worker by its file
    assert command[0] == sys.executable and command[1] == "-c"
    assert command[3].startswith(str(venv)) and command[3].endswith("workers/engine.py")
    assert [e["state"] for e in events if e.get("event") == "state"][-1] == "stopped"
    time.sleep(1)
    assert alive_pids(tree) == []
