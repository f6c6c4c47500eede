"""Ingest rate of vLLM KV events through the block index, on one core (goal: >= 50,000 block
events/s).

    python benchmarks/kv_ingest.py [--capture FILE] [--repeat N]

``--capture``: a stream kept by ``quantdeck serve --kv-events --kv-capture FILE`` (real
batches from a server). Without it, a stream is made with vLLM's own event classes (or, where
vLLM is not installed, Quantdeck's mirror of them: the same bytes) and encoded as vLLM's
publisher does: 4,000 requests over 20 shared system prompts (32 blocks each) with 8-64 blocks
of their own, a few decode blocks each, a cache of 50,000 blocks that evicts the oldest one
block per BlockRemoved event (as vLLM sends them), about eight events per engine step.

Each block hash in a stored or removed event counts as one block event (a clear counts one).
The time covers what the subscriber's thread does per batch: msgpack decode and the index
update; not the socket.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from quantdeck.core.monitor.kv_events import BlockIndex, ingest, read_capture

BLOCK = 16


def _classes() -> tuple[Any, str]:
    try:
        import vllm.distributed.kv_events as mod

        return mod, "vLLM's classes"
    except ImportError:
        from quantdeck.core.monitor import kv_events as mod

        return mod, "Quantdeck's mirror (vLLM not installed)"


def synthesise(requests: int = 4000, capacity: int = 50_000, seed: int = 0) -> list[bytes]:
    """Encoded KVEventBatch payloads of a made-up but vLLM-shaped workload."""
    kv, _ = _classes()
    rng = random.Random(seed)
    enc = msgspec.msgpack.Encoder()
    counter = iter(range(1 << 62))

    def new_hash() -> bytes:
        return next(counter).to_bytes(32, "big")

    def stored(hashes: list[bytes], parent: bytes | None) -> Any:
        return kv.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=[rng.randrange(32000) for _ in range(BLOCK * len(hashes))],
            block_size=BLOCK,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )

    prompts: list[list[bytes]] = [[new_hash() for _ in range(32)] for _ in range(20)]
    seen: set[int] = set()
    lru: deque[bytes] = deque()
    events: list[Any] = []
    for _ in range(requests):
        p = rng.randrange(len(prompts))
        own = [new_hash() for _ in range(rng.randint(8, 64))]
        if p not in seen:
            seen.add(p)
            events.append(stored(prompts[p] + own, None))
        else:
            events.append(stored(own, prompts[p][-1]))
        tail = own[-1]
        for _ in range(rng.randint(1, 4)):  # decode fills a block now and then
            h = new_hash()
            events.append(stored([h], tail))
            own.append(h)
            tail = h
        lru.extend(own)
        while len(lru) > capacity:  # one BlockRemoved per block, as vLLM's pool sends them
            events.append(kv.BlockRemoved(block_hashes=[lru.popleft()], medium="GPU", group_idx=0))
    out = []
    ts = time.time()
    for i in range(0, len(events), 8):
        ts += 0.01
        out.append(enc.encode(kv.KVEventBatch(ts=ts, events=events[i : i + 8])))
    return out


def run(frames: list[tuple[int, bytes]], repeat: int) -> dict[str, float]:
    """Block events/s over ``repeat`` passes into a fresh index (median, best)."""
    rates = []
    n = 0
    for _ in range(repeat):
        idx = BlockIndex()
        t0 = time.perf_counter()
        n = ingest(idx, frames)
        rates.append(n / (time.perf_counter() - t0))
    return {"block_events": n, "median_per_s": statistics.median(rates), "best_per_s": max(rates)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--requests", type=int, default=4000)
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    if a.capture:
        frames = list(read_capture(a.capture))
        source = f"capture {a.capture} ({len(frames)} batches)"
    else:
        payloads = synthesise(a.requests)
        frames = list(enumerate(payloads))
        source = f"synthesised with {_classes()[1]} ({len(frames)} batches)"
    r = run(frames, a.repeat)
    print(f"source: {source}")
    print(
        f"block events: {r['block_events']:,}  ingest (decode + index), one core: "
        f"median {r['median_per_s']:,.0f}/s, best {r['best_per_s']:,.0f}/s  (goal >= 50,000/s)"
    )


if __name__ == "__main__":
    main()
