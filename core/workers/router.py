"""Subprocess entry point: vLLM's router (``vllm-router``), every route behind the API key.

``python -m quantdeck.core.workers.router [vllm-router options]``; in an interpreter without
Quantdeck, this file run by path (standard library and ``vllm_router`` only).

- The key comes in the environment (``QUANTDECK_ROUTER_API_KEY``, removed from it here), never
  argv: another user can read a process's argv in ``/proc``, not its environment.
- vllm-router's own ``--api-key`` is only what it sends its workers: its transparent proxy
  hands ``/invocations``, ``/start_profile``, ``/metrics``... of any client, keyless or not, to a
  worker with that key. Its core also checks clients' keys, on every route, ``/health``
  included, where it is given ``api_key_validation_urls`` (a setting of its core that its
  launcher has no option for): it asks such a URL, with the client's ``Authorization`` header,
  about each new token and keeps the answer for its life, a refusal too (``api_key_cache`` in
  its src/server.rs, a map nothing empties, with no setting of size or age): each new token
  costs it about its length in memory for good, up to ~400 kB a request (its header limit).
  Nothing here can bound that (benchmarks/router_key_cache.py measures it); keep a keyed
  router where only your clients reach it. Here that URL is :func:`key_checker`,
  a child process on loopback: the router's core holds the GIL while it serves, so a thread of
  this process would never answer.
- A router too old for the setting is refused with one line (exit 2): it could not be guarded.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import inspect
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The same name as quantdeck.core.fleet.supervisor.ROUTER_KEY_ENV (checked by a test).
KEY_ENV = "QUANTDECK_ROUTER_API_KEY"
VALIDATION_SETTING = "api_key_validation_urls"  # the router core's, see above
CHECK_TIMEOUT_S = 5.0  # a connection to the checker that says nothing this long is dropped
PR_SET_PDEATHSIG = 1


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def key_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer KEY`` (scheme in any case),
    compared as SHA-256 digests with :func:`hmac.compare_digest`."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    return hmac.compare_digest(_digest(token.strip()), _digest(key))


def checker_handler(key: str) -> type[BaseHTTPRequestHandler]:
    """The checker's answers: 200 to a GET whose bearer token is ``key``, else 401."""

    class KeyCheck(BaseHTTPRequestHandler):
        timeout = CHECK_TIMEOUT_S

        def do_GET(self) -> None:
            ok = key_matches(self.headers.get("Authorization"), key)
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # nothing of a token reaches the router's log

    return KeyCheck


def _die_with(parent: int) -> None:
    """This process ends when ``parent`` does (Linux: the parent-death signal; elsewhere, and
    should the parent already be gone, a look every 0.5 s)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def key_checker(key: str) -> str:
    """Fork the checker (a loopback HTTP server that knows ``key``) and return its URL. Its
    socket listens before the fork: the URL works at once. Called before the router is
    imported (no thread runs yet); the child shares our process group, so it goes with the
    group, and on its own when we die."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the checker
        try:
            _die_with(parent)
            server = ThreadingHTTPServer(
                ("127.0.0.1", port), checker_handler(key), bind_and_activate=False
            )
            server.socket.close()
            server.socket = sock
            server.server_name, server.server_port = "127.0.0.1", port
            server.daemon_threads = True
            server.serve_forever()
        finally:
            os._exit(0)
    sock.close()
    return f"http://127.0.0.1:{port}/"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    key = os.environ.pop(KEY_ENV, "")
    if any(a == "--api-key" or a.startswith("--api-key=") for a in args):
        print(f"give the API key in {KEY_ENV}, not --api-key (argv is public)", file=sys.stderr)
        sys.exit(2)
    check_url = key_checker(key) if key else None
    from vllm_router.launch_router import (  # type: ignore[import-untyped]
        launch_router,
        parse_router_args,
    )
    from vllm_router_rs import Router  # type: ignore[import-not-found]

    router_args = parse_router_args(args)
    if check_url is not None:
        if VALIDATION_SETTING not in inspect.signature(Router).parameters:
            print(
                f"this vllm-router cannot check an API key on its routes (no "
                f"{VALIDATION_SETTING}): upgrade vllm-router, or run the fleet without a "
                "router key on loopback",
                file=sys.stderr,
            )
            sys.exit(2)
        router_args.api_key = key
        setattr(router_args, VALIDATION_SETTING, [check_url])
    launch_router(router_args)


if __name__ == "__main__":
    main()
