"""Subprocess entry point: describe the vLLM in *this* interpreter as one JSON object.

``python -m quantdeck.core.workers.probe`` prints ``{"vllm_version", "torch_version", "platform",
"launcher", "options": {flag: {"dest", "default", "choices", "nargs"}}}``. It imports vLLM (12-23
s), so the GUI process never runs it in-process: :mod:`quantdeck.core.runtime.engine` runs and
caches it."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _parser() -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return importlib.import_module(mod).make_arg_parser(FlexibleArgumentParser())
        except ImportError:
            continue
    raise ImportError("no make_arg_parser in this vLLM")


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def main() -> int:
    try:
        vllm = importlib.import_module("vllm")  # first: its own import error is the one to say
        import torch
        from vllm.platforms import current_platform

        parser = _parser()
    except Exception as e:  # report, don't crash: the caller shows this line
        print(json.dumps({"error": f"{type(e).__name__}: {e}".splitlines()[0]}))
        return 1
    options: dict[str, Any] = {}
    for a in parser._actions:
        for s in a.option_strings:
            options[s] = {
                "dest": a.dest,
                "default": _jsonable(a.default),
                "choices": _jsonable(list(a.choices)) if a.choices else None,
                "nargs": _jsonable(a.nargs),
            }
    try:
        importlib.import_module("vllm.entrypoints.cli.main")
        launcher = "cli"
    except ImportError:
        launcher = "api_server"
    out = {
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
