"""The fleet file as the panel's form edits it.

The form shows the router's port and policy and, per instance, its name, profile file (or url),
port, role, restart and placement. Saving replaces those keys and keeps everything else the
user wrote (retries, circuit breaker, health checks, the fallback rule, key references, inline
profiles); the file is rewritten atomically and read back with :func:`load_fleet`, whose
one-line error is the form's. YAML comments are not kept.

:func:`read_document` is lenient on purpose: a file that :func:`load_fleet` refuses (a missing
profile, a bad value) must still open in the form, so that it can be fixed there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from quantdeck.core.errors import ConfigError
from quantdeck.core.fleet.spec import FleetSpec, load_fleet, read_yaml
from quantdeck.core.paths import write_atomic
from quantdeck.core.schema import shown

INLINE = "(inline profile)"  # the source cell of an instance whose profile is in the file
_FORM_KEYS = ("name", "profile", "url", "port", "gpus", "cpus", "role", "restart")
_URL = re.compile(r"https?://", re.IGNORECASE)


@dataclass
class InstanceForm:
    """One instance as a row of the form: the text of its cells, and the file's entry for the
    keys the form does not show."""

    name: str = ""
    source: str = ""  # a profile file, an http(s) url (a server elsewhere) or INLINE
    port: str = ""
    role: str = "primary"
    restart: str = "no"
    gpus: str = ""  # "0,1"
    cpus: str = ""  # "0-3,8"
    entry: dict[str, Any] = field(default_factory=dict)


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The fleet file's YAML as written ({} for an empty file); ConfigError (one line) when
    it is not YAML, or its top level, ``router`` or ``instances`` are not of the right kind."""
    p = Path(path)
    data = read_yaml(p)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping (router:, instances:), got {_kind(data)}")
    router, items = data.get("router"), data.get("instances")
    if router is not None and not isinstance(router, dict):
        raise ConfigError(f"{p}: 'router' must be a mapping, got {_kind(router)}")
    if items is not None and not (
        isinstance(items, list) and all(isinstance(x, dict) for x in items)
    ):
        raise ConfigError(f"{p}: 'instances' must be a list of mappings")
    return data


def _kind(value: Any) -> str:
    return type(value).__name__


def router_form(doc: dict[str, Any]) -> tuple[int, str]:
    """The router's port and policy as the form shows them (the file's defaults if unset)."""
    router = doc.get("router") or {}
    port, policy = router.get("port"), router.get("policy")
    return (
        port if type(port) is int and 1 <= port <= 65535 else 8080,
        policy if isinstance(policy, str) else "round_robin",
    )


def instance_forms(doc: dict[str, Any]) -> list[InstanceForm]:
    """The instances of a document (as :func:`read_document` returns it) as form rows."""
    return [_form(e) for e in doc.get("instances") or []]


def _form(e: dict[str, Any]) -> InstanceForm:
    profile = e.get("profile")
    source = INLINE if isinstance(profile, dict) else _text(profile if profile else e.get("url"))
    gpus = e.get("gpus")
    cpus = e.get("cpus")
    return InstanceForm(
        name=_text(e.get("name")),
        source=source,
        port=_text(e.get("port")),
        role=_text(e.get("role")) or "primary",
        restart="no" if e.get("restart") in (None, False) else _text(e.get("restart")),
        gpus=",".join(map(str, gpus)) if isinstance(gpus, list) else _text(gpus),
        cpus=",".join(map(str, cpus)) if isinstance(cpus, list) else _text(cpus),
        entry=dict(e),
    )


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def apply_forms(
    doc: dict[str, Any], port: int, policy: str, forms: list[InstanceForm]
) -> dict[str, Any]:
    """``doc`` with the form's values in place of the keys the form shows. ConfigError for a
    cell that is not a number where one is needed (the rest is :func:`load_fleet`'s to judge)."""
    router = {**(doc.get("router") or {}), "port": port, "policy": policy}
    return {**doc, "router": router, "instances": [_entry(f) for f in forms]}


def _entry(f: InstanceForm) -> dict[str, Any]:
    name, source = f.name.strip(), f.source.strip()
    e: dict[str, Any] = {"name": name}
    if source == INLINE and isinstance(f.entry.get("profile"), dict):
        e["profile"] = f.entry["profile"]
    elif _URL.match(source):
        e["url"] = source
    else:
        e["profile"] = source
    if f.port.strip():
        e["port"] = _number(f.port, name, "port")
    if f.gpus.strip():
        e["gpus"] = [_number(g, name, "gpus") for g in f.gpus.split(",")]
    if f.cpus.strip():
        e["cpus"] = f.cpus.strip()
    if f.role != "primary" or "role" in f.entry:
        e["role"] = f.role
    if "url" not in e and (f.restart != "no" or "restart" in f.entry):
        e["restart"] = f.restart  # (one at a url is not Quantdeck's to restart)
    return {**e, **{k: v for k, v in f.entry.items() if k not in _FORM_KEYS}}


def _number(text: str, name: str, key: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(
            f"instance {shown(name)}: '{key}' must be a number, got {shown(text.strip())}"
        ) from None


def save_document(path: str | os.PathLike[str], doc: dict[str, Any]) -> FleetSpec:
    """Write ``doc`` to ``path`` atomically, then read it back as a fleet (its ConfigError
    names what is wrong; the file keeps what was written, as an editor would)."""
    p = Path(path)
    write_atomic(p, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return load_fleet(p)
