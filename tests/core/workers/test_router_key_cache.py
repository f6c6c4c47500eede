"""The keyed router's memory under keyless requests with random tokens (issue 43's audit), on
the real vllm-router started by Quantdeck's launcher as a keyed fleet starts it (its key in the
environment, its key checker beside it), with no worker: a keyless request never reaches one.

vllm-router 0.1.17's core asks the checker about each new token and keeps every answer for its
life: ``api_key_cache``, a ``HashMap<String, bool>`` that nothing empties, filled by
``authorize_request`` (src/server.rs) whatever the answer, a refusal or a failed check alike;
it has no setting of size or age, and its WASM middleware (the one hook it offers) never sees
the ``Authorization`` header. So the bound is not Quantdeck's to give: the test of it is
expected to fail (strict: it says so the day a router bounds it). The figures:
``benchmarks/router_key_cache.py``."""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from quantdeck.core.procs import worker_command
from quantdeck.core.runtime import free_port
from quantdeck.core.workers.router import KEY_ENV

pytestmark = pytest.mark.slow

KEY = "cache-test-KEY-5"
TOKEN_BYTES = 64 * 2**10  # its HTTP server takes headers up to ~400 kB
REQUESTS = 300  # x 64 kB: ~20 MB kept when every token is
BOUND = 4 * 2**20  # bytes of growth a bounded cache (or none for refusals) stays under


def _ask(conn: http.client.HTTPConnection, token: str, path: str = "/v1/models") -> int:
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    r = conn.getresponse()
    r.read()
    return r.status


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[int, psutil.Process]]:
    """The keyed router's port and process; stopped with its checker at the end."""
    port = free_port()
    cmd = [*worker_command("router"), "--host=127.0.0.1", f"--port={port}", "--worker-urls"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, KEY_ENV: KEY},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pids = {proc.pid}
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the router did not start"
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                if _ask(conn, KEY, "/liveness") == 200:
                    break
            except OSError:
                time.sleep(0.2)
        router = psutil.Process(proc.pid)
        pids |= {c.pid for c in router.children()}
        assert len(pids) == 2  # the router and its key checker
        time.sleep(1.0)  # its start-up allocations settle
        yield port, router
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        assert time.monotonic() < deadline, "the router's checker outlived it"
        time.sleep(0.1)


def _grown(router: tuple[int, psutil.Process], tokens: Iterator[str]) -> int:
    """The router process's RSS growth, in bytes, over requests with these tokens (each
    refused)."""
    port, proc = router
    before = proc.memory_info().rss
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for token in tokens:
        assert _ask(conn, token) == 401
    conn.close()
    time.sleep(0.3)
    return proc.memory_info().rss - before


def test_one_wrong_token_again_and_again_costs_the_router_nothing(
    router: tuple[int, psutil.Process],
) -> None:
    """The cache at work: the same wrong token is asked about once, then answered from it."""
    same = "w" * TOKEN_BYTES
    grown = _grown(router, iter([same] * REQUESTS))
    assert grown < BOUND, grown / 2**20


@pytest.mark.xfail(
    strict=True,
    reason="vllm-router 0.1.17 keeps every token's answer for its life (api_key_cache in "
    "src/server.rs authorize_request, no setting): ~1.1 bytes of memory a token byte",
)
def test_the_keyed_routers_key_cache_is_bounded(router: tuple[int, psutil.Process]) -> None:
    tokens = (secrets.token_urlsafe(TOKEN_BYTES)[:TOKEN_BYTES] for _ in range(REQUESTS))
    grown = _grown(router, tokens)
    print(f"{REQUESTS} new {TOKEN_BYTES}-byte tokens: router RSS +{grown / 2**20:.1f} MB")
    assert grown < BOUND, grown / 2**20
