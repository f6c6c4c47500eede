"""Subprocess entry point: describe the vLLM in *this* interpreter as one JSON object.

``python -m quantdeck.core.workers.probe`` prints ``{"schema", "vllm_version", "torch_version",
"platform", "launcher", "options": {flag: {"dest", "default", "choices", "nargs", "kind",
"help", "group"}}}``: every option of vLLM's ``vllm serve`` parser, typed (``kind``: ``bool``,
``int``, ``float``, ``str``, ``json``, ``json|str``, ``choice`` or ``list``), with its help text
(``%(default)s`` and the like expanded) and the title of its argument group. It imports vLLM
(12-23 s), so the GUI process never runs it in-process: :mod:`quantdeck.core.runtime.engine` runs
and caches it. Standard library and vLLM only: an engine without Quantdeck runs this file."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from typing import Any

# What this probe writes; the reader's cache key holds it, so a newer probe replaces old entries.
SCHEMA = 2
MAX_HELP = 4000  # characters of one option's help text


def _parser(version: str) -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return importlib.import_module(mod).make_arg_parser(FlexibleArgumentParser())
        except ImportError:
            continue
    raise ImportError(f"no make_arg_parser in vLLM {version}")


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def _inner(fn: Any) -> list[Any]:
    """The callables a type function wraps (vLLM's ``optional_type(int)``, ``parse_type(f)``:
    closures over the wrapped function), innermost last."""
    out: list[Any] = []
    seen: set[int] = set()
    while callable(fn) and id(fn) not in seen:
        seen.add(id(fn))
        out.append(fn)
        cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
        wrapped = [c for c in cells if callable(c)]
        if not wrapped:
            break
        fn = wrapped[0]
    return out


_JSON_TYPES = {"parse_dataclass", "loads"}
_INT_TYPES = {"int", "human_readable_int", "human_readable_int_or_auto"}


def kind_of(a: argparse.Action) -> str:
    """The option's value kind: bool (a switch), choice, list, json (JSON object), json|str
    (JSON object or plain text), int, float or str."""
    if a.nargs == 0:
        return "bool"
    if a.choices:
        return "choice"
    if a.nargs in ("+", "*") or isinstance(a, argparse._AppendAction):
        return "list"
    names = {getattr(f, "__name__", "") for f in _inner(a.type)}
    if "union_dict_and_str" in names:
        return "json|str"
    if names & _JSON_TYPES:
        return "json"
    if names & _INT_TYPES:
        return "int"
    if "float" in names:
        return "float"
    return "str"


def help_of(parser: Any, a: argparse.Action) -> str:
    """The option's help as ``--help`` shows it (``%(default)s`` expanded); "" where there is
    none. A help string that does not expand (a stray ``%``) is kept with its ``%%`` undone."""
    text = a.help
    if not text or text == argparse.SUPPRESS:
        return ""
    try:
        text = parser._get_formatter()._expand_help(a)
    except (KeyError, ValueError, TypeError):
        text = re.sub(r"%\([^)]*\)[-#0 +]*\d*(?:\.\d+)?[a-zA-Z]", "", text).replace("%%", "%")
    text = text.strip()
    return text if len(text) <= MAX_HELP else text[: MAX_HELP - 1] + "…"


def _groups(parser: Any) -> dict[int, str]:
    out: dict[int, str] = {}
    for g in parser._action_groups:
        for a in g._group_actions:
            out[id(a)] = g.title or ""
    return out


def describe(parser: Any) -> dict[str, dict[str, Any]]:
    """Every option string of ``parser``, each with its action's facts."""
    groups = _groups(parser)
    options: dict[str, Any] = {}
    for a in parser._actions:
        if not a.option_strings:
            continue
        facts = {
            "dest": a.dest,
            "default": _jsonable(a.default),
            "choices": _jsonable(list(a.choices)) if a.choices else None,
            "nargs": _jsonable(a.nargs),
            "kind": kind_of(a),
            "help": help_of(parser, a),
            "group": groups.get(id(a), ""),
        }
        for s in a.option_strings:
            options[s] = facts
    return options


def main() -> int:
    argv = sys.argv
    # vLLM reads its help texts (its config classes' docstrings) only when asked for help:
    # NEEDS_HELP looks for --help in argv when vllm.engine.arg_utils is imported
    sys.argv = [argv[0], "--help"]
    try:
        vllm = importlib.import_module("vllm")  # first: its own import error is the one to say
        import torch
        from vllm.platforms import current_platform

        parser = _parser(vllm.__version__)
    except Exception as e:  # report, don't crash: the caller shows this line
        print(json.dumps({"error": f"{type(e).__name__}: {e}".splitlines()[0]}))
        return 1
    finally:
        sys.argv = argv
    options = describe(parser)
    try:
        importlib.import_module("vllm.entrypoints.cli.main")
        launcher = "cli"
    except ImportError:
        launcher = "api_server"
    out = {
        "schema": SCHEMA,
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "platform": str(getattr(current_platform, "device_type", "")) or "unknown",
        "python": sys.executable,
        "launcher": launcher,
        "options": options,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
