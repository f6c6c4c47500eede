"""The engines: the interpreters with vLLM (a venv, a conda env) that serve and convert for
Quantdeck. The engine check (what one engine is, asked in its own interpreter) and the registry
of the engines the user added, with the ones found on this machine and the default engine.

Below :mod:`~quantdeck.core.runtime` and :mod:`~quantdeck.core.convert`, which both pick an
engine here; the doctor (``quantdeck.core.doctor``) reports on them from above."""

from quantdeck.core.engines.check import Engine, Library, check_engine, default_engines
from quantdeck.core.engines.registry import (
    EngineEntry,
    KnownEngine,
    add_engine,
    default_engine,
    default_name,
    discover,
    engine_name,
    interpreter_path,
    known_pythons,
    list_engines,
    load_registry,
    registry_path,
    remove_engine,
    resolve_engine,
    shim_of,
    skipped_shims,
)

__all__ = [
    "add_engine",
    "check_engine",
    "default_engine",
    "default_engines",
    "default_name",
    "discover",
    "Engine",
    "EngineEntry",
    "engine_name",
    "interpreter_path",
    "KnownEngine",
    "known_pythons",
    "Library",
    "list_engines",
    "load_registry",
    "registry_path",
    "remove_engine",
    "resolve_engine",
    "shim_of",
    "skipped_shims",
]
