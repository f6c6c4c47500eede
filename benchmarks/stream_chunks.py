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
import http.client
import json
import statistics
import sys
import time
from urllib.parse import urlparse

from _serve import start_server

from quantdeck.core.bench import datasets


def one(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, float]:
    """One streamed completion read line by line off a blocking socket."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    arrivals: list[float] = []
    tokens = 0
    while True:
        line = resp.fp.readline()
        if not line:
            break
        if not line.startswith(b"data: {"):
            continue
        msg = json.loads(line[6:])
        if msg.get("choices") and msg["choices"][0].get("text"):
            arrivals.append(time.perf_counter() - t0)
        if msg.get("usage"):
            tokens = msg["usage"]["completion_tokens"]
    conn.close()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {
        "events": len(arrivals),
        "tokens": tokens,
        "ttft_s": arrivals[0] if arrivals else float("nan"),
        "e2e_s": arrivals[-1] if arrivals else float("nan"),
        "max_gap_ms": 1000 * max(gaps, default=0.0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", help='"PATH [knobs]" (default: the demo, eager)')
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ns = ap.parse_args()
    server = start_server(ns.serve, 128 * 2**20)
    try:
        url, model = server.url, server.served_name
        text = datasets._corpus_text()  # the corpus `bench --dataset corpus` draws from
        prompts = [text[300 * i : 300 * i + 300] for i in range(ns.requests)]
        one(url, model, prompts[0], 4)  # warm-up
        rows = [one(url, model, p, ns.max_tokens) for p in prompts]
        merged = [r for r in rows if r["events"] < r["tokens"]]
        whole = [r for r in rows if r["events"] <= 1]
        print(
            f"{len(rows)} requests at c=1, {ns.max_tokens} tokens each: "
            f"{len(merged)} had fewer SSE events than tokens (vLLM merged tokens into one "
            f"event), {len(whole)} came as a single event; events per request median "
            f"{statistics.median(r['events'] for r in rows):g}, min "
            f"{min(r['events'] for r in rows):g}; tokens per request "
            f"{statistics.median(r['tokens'] for r in rows):g}"
        )
        for r in rows:
            print(
                f"  events {r['events']:3.0f}  tokens {r['tokens']:3.0f}  "
                f"TTFT {1000 * r['ttft_s']:7.1f} ms  E2E {1000 * r['e2e_s']:7.1f} ms  "
                f"max gap {r['max_gap_ms']:6.1f} ms"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
