"""What keyless requests with random tokens cost a keyed vLLM router (issue 43's audit: +20 MB
per 4,000 such requests).

    python benchmarks/router_key_cache.py [--requests 4000] [--lengths 32 1024 8192 65536]
                                          [--connections 8] [--json OUT]

Starts vllm-router as a keyed fleet starts it (Quantdeck's launcher, the key in its
environment, its key checker beside it), with no worker: a keyless request never reaches one.
Loopback only. Then, for each token length, ``--requests`` requests (``GET /v1/models``) from
``--connections`` keep-alive connections, each with ``Authorization: Bearer`` and a new random
token of that length, all answered 401; first a control: the same wrong token ``--requests``
times. Printed (and written to ``--json``): per run, the router process's RSS before and
after (its key checker apart), the growth per request and per token byte, and the rate. The
router is stopped at the end, its checker with it.

What it shows: the router's core asks its checker about each new token and keeps the answer
for its life (``api_key_cache``, a HashMap that nothing empties, src/server.rs
``authorize_request``), so its memory grows by about the token's length plus ~0.2-0.3 kB for
every new token, the wrong ones included, and the same token again costs nothing; its HTTP
server takes headers up to ~400 kB.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from quantdeck.core.procs import worker_command
from quantdeck.core.runtime import free_port
from quantdeck.core.workers.router import KEY_ENV

KEY = "router-bench-KEY"


def start_router(port: int) -> subprocess.Popen[bytes]:
    cmd = [*worker_command("router"), "--host=127.0.0.1", f"--port={port}", "--worker-urls"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, KEY_ENV: KEY},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the router exited"
        try:
            if ask(port, "/liveness", KEY) == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    stop_router(proc)
    sys.exit("the router did not answer in 60 s")


def stop_router(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its group (the checker too), SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def ask(port: int, path: str, token: str, conn: http.client.HTTPConnection | None = None) -> int:
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    r = c.getresponse()
    r.read()
    return r.status


def keyless(port: int, requests: int, length: int, connections: int, same: bool) -> float:
    """``requests`` refused requests, each with a new random token of ``length`` characters
    (the same one every time when ``same``); their seconds."""
    fixed = "w" * length
    errors: list[str] = []

    def work(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(n):
            token = fixed if same else secrets.token_urlsafe(length)[:length]
            status = ask(port, "/v1/models", token, conn)
            if status != 401:
                errors.append(str(status))
        conn.close()

    share = [requests // connections + (i < requests % connections) for i in range(connections)]
    threads = [threading.Thread(target=work, args=(n,)) for n in share]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        sys.exit(f"not refused: {sorted(set(errors))}")
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 1024, 8192, 65536])
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--json", help="write the figures here too")
    ns = ap.parse_args()
    port = free_port()
    proc = start_router(port)
    runs: list[dict[str, Any]] = []
    try:
        router = psutil.Process(proc.pid)
        time.sleep(1.0)  # its start-up allocations settle
        for length, same in [(32, True), *((n, False) for n in ns.lengths)]:
            before = router.memory_info().rss
            seconds = keyless(port, ns.requests, length, ns.connections, same)
            time.sleep(0.5)
            after = router.memory_info().rss
            grown = after - before
            run = {
                "tokens": "the same one" if same else "new, random",
                "token_bytes": length,
                "requests": ns.requests,
                "requests_per_s": round(ns.requests / seconds),
                "rss_mb": {"before": round(before / 2**20, 1), "after": round(after / 2**20, 1)},
                "grown_kb_per_request": round(grown / 1024 / ns.requests, 2),
                "grown_per_token_byte": None if same else round(grown / ns.requests / length, 2),
            }
            runs.append(run)
            print(json.dumps(run), flush=True)
        assert ask(port, "/liveness", KEY) == 200  # the key itself still passes
    finally:
        stop_router(proc)
    figures = {"router": "vllm-router (Quantdeck's launcher, keyed, no worker)", "runs": runs}
    print(json.dumps(figures, indent=1))
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
