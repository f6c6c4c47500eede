"""`quantdeck bench` doing what `vllm bench serve` does with every streamed message: parse it as
JSON and keep its text (Quantdeck's own client only looks for markers in the bytes and parses
the closing usage chunk). An experiment on the client's own CPU, which a CPU-bound server
shares: ``python benchmarks/bench_fidelity.py --quantdeck-entry benchmarks/vllm_like_client.py``.

    python benchmarks/vllm_like_client.py bench URL ...   # as `quantdeck bench URL ...`
"""
from __future__ import annotations

import json
import sys

import core.bench as bench

texts: list[str] = []


def _sse_kind(event: bytes) -> str | None:
    event = event.strip()
    if not event.startswith(b"data: "):
        return None
    chunk = event[6:].decode()
    if chunk == "[DONE]":
        return None
    data = json.loads(chunk)
    if choices := data.get("choices"):
        texts.append(choices[0].get("text") or "")
        return "token"
    return "usage" if data.get("usage") else None


if __name__ == "__main__":
    bench._sse_kind = _sse_kind
    from core.cli import main

    sys.exit(main(sys.argv[1:]))
