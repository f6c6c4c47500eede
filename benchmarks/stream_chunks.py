"""How a streamed completion reaches a client at concurrency 1: one SSE event per token, or
fewer events carrying several tokens each (vLLM merged them before sending), and when each event
arrived.

    python benchmarks/stream_chunks.py [--serve "PATH [knobs]"] [--requests 24] [--max-tokens 64]

Settles whether a request that reached ``quantdeck ab`` / ``bench`` "in one piece" (every
inter-token gap 0, TTFT = the whole request) was sent so by the server or read late by the
client: a plain blocking socket client in this process (no event loop, no other thread) counts
the SSE events of each request, the tokens they carry (``usage``) and the gaps between them.
Then the same requests through Quantdeck's own client (``quantdeck bench``'s), for its view.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import time
from urllib.parse import urlparse

from _serve import start_server

from quantdeck.core.bench import datasets

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's (x86-64), absent from Python


def one(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, float]:
    """One streamed completion over a plain blocking socket, read in small pieces. Each text
    event's arrival is taken twice: when this process read it (``time.time()``) and when the
    kernel received the packet that completed it (``SO_TIMESTAMPNS``, the same clock). Events
    the kernel got apart but this process read together were read late by the client; events
    the kernel got together were sent together by the server."""
    u = urlparse(url)
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    sock = socket.create_connection((u.hostname, u.port), timeout=120)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    t0 = time.time()
    sock.sendall(head + body)
    read: list[float] = []  # per text event: when this process read it
    got: list[float] = []  # ... and when the kernel received it
    tokens = 0
    pending = b""
    while True:
        data, anc, _flags, _addr = sock.recvmsg(256, socket.CMSG_LEN(16))
        if not data:
            break
        now = time.time()
        kernel = now
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", raw[:16])
                kernel = sec + nsec / 1e9
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: {"):
                continue
            msg = json.loads(line[6:])
            if msg.get("choices") and msg["choices"][0].get("text"):
                read.append(now - t0)
                got.append(kernel - t0)
            if msg.get("usage"):
                tokens = msg["usage"]["completion_tokens"]
    sock.close()
    return {
        "events": len(read),
        "tokens": tokens,
        "ttft_s": read[0] if read else float("nan"),
        "e2e_s": read[-1] if read else float("nan"),
        "read_spread_s": read[-1] - read[0] if read else 0.0,
        "kernel_spread_s": got[-1] - got[0] if got else 0.0,
        "kernel_ttft_s": got[0] if got else float("nan"),
    }


def report(title: str, rows: list[dict[str, float]], verbose: bool) -> None:
    merged = [r for r in rows if r["events"] < r["tokens"]]
    # read in one piece: all its events read within 1 ms of each other
    one_piece = [r for r in rows if r["read_spread_s"] < 0.001]
    client_late = [r for r in one_piece if r["kernel_spread_s"] >= 0.01]
    print(
        f"{title}: {len(rows)} requests, SSE events per request median "
        f"{statistics.median(r['events'] for r in rows):g} (min "
        f"{min(r['events'] for r in rows):g}) for "
        f"{statistics.median(r['tokens'] for r in rows):g} tokens; {len(merged)} with fewer "
        f"events than tokens; {len(one_piece)} read in one piece (every event within 1 ms), of "
        f"which {len(client_late)} had reached this host spread over >= 10 ms (read late by "
        f"the client) and {len(one_piece) - len(client_late)} together (sent together); "
        f"TTFT median {1000 * statistics.median(r['ttft_s'] for r in rows):.1f} ms, "
        f"kernel TTFT median {1000 * statistics.median(r['kernel_ttft_s'] for r in rows):.1f} ms",
        flush=True,
    )
    if verbose:
        for r in rows:
            print(
                f"  events {r['events']:3.0f}  tokens {r['tokens']:3.0f}  "
                f"TTFT {1000 * r['ttft_s']:7.1f} ms  E2E {1000 * r['e2e_s']:7.1f} ms  "
                f"read over {1000 * r['read_spread_s']:6.1f} ms, "
                f"received over {1000 * r['kernel_spread_s']:6.1f} ms"
            )


def run_all(url: str, model: str, prompts: list[str], max_tokens: int) -> list[dict[str, float]]:
    return [one(url, model, p, max_tokens) for p in prompts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", help='"PATH [knobs]" (default: the demo, eager)')
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="in-process / child-process rounds")
    ap.add_argument("--verbose", action="store_true", help="every request's line")
    ap.add_argument(
        "--engine-cpus", help="bind the engine's threads to these cores (e.g. 0): the rest is free"
    )
    ns = ap.parse_args()
    if ns.engine_cpus:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ns.engine_cpus
    server = start_server(ns.serve, 128 * 2**20)
    try:
        url, model = server.url, server.served_name
        text = datasets._corpus_text()  # the corpus `bench --dataset corpus` draws from
        prompts = [text[300 * i : 300 * i + 300] for i in range(ns.requests)]
        one(url, model, prompts[0], 4)  # warm-up
        # the client in this process (beside the server's supervision threads: its log
        # readers) and in a child process of its own (nothing else in it), alternately
        ctx = multiprocessing.get_context("spawn")
        for k in range(ns.rounds):
            rows = run_all(url, model, prompts, ns.max_tokens)
            report(f"round {k + 1}, client in the server's process", rows, ns.verbose)
            with ctx.Pool(1) as pool:
                rows = pool.apply(run_all, (url, model, prompts, ns.max_tokens))
            report(f"round {k + 1}, client in a process of its own", rows, ns.verbose)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
