"""``quantdeck engines``: the interpreters with vLLM that Quantdeck knows; add and remove them."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from quantdeck.cli._common import AddCommand, print_json

if TYPE_CHECKING:
    from quantdeck.core.engines import KnownEngine


def _row(k: KnownEngine) -> list[str]:
    """NAME, PYTHON, VLLM, DEVICE, TORCH, STATUS."""
    c = k.check
    vllm = device = torch = "-"
    if c is not None and c.vllm_distribution:
        vllm = f"{c.vllm_distribution} {c.vllm_version or '?'}"
    if c is not None and c.vllm_imports:
        gpus = f" x{c.cuda_devices}" if c.cuda_devices else ""
        device = f"{c.vllm_platform or '?'}{gpus}"
    if c is not None and c.torch_version:
        torch = c.torch_version + (f" (CUDA {c.torch_cuda})" if c.torch_cuda else "")
    return [k.name or "-", k.python, vllm, device, torch, k.status]


def cmd_engines(ns: argparse.Namespace) -> int:
    from quantdeck.core import engines

    known = engines.list_engines(probe=not ns.no_check)
    for line in engines.skipped_shims():
        print(f"quantdeck: note: skipped {line}", file=sys.stderr)
    for k in known:  # listed as such; why, one line each
        if k.check is not None and k.check.error:
            print(f"quantdeck: warning: {k.python}: {k.status}: {k.check.error}", file=sys.stderr)
    if ns.json:
        print_json([k.to_json() for k in known])
        return 0
    rows = [["NAME", "PYTHON", "VLLM", "DEVICE", "TORCH", "STATUS"], *map(_row, known)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if not known:
        print("(no engine registered or found: quantdeck engines add PATH/bin/python)")
    for k in known:  # what an engine lacks to serve a format, with the command that fixes it
        c = k.check
        if c is None or not c.vllm_imports:
            continue
        from quantdeck.core.doctor import needs_bnb_plugin

        plugin = next((x for x in c.libraries if x.name == "vllm-bnb-plugin"), None)
        if needs_bnb_plugin(c) and plugin is not None and not plugin.importable:
            print(
                f"{k.name or k.python}: bitsandbytes does not serve there without "
                f"vllm-bnb-plugin (vLLM {c.vllm_version}): {k.python} -m pip install "
                "vllm-bnb-plugin"
            )
    return 0


def cmd_engines_add(ns: argparse.Namespace) -> int:
    from quantdeck.core import engines

    entry, engine = engines.add_engine(ns.python, ns.name)
    print(
        f"added engine {entry.name!r}: {entry.python} ({engine.vllm_distribution} "
        f"{engine.vllm_version}, {engine.vllm_platform}) to {engines.registry_path()}"
    )
    return 0


def cmd_engines_remove(ns: argparse.Namespace) -> int:
    from quantdeck.core import engines

    entry = engines.remove_engine(ns.name)
    print(f"removed engine {entry.name!r} ({entry.python})")
    return 0


def cmd_engines_options(ns: argparse.Namespace) -> int:
    from quantdeck.core.engines import default_engine, resolve_engine
    from quantdeck.core.launch import knobs
    from quantdeck.core.launch.engine_args import list_options
    from quantdeck.core.runtime import EngineEnv

    python = resolve_engine(ns.engine) if ns.engine else default_engine()
    caps = EngineEnv(python).capabilities()
    found = list_options(caps, knobs.managed_options(), ns.search)
    if ns.json:
        print_json({"engine": caps.label, "options": [o.to_json() for o in found]})
        return 0
    print(f"{caps.label}: {len(found)} option{'s' * (len(found) != 1)}")
    for o in found:
        kind = "{" + ",".join(map(str, o.choices)) + "}" if o.choices else o.kind
        print(f"\n{', '.join(o.flags)}  {kind}  [default: {o.default}]  ({o.group})")
        if o.managed:
            print(f"    Quantdeck sets it: {o.managed}")
        for line in _first_paragraph(o.help):
            print("    " + line)
    return 0


def _first_paragraph(text: str) -> list[str]:
    import textwrap

    first = " ".join(text.strip().split("\n\n")[0].split())
    return textwrap.wrap(first, 92) if first else []


def register(add: AddCommand) -> None:
    p = add(
        "engines",
        cmd_engines,
        "the engines (Python interpreters with vLLM) Quantdeck knows: those registered, then "
        "those found (this one, the active venv and conda env, conda's envs, python3.N on "
        "PATH), each checked in its own interpreter",
    )
    p.add_argument("--json", action="store_true", help="a JSON list, one object per engine")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="list without running each interpreter's check (fast: no versions, no status)",
    )
    p.set_defaults(engines_command=None)
    sub = p.add_subparsers(dest="engines_command", metavar="[ACTION]")
    a = sub.add_parser(
        "add",
        help="register an interpreter with vLLM (checked first: it must import vLLM)",
        description="register an interpreter with vLLM (checked first: it must import vLLM)",
    )
    a.add_argument("python", metavar="PATH", help="the interpreter, e.g. ~/venvs/vllm/bin/python")
    a.add_argument(
        "--name", metavar="N", help="its name (default: its venv or conda env folder's name)"
    )
    a.set_defaults(func=cmd_engines_add)
    r = sub.add_parser(
        "remove",
        help="forget a registered engine (the interpreter is left alone)",
        description="forget a registered engine (the interpreter is left alone)",
    )
    r.add_argument("name", metavar="NAME")
    r.set_defaults(func=cmd_engines_remove)
    o = sub.add_parser(
        "options",
        help="every option of an engine's `vllm serve`, typed, with vLLM's help (what "
        "--vllm-arg and a profile's vllm-args take)",
        description="every option of an engine's `vllm serve` as its own parser has it (read in "
        "its interpreter once per vLLM version, then cached): kind, default, argument group, "
        "vLLM's help; those Quantdeck sets itself say which setting to use",
    )
    o.add_argument(
        "engine", nargs="?", metavar="NAME|PY", help="the engine (default: the default engine)"
    )
    o.add_argument("--search", metavar="WORDS", help="only options whose flags or help hold them")
    o.add_argument("--json", action="store_true", help="one JSON object: the engine and options")
    o.set_defaults(func=cmd_engines_options)
